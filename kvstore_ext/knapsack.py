"""L-GreCo's choice of one compression parameter per layer: a multiple-choice knapsack.

Markov, Ramezanikebrya, Alistarh, "L-GreCo: Layerwise-adaptive gradient compression
for efficient data-parallel deep learning" (MLSys 2024). Given, for every layer ``l``
and every candidate ``c`` of that layer, the error compression would cause
(``error[l][c]``, a Frobenius norm) and the size it would send (``size[l][c]``), pick
one candidate per layer so that the total size is minimal while the total error stays
within a budget (L-GreCo: the total error of the uniform default parameter).

Errors are made integers first (``discretise``): the budget is cut into ``buckets``
buckets of ``budget / buckets`` and each error counts the whole buckets it fills
(floor), so the default choice, whose errors sum to the budget, always fits. The
dynamic programme (``solve``) then runs over (layers x buckets), vectorised over the
buckets with NumPy: ``best[b]`` is the smallest total size of the layers so far whose
discretised errors add up to exactly ``b``; a layer's step is the minimum over its
candidates of ``best`` shifted by the candidate's error plus its size.
"""
import numpy as np

BUCKETS = 10000


def discretise(errors, budget, buckets=BUCKETS):
    """Integer errors: ``floor(error / (budget / buckets))`` for each layer's array of
    candidate errors (``errors``: list of 1-D arrays). ``budget`` must be > 0."""
    if not budget > 0 or not np.isfinite(budget):
        raise ValueError('budget must be positive and finite, got %r' % (budget,))
    width = budget / buckets
    # a relative tolerance: an error equal to the budget's share is not rounded below it
    return [np.floor(np.asarray(e, np.float64) / width * (1 + 1e-12)).astype(np.int64)
            for e in errors]


def solve(errors, sizes, capacity):
    """The index of one candidate per layer minimising ``sum(sizes)`` subject to
    ``sum(errors) <= capacity`` (integer errors >= 0, lists of 1-D arrays, one per
    layer); among equal sizes the smaller total error. None if nothing fits."""
    capacity = int(capacity)
    if len(errors) != len(sizes):
        raise ValueError('%d layers of errors but %d of sizes' % (len(errors), len(sizes)))
    best = np.full(capacity + 1, np.inf)
    best[0] = 0.0
    picks = []
    for err, size in zip(errors, sizes):
        err, size = np.asarray(err, np.int64), np.asarray(size, np.float64)
        if err.shape != size.shape or err.ndim != 1 or not err.size:
            raise ValueError('each layer needs as many errors as sizes (>= 1)')
        if (err < 0).any():
            raise ValueError('errors must be >= 0')
        options = np.full((err.size, capacity + 1), np.inf)
        for c, (e, s) in enumerate(zip(err, size)):
            if e <= capacity:
                options[c, e:] = best[:capacity + 1 - e] + s
        pick = np.argmin(options, axis=0)         # ties: the first candidate
        best = options[pick, np.arange(capacity + 1)]
        picks.append(pick)
    if not np.isfinite(best).any():
        return None
    used = int(np.argmin(best))                  # smallest size; ties: least error
    choice = []
    for err, pick in zip(reversed(errors), reversed(picks)):
        c = int(pick[used])
        choice.append(c)
        used -= int(err[c])
    assert used == 0
    return choice[::-1]


def choose(errors, sizes, default, buckets=BUCKETS):
    """L-GreCo's choice: candidate indices minimising the total size with the total
    error (discretised into ``buckets``) within the total error of ``default`` (one
    candidate index per layer). With a zero budget (nothing to lose) the default."""
    budget = float(sum(float(e[d]) for e, d in zip(errors, default)))
    if not budget > 0 or not np.isfinite(budget):
        return list(default)
    return solve(discretise(errors, budget, buckets), sizes, buckets)
