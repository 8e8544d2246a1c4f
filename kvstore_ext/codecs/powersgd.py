"""PowerSGD's codec (Vogels, Karimireddy, Jaggi, NeurIPS 2019, arXiv 1905.13727): a
rank-r approximation of the sum of the workers' gradients, built from two additive
rounds, with error feedback and a warm-started Q.

One step of one chunk, a ``rows x cols`` matrix view of the tensor (conv weights
``O x (I kh kw)``), numbered as in ``step`` (python/kvx_ref/powersgd.py is the spec):

1. ``M = grad + residual`` (error feedback);
2. ``Q`` (cols x r, orthonormal): the previous step's (warm start, chunk state ``'Q'``,
   checkpointed) or, at the first step, a Gaussian drawn from a seed every worker shares;
3. ``P = M Q``, summed over workers by a ``Sum('P')`` round (the stock server adds);
4. ``P^ = orthonormalise(P)``: every worker holds the same summed P, bit for bit, and
   runs the same deterministic Householder QR on it, so all agree on P^;
5. ``Q_w = M^T P^``; the residual keeps ``M - P^ Q_w^T``, this worker's own error (the
   part of its M outside the agreed subspace), so the workers' residuals plus the
   aggregate always add up to the sum of their M;
6. ``Q = sum_w Q_w`` by a ``Sum('Q')`` round;
7. the step returns ``P^ Q^T``, the approximation of the *sum* over workers (every
   codec's step returns the sum; the trainer divides), and keeps
   ``orthonormalise(Q)`` as the next step's Q.

**A NaN or Inf, without waiting.** A step that read anything on the host (a check of the
gradient before round P, a look at P's first word) would wait there for the key's
backward pass and its round trip, and each key's rounds would travel one after another;
the profile of docs/schemes/powersgd.md ("Where a step's time goes") found those waits
to be half of the step. So nothing is read: the whole step is queued on MXNet's engine,
and a non-finite value is dealt with there. A NaN or Inf in row i of any worker's M
makes row i of its P = M Q non-finite (NaN * x = NaN, Inf * 0 = NaN, Inf * x = +-Inf,
also where Q has an all-zero row), and the sum over workers keeps it; every worker holds
the same sums, so every worker finds the same: if the summed P or Q holds NaN or Inf
anywhere (an overflow too; ``kvx_powersgd_p_hat`` and ``kvx_powersgd_next_q`` look
as they orthonormalise), the step is void on every worker: its result is NaN, its
residual and Q stay as they were (engine ops write the new ones only if the sums were
finite: ``kvx_lowrank_residual`` for the residual, ``kvx_powersgd_next_q`` for Q).
Whether this worker's gradient was finite is its status (a look on the engine too),
which the store reads at the key's next step (``deferred_checks``,
void_steps.resolve): the worker whose gradient it was logs the warning, naming itself.
A key of several chunks is voided whole: the store makes a NaN in any chunk reach
every chunk's P (void_steps.deferred_step).

Orthonormalisation is the plugin's Householder QR (LAPACK's geqr2 and org2r, the
reflections of MXNet's ``linalg.gelqf`` of the transpose, in double, rounded once):
unlike Gram-Schmidt it returns orthonormal columns for rank-deficient or zero input (a
layer whose gradient vanishes), so no epsilon and no NaN. It is fused with the void
check into one operator a step for P^ (``kvx_powersgd_p_hat``) and one for the next Q
(``kvx_powersgd_next_q``): with MXNet's operators each took seven or eight (the check,
the pick of finite input, the transposes, gelqf), and on a worker that shares its cores
the dispatch of each one costs the step more than its arithmetic. Keeping Q
orthonormal between steps keeps P and Q at the scale of M whatever the number of steps
(a raw Q would square M's scale each step).

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
from ..ops import constant, op
from ..rounds import Sum

MIN_RATIO = 2     # a chunk is compressed only if its rank-r form is this much smaller


def matrix_shape(shape):
    """The 2-D view of a tensor: (first axis, the rest)."""
    return int(shape[0]), int(np.prod(shape[1:], dtype=np.int64))


def orthonormalise(a):
    """Orthonormal columns spanning those of ``a`` (n x r, r <= n, finite): the Q factor
    of its Householder QR (``kvx_powersgd_p_hat``), deterministic for a given input."""
    p_hat, _ = op('kvx_powersgd_p_hat')(a)
    return p_hat


class PowerSGDCodec(Codec):
    name = 'powersgd'
    chunk_by_rows = True     # chunks are rows of the matrix view
    sums_into = True         # step 7's product goes straight into the output
    deferred_checks = True   # nothing waits on the host: a NaN voids the step on the
    voids_in_engine = True   # engine, the store reads this worker's status later
    speed_params = ('rank',)  # rank 4 by default; L-GreCo's layers range around it

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
        from ..checks import check_encoded
        # Nothing here reads a result on the host: the whole step is queued on MXNet's
        # engine, so the worker goes on to the next key while this one's rounds travel.
        # A non-finite value decides the step in the engine instead (module docstring,
        # "A NaN or Inf").
        # 1. error feedback, and whether this worker's gradient was finite (its status:
        # the store reads it later, check_encoded under deferred_checks)
        acc, status = op('kvx_powersgd_acc')(grad, state.residual)
        acc = acc.reshape((self.rows, self.cols))
        # 2. warm start
        q = state.get('Q')
        if q is None:
            q = self.initial_q()
        # 3. P, summed
        check_encoded(status, 'gradient')
        p = yield Sum('P', ndarray.dot(acc, q))
        # 4. the same orthonormal P^ on every worker, and whether P is void (then P^ is
        # of zeros: finite, and the step's results are discarded below)
        p_hat, void = op('kvx_powersgd_p_hat')(p)
        # 5. this worker's Q
        q_part = ndarray.dot(acc, p_hat, transpose_a=True)
        # 6. Q, summed (a copy is pushed: MXNet's dist kvstore pulls a CPU key's sum into
        # the very array pushed last, and the residual below needs this worker's Q_w)
        q_sum = yield Sum('Q', q_part.copy())
        # whether the step is void (P or Q holds NaN or Inf), and step 7's next Q:
        # orthonormal Q, or the old one if void
        q_next, void = op('kvx_powersgd_next_q')(q, q_sum, void)
        state.last['void'] = void
        state['Q'] = q_next
        # 5, finished: this worker's own error M - P^ Q_w^T, written into the residual
        # in one pass unless the step is void
        op('kvx_lowrank_residual')(acc, state.residual.reshape((self.rows, self.cols)),
                                   p_hat, q_part, void)
        # 7. the approximation of the sum, NaN everywhere if void
        spoil = ndarray.where(void, constant(np.nan), constant(1.0))
        p_hat = ndarray.broadcast_mul(p_hat, spoil)
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
