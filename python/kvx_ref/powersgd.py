"""NumPy reference of dist_sync_powersgd (docs/schemes/powersgd.md): the executable spec that
tests hold the MXNet codec (kvstore_ext/codecs/powersgd.py) and real ps-lite jobs to.

Computed in float64 from the same float32 gradients: the codec's float32 arithmetic
(MXNet's gemm, the plugin's QR rounded to float32, the server's float32 sums) agrees
with it to rounding, not bit for bit, so tests compare with a tolerance.

One step of one chunk (a ``rows x cols`` matrix view), over workers w:

1. ``M_w = grad_w + residual_w`` (error feedback);
2. ``Q``: the previous step's (warm start) or ``orthonormalise(initial_q(...))``;
3. ``P = sum_w M_w Q`` (round 'P');
4. ``P^ = orthonormalise(P)``, identically on every worker;
5. ``Q_w = M_w^T P^``; ``residual_w = M_w - P^ Q_w^T`` (each worker's own error);
6. ``Q = sum_w Q_w`` (round 'Q');
7. the step returns ``P^ Q^T``, the rank-r approximation of ``sum_w M_w`` (a sum, as
   every codec's step returns; not divided by the number of workers), and keeps
   ``orthonormalise(Q)`` for the next step.
"""
import numpy as np

f32 = np.float32
MIN_RATIO = 2      # a tensor is compressed only if its rank-r form is this much smaller


def matrix_shape(shape):
    """The 2-D view of a tensor: (first axis, the rest): conv O x (I kh kw)."""
    shape = tuple(int(d) for d in shape)
    return shape[0], int(np.prod(shape[1:], dtype=np.int64))


def compressible(rows, cols, rank):
    """True if the rank-r form (P and Q: ``rank * (rows + cols)`` values) is at least
    MIN_RATIO times smaller than the ``rows x cols`` matrix. It implies ``rank < rows``
    and ``rank < cols``."""
    return MIN_RATIO * rank * (rows + cols) <= rows * cols


def step_words(shape, rank):
    """float32 words a tensor of ``shape`` sends a step, each way: its rank-r factors
    (``rank * (rows + cols)``, one P and one Q for the whole matrix) where they are
    ``compressible``, else every element (1-D tensors too)."""
    shape = tuple(int(d) for d in shape)
    size = int(np.prod(shape, dtype=np.int64))
    if len(shape) < 2:
        return size
    rows, cols = matrix_shape(shape)
    return rank * (rows + cols) if compressible(rows, cols, rank) else size


def initial_q(cols, rank, seed):
    """The Gaussian Q every worker draws at a chunk's first compressed step: seeded by
    (seed, cols, rank) only, so every worker draws the same."""
    return np.random.default_rng([seed, cols, rank]).standard_normal((cols, rank)).astype(f32)


def orthonormalise(a):
    """Orthonormal columns spanning ``a``'s (Householder QR: LAPACK geqrf, the same
    reflections as the codec's ``kvx_powersgd_p_hat``, sign convention included).
    Rank-deficient or zero input still gives orthonormal columns."""
    q, _ = np.linalg.qr(np.asarray(a, np.float64))
    return q


def chunk_step(accs, q):
    """One step of one chunk. ``accs``: each worker's ``M_w`` (rows x cols), ``q``:
    orthonormal (cols x rank). Returns (sum approximation, residuals, next q)."""
    accs = [np.asarray(m, np.float64) for m in accs]
    p_hat = orthonormalise(sum(m @ q for m in accs))
    parts = [m.T @ p_hat for m in accs]
    residuals = [m - p_hat @ part.T for m, part in zip(accs, parts)]
    q_sum = sum(parts)
    return p_hat @ q_sum.T, residuals, orthonormalise(q_sum)


class PowerSGDReference:
    """Every worker's state of one tensor: residuals and, per chunk, Q.

    ``bounds``: the chunks' row ranges ``[(start, stop), ...]`` along the first axis (as
    kvstore_ext/chunking.py cuts them; default: one chunk)."""

    def __init__(self, shape, workers, rank=4, seed=0, bounds=None):
        self.shape, self.rank, self.seed = tuple(shape), rank, seed
        self.rows, self.cols = matrix_shape(shape)
        self.bounds = list(bounds or [(0, self.rows)])
        self.residuals = [np.zeros((self.rows, self.cols)) for _ in range(workers)]
        self.qs = [None] * len(self.bounds)

    def step(self, grads):
        """Feed every worker's float32 gradient; return the float64 sum every worker
        gets back (the tensor's shape)."""
        accs = [np.asarray(g, f32).reshape(self.rows, self.cols).astype(np.float64) + r
                for g, r in zip(grads, self.residuals)]
        out = np.zeros((self.rows, self.cols))
        for i, (a, b) in enumerate(self.bounds):
            q = self.qs[i]
            if q is None:
                q = orthonormalise(initial_q(self.cols, self.rank, self.seed))
            out[a:b], residuals, self.qs[i] = chunk_step([m[a:b] for m in accs], q)
            for r, new in zip(self.residuals, residuals):
                r[a:b] = new
        return out.reshape(self.shape)

    def residual(self, worker):
        return self.residuals[worker].reshape(self.shape)
