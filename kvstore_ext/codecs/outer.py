"""A Dense layer's gradient as a sum of outer products, ``sum_j u_j v_j^T = U^T V``:
dAD's and rank-dAD's codec (schemes/dad.py; Bischof et al., arXiv 2102.09631).

One step of one chunk (rows ``[start, start + rows)`` of the out x in weight):

1. wait for the weight's gradient (the capture ran before it was ready) and take the
   layer's captured rows ``A`` (k x in), ``D`` (k x out) (kvstore_ext/dad.py): the
   chunk at row 0 takes them, the layer's other chunks reuse them;
2. NaN/Inf in the gradient, A or D: NonFiniteGradientError, so the store voids the step
   (store._void_step, rounds.void), every worker's sum is
   NaN and the step is skipped, as for every scheme (no state is at stake);
3. ``check``: the gradient must be ``D^T A``: compared along a fixed +-1 probe vector
   (``g r`` against ``D^T (A r)``, one pass over the gradient); a mismatch (rows of a
   backward pass whose gradient was overwritten, a gradient changed after backward,
   a layer used without its capture) raises instead of sending a wrong sum;
4. ``dad``: U = D's columns of the chunk, V = A (k rows, padded with zero rows to the
   key's ``capacity``; more rows than that raise); ``oneway``/``rankdad``: U = P^T,
   V = Q^T from a rank-r power iteration on ``D_c^T A`` (kvstore_ext/lowrank.py),
   formed only when that is cheaper than the implicit products;
5. one ``Gather`` round: the servers add ``U^T V`` of every worker (C++
   ``outer_decode_add``, codec id 6) and reply the float32 sum, or, ``rankdad``,
   re-factorise the sum to rank r (aggregate.py) and reply its factors.

No residual: dAD is exact; rank-dAD keeps none, as the authors' (error feedback would
need the product formed on every worker every step).
"""
import numpy as np

from .base import GatherCodec, check_encoded
from .. import lowrank
from ..errors import NonFiniteGradientError
from ..ops import op
from ..wire import OUTER, outer_payload_words

METHODS = ('dad', 'oneway', 'rankdad')
MIN_RATIO = 2        # a layer takes this codec only if its payload is this much smaller
CHECK_TOLERANCE = 1e-2


class GradientMismatch(RuntimeError):
    """The weight gradient is not the product of the captured rows."""


class OuterCodec(GatherCodec):
    name = 'outer'
    uses_residual = False
    chunk_by_rows = True

    def __init__(self, shape, layer, method='dad', capacity=1, rank=4, iterations=1,
                 tol=1e-3, seed=0, check=True, start=0):
        super().__init__(shape)
        if len(self.shape) != 2:
            raise ValueError('a Dense weight is 2-D, got shape %s' % (self.shape,))
        if method not in METHODS:
            raise ValueError('method must be one of %s, got %r' % (METHODS, method))
        self.rows, self.cols = self.shape
        self.layer, self.method, self.start = layer, method, int(start)
        self.rank, self.iterations, self.tol, self.seed = int(rank), int(iterations), \
            float(tol), int(seed)
        self.capacity = int(capacity) if method == 'dad' else self.rank
        self.check = bool(check)
        self.compressed_reply = method == 'rankdad'
        if self.capacity < 1:
            raise ValueError('capacity must be >= 1, got %r' % (capacity,))

    def chunk(self, start, stop):
        return OuterCodec((stop - start, self.cols), self.layer, self.method, self.capacity,
                          self.rank, self.iterations, self.tol, self.seed, self.check,
                          self.start + start)

    def compressible(self):
        """True if the payload (``capacity * (rows + cols)`` floats) is at least
        MIN_RATIO times smaller than the chunk."""
        return MIN_RATIO * self.capacity * (self.rows + self.cols) <= self.rows * self.cols

    def payload_words(self):
        return outer_payload_words(self.size, self.capacity, self.rows)

    def reply_request(self):
        """rankdad: the servers factorise the sum to rank r by ``iterations`` of the
        same power iteration (seed 0, no early stop) and reply the factors."""
        return (OUTER, self.size, self.rank, self.rows, self.iterations)

    def factors(self, a, d):
        """(U, V): this step's rows (dad) or rank-r factors (float32)."""
        if self.method == 'dad':
            if a.shape[0] > self.capacity:
                raise ValueError(
                    'dAD layer %r: this step captured %d rows, more than the %d the key was '
                    'laid out for at its first step (a larger batch, more devices or more '
                    'backward passes per step than then); set compression_params '
                    "{'capacity': N} to the largest rows a step captures"
                    % (self.layer, a.shape[0], self.capacity))
            return d, a
        p, q = lowrank.factors_of_product(a, d, self.rank, self.iterations, self.seed,
                                          self.tol)
        return p.T.astype(np.float32), q.T.astype(np.float32)

    def encode_factors(self, u, v):
        from mxnet import ndarray
        if u.shape[0] == 0:
            u, v = np.zeros((1, self.rows), np.float32), np.zeros((1, self.cols), np.float32)
        payload, status = op('kvx_outer_encode')(ndarray.array(u, dtype=np.float32),
                                                 ndarray.array(v, dtype=np.float32),
                                                 capacity=self.capacity)
        check_encoded(status, 'dAD factors')
        return payload

    def check_gradient(self, grad, a, d):
        """Raise GradientMismatch unless ``grad`` (rows x cols) is ``d^T a`` along a
        fixed +-1 probe ``r``, to CHECK_TOLERANCE of ``|d|^T |a| |r|`` (the magnitude
        of the terms, so cancellation does not make the test fail)."""
        from mxnet import ndarray
        probe = np.random.default_rng([7, self.cols]).integers(0, 2, self.cols) * 2.0 - 1.0
        got = ndarray.dot(grad.reshape((self.rows, self.cols)),
                          ndarray.array(probe, dtype=np.float32)).asnumpy().astype(np.float64)
        a64, d64 = a.astype(np.float64), d.astype(np.float64)
        want = d64.T @ (a64 @ probe)
        scale = np.abs(d64).T @ np.abs(a64).sum(axis=1)
        bad = np.abs(got - want) > CHECK_TOLERANCE * scale + 1e-30
        if bad.any():
            raise GradientMismatch(
                'dAD layer %r: the weight gradient pushed is not the product of the rows its '
                'backward passes captured (%d rows; off in %d of %d outputs). Was a '
                'backward pass overwritten (grad_req=\'write\' and several backward '
                'passes per step), the gradient changed after backward (clipping), or the '
                'layer run without kvstore_ext.dad.attach? Use dist_sync_dad only with '
                'unmodified gradients, or pass check_gradient=0 to send the rows anyway'
                % (self.layer, a.shape[0], int(bad.sum()), self.rows))

    def step(self, grad, state, num_workers, rank):
        # 1. the rows of this step
        grad.wait_to_read()
        self.layer.wait()
        taken = self.layer.rows_for_step(self.start)
        if taken is None:
            a = np.zeros((0, self.cols), np.float32)
            d = np.zeros((0, self.rows), np.float32)
        else:
            a, d = taken[0], taken[1][:, self.start:self.start + self.rows]
        # 2. NaN/Inf: the store makes the step void (store._void_step), as for every codec
        finite = int(op('kvx_finite_check')(grad.reshape((-1,))).asscalar()) == 0
        if not (finite and np.isfinite(a).all() and np.isfinite(d).all()):
            raise NonFiniteGradientError('dAD layer %r: the gradient or the captured rows '
                                         'hold NaN or Inf' % (self.layer,))
        # 3. the gradient is D^T A
        if self.check:
            self.check_gradient(grad, a, d)
        # 4. rows or factors
        u, v = self.factors(a, d)
        state.last['rows'] = a.shape[0]
        # 5. the servers add U^T V
        total = yield self.gather(self.encode_factors(u, v))
        return total.reshape(self.shape)

    def describe(self):
        if self.method == 'dad':
            return 'dad %d rows of %d x %d' % (self.capacity, self.rows, self.cols)
        return '%s rank %d of %d x %d' % (self.method, self.rank, self.rows, self.cols)
