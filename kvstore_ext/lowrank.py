"""Rank-r factors of a matrix by power iteration with deflation, for rank-dAD
(schemes/dad.py): NumPy, float64, on matrix-vector products only, so a worker can
factorise a Dense layer's gradient ``D^T A`` without forming it.

For each component j, from a unit start vector v drawn from (seed, out, in, j),
``iterations`` times (Bischof et al.'s rank-dAD, arXiv 2102.09631, which stops early
when v moves less than ``tol``)::

    u = M_j v / |M_j v|,   q = M_j^T u,   v = q / |q|,      M_j = M - P_<j Q_<j^T

and P's column j is u (unit), Q's is q (it carries the singular value), so
``M ~ P Q^T``. Deflation is applied to the vectors (``P_<j (Q_<j^T v)``), never to M.
python/kvx_ref/dad.py's ``power_factors`` is the spec (it writes the same on the
explicit matrix).

The start vectors are the same on every worker and at every step (seeded, no state to
keep or checkpoint): the factors depend only on this step's M.

With error feedback (``factors_with_residual``) M is ``D^T A + R``, R the worker's
residual (out x in): the iteration runs on the implicit operator ``M v = D^T (A v) + R v``,
and the new residual ``R + D^T A - U^T V`` is one matrix product of inner size
``rows + rank``. The out x in operations (``R v``, ``R^T u``, that product) run in
float32, the vectors in float64: measured on one core, fc1 of the MLP (512 x 784,
32 rows, rank 4, one iteration) 1.1 ms a step against 6.8 ms in float64 (memory
traffic), 2e-7 of the largest value apart.
"""
import numpy as np

from .blas import single_threaded


def start_vector(seed, out, inputs, component):
    v = np.random.default_rng([seed, out, inputs, component]).standard_normal(inputs)
    return v / np.linalg.norm(v)


def power_factors(times, times_t, out, inputs, rank, iterations, seed=0, tol=0.0):
    """(P: out x rank, Q: inputs x rank), float64. ``times(v)`` is ``M v`` (inputs ->
    out), ``times_t(u)`` is ``M^T u``."""
    p, q = np.zeros((out, rank)), np.zeros((inputs, rank))
    for j in range(rank):
        v = start_vector(seed, out, inputs, j)
        u = qv = None
        for _ in range(iterations):
            u = times(v) - p[:, :j] @ (q[:, :j].T @ v)
            norm = np.linalg.norm(u)
            if norm == 0:                      # nothing left: a zero component
                u, qv = np.zeros(out), np.zeros(inputs)
                break
            u /= norm
            qv = times_t(u) - q[:, :j] @ (p[:, :j].T @ u)
            qnorm = np.linalg.norm(qv)
            if qnorm == 0:
                break
            moved = np.linalg.norm(qv / qnorm - v)
            v = qv / qnorm
            if moved < tol:
                break
        p[:, j], q[:, j] = u, qv
    return p, q


@single_threaded
def factors_of_product(a, d, rank, iterations, seed=0, tol=0.0):
    """Factors of ``M = D^T A`` (a: rows x in, d: rows x out). Without forming M while
    that is cheaper (``rows * (in + out) < in * out``: each product then costs
    ``rows * (in + out)`` instead of ``in * out``); else M is formed once."""
    a, d = np.asarray(a, np.float64), np.asarray(d, np.float64)
    rows, inputs = a.shape
    out = d.shape[1]
    if rows * (inputs + out) < inputs * out:
        return power_factors(lambda v: d.T @ (a @ v), lambda u: a.T @ (d @ u),
                             out, inputs, rank, iterations, seed, tol)
    m = d.T @ a
    return power_factors(m.dot, m.T.dot, out, inputs, rank, iterations, seed, tol)


@single_threaded
def factors_of_matrix(m, rank, iterations, seed=0, tol=0.0):
    m = np.asarray(m, np.float64)
    return power_factors(m.dot, m.T.dot, m.shape[0], m.shape[1], rank, iterations, seed, tol)


@single_threaded
def factors_with_residual(a, d, residual, rank, iterations, seed=0, tol=0.0):
    """rank-dAD with error feedback: (U = P^T: rank x out, V = Q^T: rank x in, the new
    residual: out x in), all float32, for ``M = D^T A + R`` (a: rows x in, d: rows x
    out, residual R: out x in), factorised as ``power_factors`` does, on the implicit
    operator (D^T A is never formed for the iteration); the new residual is
    ``M - U^T V`` = ``R + [D; -U]^T [A; V]``, what the factors sent leave out."""
    a32, d32 = np.asarray(a, np.float32), np.asarray(d, np.float32)
    r = np.asarray(residual, np.float32)
    a64, d64 = a32.astype(np.float64), d32.astype(np.float64)
    out, inputs = r.shape
    p, q = power_factors(lambda v: d64.T @ (a64 @ v) + r @ v.astype(np.float32),
                         lambda u: a64.T @ (d64 @ u) + r.T @ u.astype(np.float32),
                         out, inputs, rank, iterations, seed, tol)
    u, v = p.T.astype(np.float32), q.T.astype(np.float32)
    left = np.concatenate([d32, -u]).T @ np.concatenate([a32, v])
    left += r       # in place: one out x in temporary fewer
    return u, v, left
