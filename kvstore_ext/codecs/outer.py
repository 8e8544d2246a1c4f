"""A Dense layer's gradient as a sum of outer products, ``sum_j u_j v_j^T = U^T V``:
dAD's and rank-dAD's codec (schemes/dad.py; Bischof et al., arXiv 2102.09631).

One step of one chunk (rows ``[start, start + rows)`` of the out x in weight):

1. wait for the weight's gradient (the capture ran before it was ready) and take the
   layer's captured rows ``A`` (k x in), ``D`` (k x out) (kvstore_ext/dad.py): the
   chunk at row 0 takes them, the layer's other chunks reuse them;
2. NaN/Inf in the gradient or in any of the layer's rows: NonFiniteGradientError, so
   the store voids the step (void_steps.void_step, rounds.void), every worker's sum is NaN
   and the step is skipped, as for every scheme, with the residual unchanged;
3. ``check``: the gradient must be ``D^T A``: compared along a fixed +-1 probe vector
   (``g r`` against ``D^T (A r)``, one pass over the gradient); a mismatch (rows of a
   backward pass whose gradient was overwritten, a gradient changed after backward,
   a layer used without its capture) raises instead of sending a wrong sum;
4. ``dad``: U = D's columns of the chunk, V = A (k rows, padded with zero rows to the
   key's ``capacity``; more rows than that raise); ``oneway``/``rankdad``: U = P^T,
   V = Q^T from a rank-r power iteration on ``M = D_c^T A`` (kvstore_ext/lowrank.py),
   formed only when that is cheaper than the implicit products; with
   ``error_feedback``, ``M = D_c^T A + R`` (R: this worker's residual of the chunk),
   always on the implicit operator, and the new residual ``M - U^T V``;
5. one ``Gather`` round: the servers add ``U^T V`` of every worker (C++
   ``outer_decode_add``, codec id 6) and reply the float32 sum, or, ``rankdad``,
   re-factorise the sum to rank r (aggregate.py) and reply its factors; with
   ``error_feedback`` the servers factorise the sum plus their own residual and keep
   what their factors leave out;
6. ``error_feedback``: the new residual is kept once the round's result is there and
   not void (a worker's NaN: every worker skips the step and keeps its residual, as
   PowerSGD's codec does).

**Error feedback: whose error.** A worker's residual is its own error, ``M_w - U_w^T
V_w``: what its factors did not send. With ``'rankdad'`` the servers approximate the
sum S of the workers' factor products once more; that error, ``S - G`` (G: what the
workers pull), exists only at the servers: a worker pulls G but never sees S. So the
servers keep it, in the residual the transport already keeps for a compressed reply
(``Gather.reply``; DoubleSqueeze's server-side error feedback), and add it to the next
sum before they factorise. Every compressor keeps the error it makes, and the workers'
residuals plus the servers' plus what was pulled equal the sum of the workers' M
(tested). PyTorch's PowerSGD hook keeps ``M_w - G / W`` instead (the mean
approximation). That needs G, so the residual would wait for the pull. It also never
shrinks a worker's disagreement with the mean: ``M_w - mean_w M`` is carried whole to
the next step and new disagreement added to it, a random walk. In PowerSGD that is
harmless because every worker projects on the same agreed P. In rank-dAD every worker
factorises its own M, and a growing share of that M would be this walk.

Without ``error_feedback`` nothing is kept, as the authors': dAD is exact.
"""
import numpy as np

from .base import GatherCodec, check_encoded
from .. import lowrank
from ..blas import single_threaded
from ..errors import NonFiniteGradientError
from ..ops import host_array, op
from ..rounds import is_void
from ..wire import outer_payload_words

METHODS = ('dad', 'oneway', 'rankdad')
MIN_RATIO = 2        # a layer takes this codec only if its payload is this much smaller
CHECK_TOLERANCE = 1e-2


class GradientMismatch(RuntimeError):
    """The weight gradient is not the product of the captured rows."""


class OuterCodec(GatherCodec):
    name = 'outer'
    uses_residual = False
    chunk_by_rows = True
    codec_id = 6

    @staticmethod
    def payload_words_of(n, k, out):
        return outer_payload_words(n, int(k), int(out))

    @staticmethod
    @single_threaded
    def server_reencode(total, residual, rank, rows, iterations):
        """rankdad's reply: the summed gradient (rows x cols) factorised again to rank
        r by the workers' power iteration (seed 0, no early stop; lowrank.py), replied
        as its factors. ``iterations`` > 0: no residual, as the authors' (``residual``
        stays zero); < 0 (rank-dAD's error feedback): ``-iterations`` iterations on the
        sum plus ``residual``, which keeps what the factors leave out
        (python/kvx_ref/dad.py ``server_reply``)."""
        feedback = iterations < 0
        matrix = total.asnumpy().reshape((int(rows), -1)).astype(np.float64)
        if feedback:
            matrix += residual.asnumpy().reshape(matrix.shape)
        p, q = lowrank.factors_of_matrix(matrix, int(rank), int(abs(iterations)))
        u, v = p.T.astype(np.float32), q.T.astype(np.float32)
        if feedback:
            left = matrix - u.T.astype(np.float64) @ v.astype(np.float64)
            residual[:] = host_array(left.reshape((-1,)))
        payload, status = op('kvx_outer_encode')(host_array(u), host_array(v),
                                                 capacity=int(rank))
        check_encoded(status, 'aggregate', defer=False)
        return payload

    def __init__(self, shape, layer, method='dad', capacity=1, rank=4, iterations=1,
                 tol=1e-3, seed=0, check=True, start=0, error_feedback=False):
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
        self._probe = None
        self.compressed_reply = method == 'rankdad'
        # dAD is exact: nothing to feed back
        self.error_feedback = bool(error_feedback) and method != 'dad'
        self.uses_residual = self.error_feedback      # the store keeps R for the key
        if self.capacity < 1:
            raise ValueError('capacity must be >= 1, got %r' % (capacity,))

    def chunk(self, start, stop):
        return OuterCodec((stop - start, self.cols), self.layer, self.method, self.capacity,
                          self.rank, self.iterations, self.tol, self.seed, self.check,
                          self.start + start, self.error_feedback)

    def compressible(self):
        """True if the payload (``capacity * (rows + cols)`` floats) is at least
        MIN_RATIO times smaller than the chunk."""
        return MIN_RATIO * self.capacity * (self.rows + self.cols) <= self.rows * self.cols

    def payload_words(self):
        return outer_payload_words(self.size, self.capacity, self.rows)

    def reply_request(self):
        """rankdad: the servers factorise the sum to rank r by ``iterations`` of the
        same power iteration (seed 0, no early stop) and reply the factors; the
        iterations word is negative with error feedback: the servers then factorise
        the sum plus their residual and keep the rest (``server_reencode``)."""
        return (self.codec_id, self.size, self.rank, self.rows,
                -self.iterations if self.error_feedback else self.iterations)

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
        if u.shape[0] == 0:
            u, v = np.zeros((1, self.rows), np.float32), np.zeros((1, self.cols), np.float32)
        payload, status = op('kvx_outer_encode')(host_array(u), host_array(v),
                                                 capacity=self.capacity)
        check_encoded(status, 'dAD factors')
        return payload

    def probe(self):
        """The fixed +-1 vector ``r`` the gradient check multiplies by (float32), drawn
        once per codec."""
        if self._probe is None:
            rng = np.random.default_rng([7, self.cols])
            self._probe = (rng.integers(0, 2, self.cols) * 2.0 - 1.0).astype(np.float32)
        return self._probe

    @single_threaded
    def check_gradient(self, grad, a, d):
        """Raise NonFiniteGradientError if the gradient (rows x cols, float32 NumPy)
        holds NaN or Inf; with ``check``, raise GradientMismatch unless it is ``d^T a``
        along the probe ``r``, to CHECK_TOLERANCE of ``|d|^T |a| |r|`` (the magnitude of
        the terms, so cancellation does not make the test fail). One pass over the
        gradient: ``g r`` is non-finite exactly when ``g`` holds NaN or Inf, or when a
        finite sum overflows float32 (told apart by a second look, then summed in
        float64)."""
        probe = self.probe()
        with np.errstate(over='ignore', invalid='ignore'):
            got = grad @ probe
        if not np.isfinite(got).all():
            if not np.isfinite(grad).all():
                raise NonFiniteGradientError('dAD layer %r: the gradient holds NaN or Inf'
                                             % (self.layer,))
            got = grad.astype(np.float64) @ probe.astype(np.float64)
        if not self.check:
            return
        got = got.astype(np.float64)
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
        if taken is None or state.void:
            # state.void: the store's run for a void step (void_steps.void_step), only to
            # make this worker's round; rows the store's own NaN check left untaken
            # belong to the voided step and are dropped here
            a = np.zeros((0, self.cols), np.float32)
            d = np.zeros((0, self.rows), np.float32)
        else:
            a, d = taken[0], taken[1][:, self.start:self.start + self.rows]
        # 2. NaN/Inf: the store makes the step void (void_steps.void_step), as for every
        # codec; all of the layer's rows are checked by the chunk that takes them (the
        # first, stepped first), so it raises before any chunk's round. 3. the gradient
        # (this chunk's) is D^T A. Both on the host: the gradient is ready (waited for
        # above), so its copy waits for nothing, where an engine op would queue behind
        # the rest of the backward pass
        if not state.void:
            if taken is not None and self.start == 0 and not (
                    np.isfinite(taken[0]).all() and np.isfinite(taken[1]).all()):
                raise NonFiniteGradientError('dAD layer %r: the captured rows hold NaN or '
                                             'Inf' % (self.layer,))
            self.check_gradient(grad.reshape((self.rows, self.cols)).asnumpy(), a, d)
        # 4. rows or factors (and, with error feedback, what they leave out)
        left = None
        if self.error_feedback and not state.void:
            residual = state.residual.reshape((self.rows, self.cols)).asnumpy()
            u, v, left = lowrank.factors_with_residual(a, d, residual, self.rank,
                                                       self.iterations, self.seed, self.tol)
        elif state.void:
            u, v = np.zeros((0, self.rows), np.float32), np.zeros((0, self.cols), np.float32)
        else:
            u, v = self.factors(a, d)
        state.last['rows'] = a.shape[0]
        # 5. the servers add U^T V
        total = yield self.gather(self.encode_factors(u, v))
        # 6. this worker's error, kept when the step counts (every worker skips a void one)
        if left is not None and not is_void(total):
            state.residual.reshape((self.rows, self.cols))[:] = left   # one copy
        return total.reshape(self.shape)

    def describe(self):
        if self.method == 'dad':
            return 'dad %d rows of %d x %d' % (self.capacity, self.rows, self.cols)
        return '%s rank %d of %d x %d%s' % (self.method, self.rank, self.rows, self.cols,
                                           ', error feedback' if self.error_feedback else '')
