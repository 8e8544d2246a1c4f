"""PowerSGD's codec (Vogels, Karimireddy, Jaggi, NeurIPS 2019, arXiv 1905.13727): a
rank-r approximation of the sum of the workers' gradients, built from two additive
rounds, with error feedback and a warm-started Q.

One step of one chunk, a ``rows x cols`` matrix view of the tensor (conv weights
``O x (I kh kw)``), numbered as in ``step`` (python/kvx_ref/powersgd.py is the spec):

1. ``M = grad + residual`` (error feedback). The gradient is not checked for NaN/Inf
   first: such a value in row i of any worker's M makes row i of its P non-finite
   (NaN * x = NaN, Inf * 0 = NaN, Inf * x = +-Inf, even where Q has an all-zero row),
   and the sum keeps it (step 3). A key of several chunks is still checked whole
   before its first round (planning.py): a NaN in one chunk voids that chunk's P only;
2. ``Q`` (cols x r, orthonormal): the previous step's (warm start, chunk state ``'Q'``,
   checkpointed) or, at the first step, a Gaussian drawn from a seed every worker shares;
3. ``P = M Q``, summed over workers by a ``Sum('P')`` round (the stock server adds);
   if the summed P holds NaN or Inf anywhere (``kvx_finite_check``: rows x r words),
   every worker, having the same sum, returns NaN (a void step) with its residual and
   Q as they were (void_sums.py logs it);
4. ``P^ = orthonormalise(P)``: every worker holds the same summed P, bit for bit, and
   runs the same deterministic Householder QR on it, so all agree on P^;
5. ``Q_w = M^T P^``; the residual keeps ``M - P^ Q_w^T``, this worker's own error (the
   part of its M outside the agreed subspace), so the workers' residuals plus the
   aggregate always add up to the sum of their M. It is written after step 6, once
   both sums are known finite;
6. ``Q = sum_w Q_w`` by a ``Sum('Q')`` round; a non-finite Q (an overflow) voids the
   step as in step 3, nothing changed yet;
7. the step returns ``P^ Q^T``, the approximation of the *sum* over workers (every
   codec's step returns the sum; the trainer divides), and keeps
   ``orthonormalise(Q)`` as the next step's Q.

Orthonormalisation is MXNet's ``linalg.gelqf`` (LAPACK's LQ factorisation, Householder)
of the transpose: one operator, no Python loop over columns, and unlike Gram-Schmidt it
returns orthonormal columns for rank-deficient or zero input (a layer whose gradient
vanishes), so no epsilon and no NaN. Keeping Q orthonormal between steps keeps P and Q
at the scale of M whatever the number of steps (a raw Q would square M's scale each
step).

A matrix is approximated whole: what travels is its factors, ``rank * (rows + cols)``
words, so ``chunk_layout`` counts each row as its share of them and chunking.py cuts the
matrix only when the factors exceed ``chunk_size`` words. Cutting by the tensor's own
size would cost bytes and accuracy: each chunk of ``k`` rows is a low-rank problem of
its own (its own P, Q and rounds) and sends ``rank * (k + cols)`` words, so a 512 x 3136
FC weight in two chunks sent 27,136 words instead of 14,592, with two rank-r
approximations of halves instead of one of the whole.
"""
import numpy as np

from .base import Codec
from ..rounds import Sum, void_sum
from ..void_sums import nonfinite

MIN_RATIO = 2     # a chunk is compressed only if its rank-r form is this much smaller


def matrix_shape(shape):
    """The 2-D view of a tensor: (first axis, the rest)."""
    return int(shape[0]), int(np.prod(shape[1:], dtype=np.int64))


def orthonormalise(a):
    """Orthonormal columns spanning those of ``a`` (n x r, r <= n): Householder LQ of
    ``a^T`` (LAPACK gelqf through MXNet), deterministic for a given input."""
    from mxnet.ndarray import linalg
    lq, _ = linalg.gelqf(a.T)
    return lq.T


class PowerSGDCodec(Codec):
    name = 'powersgd'
    chunk_by_rows = True     # chunks are rows of the matrix view
    sums_into = True         # step 7's product goes straight into the output
    finds_nonfinite_in_sums = True   # steps 3 and 6 check the summed P and Q whole

    def __init__(self, shape, rank, seed=0):
        super().__init__(shape)
        if len(self.shape) < 2:
            raise ValueError('PowerSGD needs a tensor of 2 or more axes, got shape %s'
                             % (self.shape,))
        self.rows, self.cols = matrix_shape(self.shape)
        self.rank, self.seed = int(rank), int(seed)
        if self.rank < 1:
            raise ValueError('rank must be >= 1, got %r' % (rank,))

    def compressible(self):
        """True if the rank-r factors (``rank * (rows + cols)`` floats) are at least
        MIN_RATIO times smaller than the matrix: the scheme compresses a tensor only if
        this holds for every chunk (it implies ``rank < rows`` and ``rank < cols``,
        which the orthonormalisation needs)."""
        return MIN_RATIO * self.rank * (self.rows + self.cols) <= self.rows * self.cols

    def chunk_layout(self):
        """(rows of the matrix view, the factor words per row, rounded up): split cuts
        only a matrix whose factors hold more than chunk_size words."""
        return self.rows, -(-self.rank * (self.rows + self.cols) // self.rows)

    def chunk(self, start, stop):
        return PowerSGDCodec((stop - start,) + self.shape[1:], self.rank, self.seed)

    def state_shapes(self):
        return {'Q': (self.cols, self.rank)}

    def initial_q(self):
        """Step 2's first Q: Gaussian from (seed, cols, rank) (kvx_ref.powersgd.initial_q),
        drawn by NumPy, so every worker draws the same."""
        from mxnet import ndarray
        rng = np.random.default_rng([self.seed, self.cols, self.rank])
        gauss = rng.standard_normal((self.cols, self.rank)).astype(np.float32)
        return orthonormalise(ndarray.array(gauss, dtype=np.float32))

    def step(self, grad, state, num_workers, rank):
        from mxnet import ndarray
        # 1. error feedback (no NaN check of the gradient: a NaN/Inf in any worker's M
        # reaches the summed P, checked below; the residual only ever takes values of a
        # step whose sums were finite)
        acc = (grad + state.residual).reshape((self.rows, self.cols))
        # 2. warm start
        q = state.get('Q')
        if q is None:
            q = self.initial_q()
        # 3. P, summed; non-finite (a worker's NaN/Inf, or an overflow): every worker
        # saw the same sum and stops here, before its residual or Q changes
        p = yield Sum('P', ndarray.dot(acc, q))
        state.last['void'] = nonfinite(p)
        if state.last['void']:
            return void_sum(self.shape)
        # 4. the same orthonormal P^ on every worker
        p_hat = orthonormalise(p)
        # 5. this worker's Q (its error goes into the residual after step 6)
        q_part = ndarray.dot(acc, p_hat, transpose_a=True)
        # 6. Q, summed; non-finite (an overflow): every worker stops here too. (A copy
        # is pushed: MXNet's dist kvstore pulls a CPU key's sum into the very array
        # pushed last, and the residual below needs this worker's own Q_w)
        q_sum = yield Sum('Q', q_part.copy())
        state.last['void'] = nonfinite(q_sum)
        if state.last['void']:
            return void_sum(self.shape)
        # 5, finished: this worker's own error, both sums being finite (gemm writes the
        # residual in place: no temporary of the matrix's size, and no copy of it,
        # which cost more than the gemm itself on cnn512's fc1)
        ndarray.linalg.gemm(p_hat, q_part, acc, alpha=-1.0, beta=1.0, transpose_b=True,
                            out=state.residual.reshape((self.rows, self.cols)))
        # 7. the approximation of the sum; the next step's Q
        state['Q'] = orthonormalise(q_sum)
        if state.out is None:
            return ndarray.dot(p_hat, q_sum, transpose_b=True).reshape(self.shape)
        ndarray.dot(p_hat, q_sum, transpose_b=True,
                    out=state.out.reshape((self.rows, self.cols)))
        return state.out

    def wire_words(self, num_workers):
        p, q = self.rows * self.rank, self.cols * self.rank
        return [('P', 'sum', p, p), ('Q', 'sum', q, q)]

    def describe(self):
        return 'powersgd rank %d of %d x %d' % (self.rank, self.rows, self.cols)
