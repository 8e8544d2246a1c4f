"""Kernel speed of two builds of the plugin (libkvx_ops.so), old against new, in one run.

Both libraries are loaded with ctypes (their C API, cpp/capi.h) into this process and
every kernel is timed on the same inputs, alternating old and new call by call (the
order flips every repetition), so that a shared machine slows both alike. For each
kernel and size: the best time of each library and ``old/new`` (above 1: new faster).
Encoders get their residual restored before every call (outside the timing).

    python bench/kernels_compare.py OLD.so NEW.so [--sizes 1e6,4e6] [--reps 40]
        [--json bench/results/kernels_cpp_table.json]
"""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernels  # noqa: E402  (bench/kernels.py: the C API's ctypes signatures)

f32 = np.float32
FILTER_SIZE, WORKERS = 4608, 4


def load(path):
    """The library's C API with the signatures bench/kernels.py declares."""
    return kernels.load_capi(os.path.abspath(path))


def ptr(a):
    return a.ctypes.data


def cases(n, rng):
    """(name, call(lib), restore) for every kernel: inputs made once, shared by both."""
    g = (rng.standard_normal(n) * 1e-3).astype(f32)
    r0 = (rng.standard_normal(n) * 0.1).astype(f32)
    r = r0.copy()
    out = np.zeros(n, f32)
    acc = np.zeros(n, f32)
    filters = n // FILTER_SIZE
    k = max(1, filters // 20)
    m = filters * FILTER_SIZE
    p32 = np.zeros(n + 8, f32)
    tern = np.zeros(8 + -(-n // 15), f32)
    topk = np.zeros(8 + k + k * FILTER_SIZE, f32)
    sums = np.zeros(-(-n // 7), f32)         # 4 workers: base 9, 7 digits a word
    two = np.zeros(-(-n // 16), np.uint32)
    values = np.zeros(k * FILTER_SIZE, f32)
    idx = (np.arange(k) * (filters // k)).astype(f32)

    def restore():
        r[:] = r0

    return [
        ('fp32_encode', lambda L: L.kvx_fp32_encode(ptr(g), n, ptr(p32)), None),
        ('fp32_decode_add', lambda L: L.kvx_fp32_decode_add(ptr(p32), n + 8, n, ptr(acc)), None),
        ('topk_encode F=4608 5%', lambda L: L.kvx_topk_encode(
            ptr(g), ptr(r), filters, FILTER_SIZE, k, ptr(topk)), restore),
        ('topk_decode_add', lambda L: L.kvx_topk_decode_add(ptr(topk), topk.size, m, ptr(acc)), None),
        ('topk_gather', lambda L: L.kvx_topk_gather(
            ptr(g), ptr(r), filters, FILTER_SIZE, ptr(idx), k, ptr(values)), restore),
        ('ternary_encode adaptive', lambda L: L.kvx_ternary_encode(
            ptr(g), ptr(r), n, 2.0, 0.0, ptr(tern)), restore),
        ('ternary_decode', lambda L: L.kvx_ternary_decode(ptr(tern), tern.size, n, ptr(out)), None),
        ('ternary_decode_add', lambda L: L.kvx_ternary_decode_add(
            ptr(tern), tern.size, n, ptr(acc)), None),
        ('ternary_encode_sum 4w', lambda L: L.kvx_ternary_encode_sum(
            ptr(g), ptr(r), n, 0.05, WORKERS, ptr(sums)), restore),
        ('ternary_decode_sum 4w', lambda L: L.kvx_ternary_decode_sum(
            ptr(sums), sums.size, 0.05, WORKERS, n, ptr(out)), None),
        ('twobit_encode', lambda L: L.kvx_twobit_encode(ptr(g), ptr(r), n, 0.05, ptr(two)),
         restore),
        ('twobit_decode', lambda L: L.kvx_twobit_decode(ptr(two), n, 0.05, ptr(out)), None),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('old')
    p.add_argument('new')
    p.add_argument('--sizes', default='1e6,4e6')
    p.add_argument('--reps', type=int, default=40)
    p.add_argument('--json')
    args = p.parse_args()
    libs = {'old': load(args.old), 'new': load(args.new)}
    rows = []
    for n in [int(float(s)) for s in args.sizes.split(',')]:
        rng = np.random.default_rng(0)
        kernels = cases(n, rng)
        for name, call, restore in kernels:
            # Decoders read the payloads the encoders before them wrote (the two libraries
            # write the same bits: tests/test_cpp_ops.py holds both to the reference).
            best = {'old': float('inf'), 'new': float('inf')}
            for rep in range(args.reps):
                order = ('old', 'new') if rep % 2 == 0 else ('new', 'old')
                for which in order:
                    if restore:
                        restore()
                    t0 = time.perf_counter()
                    status = call(libs[which])
                    best[which] = min(best[which], time.perf_counter() - t0)
                    assert status == 0, (name, which, status)
            row = {'kernel': name, 'n': n, 'old_ms': 1e3 * best['old'],
                   'new_ms': 1e3 * best['new'], 'old_over_new': best['old'] / best['new']}
            rows.append(row)
            print('%-26s n=%-9d old %8.3f ms  new %8.3f ms  old/new %.3f'
                  % (name, n, row['old_ms'], row['new_ms'], row['old_over_new']))
    ratios = [r['old_over_new'] for r in rows]
    summary = {'geomean_old_over_new': float(np.exp(np.mean(np.log(ratios)))),
               'min_old_over_new': min(ratios), 'max_old_over_new': max(ratios)}
    print('geometric mean old/new %.3f (min %.3f, max %.3f)'
          % (summary['geomean_old_over_new'], summary['min_old_over_new'],
             summary['max_old_over_new']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'old': args.old, 'new': args.new, 'reps': args.reps,
                       'timer': 'perf_counter, best of reps, old/new alternating',
                       'machine': platform.processor() or platform.machine(),
                       'summary': summary, 'rows': rows}, f, indent=1)


if __name__ == '__main__':
    main()
