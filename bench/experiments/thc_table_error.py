"""THC's quantisation tables compared per coordinate: error and bits a value.

For N(0, 1) coordinates (what THC's rotation makes of a tensor whose energy is spread),
the mean squared error a coordinate after clamping to [-T, T] and stochastic rounding to
a table: the rounding variance (between entries a < b around a value v, (v - a)(b - v))
plus what the clamp removes, E[(|z| - T)^2; |z| > T]. Both by numerical integration and
by simulation with the reference's ``quantize`` and ``level_sum`` (python/kvx_ref/thc.py,
the spec of the kernels), for the uniform table (q = 16) and THC's non-uniform table
(16 entries on a grid of 30), at their defaults and at the other's T, plus the best T of
each on a grid. Then the bits a value of the packed sum for n workers: base n g + 1
digits, D a float32 word with base^D <= 2^24 (g = 15 uniform, 30 THC's).

    python bench/experiments/thc_table_error.py [--samples 4000000] [--json out.json]
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'python'))
from kvx_ref import thc as ref  # noqa: E402
from kvx_ref.wire import digits_per_word  # noqa: E402

LEVELS = 16
CASES = [('uniform', 2.5), ('thc', ref.THC_TABLE_CLAMP), ('uniform', ref.THC_TABLE_CLAMP),
         ('thc', 2.5)]


def normal_pdf(z):
    return np.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def normal_tail(t):
    """P(Z > t)."""
    return 0.5 * math.erfc(t / math.sqrt(2))


def integrated(table, t, points=2_000_001):
    """(rounding variance, clamp loss, clamped share) for N(0, 1) coordinates."""
    entries = ref.table_values(LEVELS, table).astype(np.float64)
    values = entries * 2 * t / entries[-1] - t
    z = np.linspace(-t, t, points)
    j = np.clip(np.searchsorted(values, z, side='right') - 1, 0, LEVELS - 2)
    variance = (z - values[j]) * (values[j + 1] - z) * normal_pdf(z)
    rounding = float(np.sum((variance[1:] + variance[:-1]) / 2 * np.diff(z)))   # trapezoids
    tail = normal_tail(t)
    clamp = 2 * ((1 + t * t) * tail - t * float(normal_pdf(np.float64(t))))
    return rounding, clamp, 2 * tail


def simulated(table, t, samples, seed=1):
    """(MSE, its standard error) through the reference's quantiser, float32 as the kernels."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(samples).astype(np.float32)
    u = (rng.integers(0, 1 << 24, samples) * 2.0 ** -24).astype(np.float32)
    digits = ref.quantize(z, LEVELS, t, u, table)
    error = (ref.level_sum(digits, LEVELS, t, 1, table).astype(np.float64) - z) ** 2
    return float(error.mean()), float(error.std() / math.sqrt(samples))


def best_clamp(table):
    """(T, MSE) minimising the integrated MSE over T in [1.8, 3.0] by 0.01."""
    return min(((float(t), sum(integrated(table, float(t), 200_001)[:2]))
                for t in np.arange(1.8, 3.0001, 0.01)), key=lambda x: x[1])


def bits(table, workers):
    base = workers * ref.grid(LEVELS, table) + 1
    digits = digits_per_word(base, np.float32)
    return base, digits, 32.0 / digits


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--samples', type=int, default=4_000_000)
    parser.add_argument('--json')
    args = parser.parse_args()
    rows = []
    print('| table, T | rounding variance | clamp loss | MSE | simulated MSE | clamped share |')
    print('|---|---|---|---|---|---|')
    for table, t in CASES:
        rounding, clamp, share = integrated(table, t)
        mse, se = simulated(table, t, args.samples)
        rows.append(dict(table=table, clamp=t, rounding=rounding, clamp_loss=clamp,
                         mse=rounding + clamp, simulated=mse, simulated_se=se,
                         clamped=share))
        print('| %s, T = %g | %.5f | %.5f | %.5f | %.5f +- %.5f | %.2f%% |'
              % (table, t, rounding, clamp, rounding + clamp, mse, se, 100 * share))
    best = {table: best_clamp(table) for table in ('uniform', 'thc')}
    for table, (t, mse) in best.items():
        print('best T for %s: %.2f, MSE %.5f' % (table, t, mse))
    print('\n| workers | uniform: base, D, bits | thc: base, D, bits |\n|---|---|---|')
    wire = []
    for n in (1, 2, 4, 8, 16):
        u, h = bits('uniform', n), bits('thc', n)
        wire.append(dict(workers=n, uniform=u, thc=h))
        print('| %d | %d, %d, %.1f | %d, %d, %.1f |' % ((n,) + u + h))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(error=rows, best_clamp=best, wire=wire), f, indent=1)


if __name__ == '__main__':
    main()
