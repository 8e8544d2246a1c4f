"""Cost of dAD's hot loop: the servers' decode of outer-product payloads (U^T V for
every worker, ``kvx_decode_slots`` on codec id 6), on the MNIST models' Dense layers.

    OMP_NUM_THREADS=1 python bench/experiments/dad_decode.py --json bench/results/dad_decode.json

Per case: best of ``--repeat`` wall times of one ``kvx_decode_slots`` call over the
workers' payloads, the arithmetic rate (2 k out in flops a payload), and, timed in the
same loop, NumPy's one-thread OpenBLAS forming the same sum (``u_w^T v_w`` summed over
workers; its own order and FMA, so not the same bits): the ratio says how far the
decoder, which keeps the reference's order and no FMA, is from a tuned GEMM. Run it from
outside the repo root or after ``make install`` (it imports the installed plugin).
"""
import argparse
import json
import time

import numpy as np

CASES = [  # (name, out, in, rows k, workers)
    ('mlp fc1, dad, 32 rows', 512, 784, 32, 4),
    ('mlp fc2, dad, 32 rows', 256, 512, 32, 4),
    ('cnn512 fc1 chunk, dad, 32 rows', 256, 3136, 32, 4),
    ('mlp fc1, rank 4', 512, 784, 4, 4),
    ('cnn512 fc1 chunk, rank 4', 256, 3136, 4, 4),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeat', type=int, default=7)
    parser.add_argument('--json')
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401  loads the plugin
    from kvstore_ext.blas import one_thread
    from kvstore_ext.ops import op
    rows = []
    for name, out, inputs, k, workers in CASES:
        rng = np.random.default_rng(0)
        factors = [(rng.standard_normal((k, out)).astype(np.float32),
                    rng.standard_normal((k, inputs)).astype(np.float32))
                   for _ in range(workers)]
        slots = mx.nd.stack(*[op('kvx_outer_encode')(mx.nd.array(u), mx.nd.array(v),
                                                     capacity=k)[0] for u, v in factors])
        best = blas = float('inf')
        for _ in range(args.repeat + 1):
            start = time.perf_counter()
            total, _ = op('kvx_decode_slots')(slots, size=out * inputs)
            total.wait_to_read()
            best = min(best, time.perf_counter() - start)
            with one_thread():
                start = time.perf_counter()
                acc = np.zeros((out, inputs), np.float32)
                for u, v in factors:
                    acc += u.T @ v
                blas = min(blas, time.perf_counter() - start)
        flops = 2.0 * workers * k * out * inputs
        rows.append({'case': name, 'out': out, 'in': inputs, 'k': k, 'workers': workers,
                     'ms': round(best * 1e3, 3), 'gflops': round(flops / best / 1e9, 2),
                     'blas_ms': round(blas * 1e3, 3), 'over_blas': round(best / blas, 2)})
        print('%-34s %8.2f ms  %6.2f GFLOP/s  %5.2fx one-thread OpenBLAS' % (
            name, rows[-1]['ms'], rows[-1]['gflops'], rows[-1]['over_blas']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'cases': rows}, f, indent=1)


if __name__ == '__main__':
    main()
