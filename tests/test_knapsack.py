"""kvstore_ext.knapsack against brute force on small instances."""
import itertools

import numpy as np
import pytest

from kvstore_ext import knapsack


def brute_force(errors, sizes, capacity):
    """(smallest total size, its least total error) over every combination, or None."""
    best = None
    for combo in itertools.product(*[range(len(e)) for e in errors]):
        err = sum(int(errors[l][c]) for l, c in enumerate(combo))
        if err > capacity:
            continue
        size = sum(float(sizes[l][c]) for l, c in enumerate(combo))
        if best is None or (size, err) < best:
            best = (size, err)
    return best


def totals(choice, errors, sizes):
    return (sum(float(sizes[l][c]) for l, c in enumerate(choice)),
            sum(int(errors[l][c]) for l, c in enumerate(choice)))


@pytest.mark.parametrize('seed', range(40))
def test_solve_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(1, 6))
    errors = [rng.integers(0, 30, int(rng.integers(1, 5))) for _ in range(layers)]
    sizes = [rng.integers(1, 100, e.size).astype(float) for e in errors]
    capacity = int(rng.integers(0, 30 * layers))
    want = brute_force(errors, sizes, capacity)
    got = knapsack.solve(errors, sizes, capacity)
    if want is None:
        assert got is None
    else:
        assert len(got) == layers
        assert totals(got, errors, sizes) == want


@pytest.mark.parametrize('seed', range(20))
def test_choose_matches_brute_force(seed):
    """Float errors that fall as rank grows, sizes that grow: the choice is the
    brute-force optimum under the discretised budget of the default, and never larger
    than the default."""
    rng = np.random.default_rng(100 + seed)
    layers, ranks = int(rng.integers(2, 6)), np.array([2, 3, 4, 6, 8])
    errors = [np.sort(rng.random(ranks.size) * 10 ** rng.uniform(-2, 2))[::-1]
              for _ in range(layers)]
    sizes = [ranks * float(rng.integers(50, 500)) for _ in range(layers)]
    default = [2] * layers
    buckets = 1000
    got = knapsack.choose(errors, sizes, default, buckets)
    budget = sum(e[2] for e in errors)
    ints = knapsack.discretise(errors, budget, buckets)
    assert totals(got, ints, sizes) == brute_force(ints, sizes, buckets)
    assert totals(got, ints, sizes)[0] <= sum(s[2] for s in sizes)
    # the real (undiscretised) error exceeds the budget by less than a bucket a layer
    assert sum(errors[l][c] for l, c in enumerate(got)) <= budget * (1 + layers / buckets)


def test_discretise_keeps_the_default_feasible():
    errors = [np.array([0.3, 0.1]), np.array([0.7, 0.2])]
    ints = knapsack.discretise(errors, 1.0, 10000)
    assert [list(i) for i in ints] == [[3000, 1000], [7000, 2000]]
    assert knapsack.choose(errors, [np.array([1, 2]), np.array([1, 2])], [0, 0]) == [0, 0]
    # a zero budget keeps the default
    assert knapsack.choose([np.zeros(2)], [np.array([1, 2])], [1]) == [1]
    with pytest.raises(ValueError):
        knapsack.discretise(errors, 0.0)


def test_trade_between_layers():
    """A large layer whose error hardly grows at a low rank gives up rank; a small layer
    whose error falls fast takes more, within the same total error."""
    sizes = [np.array([2., 4., 8.]) * 100, np.array([2., 4., 8.]) * 10]
    errors = [np.array([0.5, 0.45, 0.4]), np.array([3.0, 1.0, 0.1])]
    # default (rank 4, rank 4): error 1.45, size 440; (rank 2, rank 8): 0.6, 280;
    # (rank 2, rank 4) would err 1.5 > 1.45
    assert knapsack.choose(errors, sizes, [1, 1]) == [0, 2]
