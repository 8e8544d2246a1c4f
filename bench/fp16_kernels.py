"""What a ``dist_sync_fp16`` worker spends on one tensor a step: the float16 ops against
the MXNet operators they replace, and against a copy of the tensor.

* ``encode``: ``kvx_fp16_encode`` (acc = grad + residual, finite check, clip, round,
  residual update: two passes) against the nine MXNet operators that did the same
  engine-side (``grad + residual``, ``kvx_finite_check``, ``where``, ``broadcast_mul``
  by 1 or NaN, ``clip``, ``astype(float16)``, ``astype(float32)``, subtraction, and
  a copy into the residual);
* ``round``: ``kvx_fp16_round``, the default (no error feedback): finite check, clip and
  rounding in one pass (the CPU's float16 conversion where it has F16C);
* ``widen``: ``kvx_fp16_widen`` of the pulled sum against ``astype(float32)``;
* ``cast``: MXNet's ``astype(float16)`` alone;
* ``server add``: ``a += b`` on float16 NDArrays against float32 ones: what MXNet's stock
  server runs for every worker's push of a key (it merges pushes with NDArray adds);
* ``server pairs``: what ``aggregation='server'`` makes a server do instead for one
  worker's push: ``kvx_decode_slots`` of one pairs payload (widen, add in float32);
  its reply, the sum rounded once to float16 (``kvx_codec_encode``, codec 7), is one
  more call a round, not one a worker;
* ``copy``: ``NDArray.copy`` of the float32 tensor (4 bytes read, 4 written an element),
  the memory-bandwidth yardstick.

Every path is timed interleaved with the others, block after block (wall time of
``calls`` calls and a ``waitall``), and each ratio is the median over blocks of the ratio
within a block, so a change of machine load between blocks cancels. Results go to
``--json`` (bench/results/fp16_kernels.json) and docs/schemes/fp16.md quotes them.

    python bench/fp16_kernels.py [--sizes 1e5,1605632,1e7] [--blocks 15] [--json PATH]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np


def paths(mx, op, n, rng):
    """name -> a callable queuing one call of that path on MXNet's engine."""
    from kvstore_ext.codecs.fp16 import limit
    grad = mx.nd.array(rng.standard_normal(n).astype(np.float32))
    residual = mx.nd.array(rng.standard_normal(n).astype(np.float32) * 1e-3)
    summed = grad.astype(np.float16)
    bound = limit(4)
    nan, one = mx.nd.array([np.nan]), mx.nd.array([1.0])
    merged16, merged32 = mx.nd.zeros(n, dtype=np.float16), mx.nd.zeros(n)
    pairs, _ = op('kvx_codec_encode')(grad, grad, codec=7, a=bound, b=0.0)
    slot = pairs.reshape((1, -1))

    def add_into(merged, pushed):
        merged += pushed

    def engine_ops():        # the step before kvx_fp16_encode, operator for operator
        acc = grad + residual
        bad = op('kvx_finite_check')(acc)
        spoil = mx.nd.where(bad, nan, one)
        half = mx.nd.broadcast_mul(acc, spoil).clip(-bound, bound).astype(np.float16)
        (acc - half.astype(np.float32)).copyto(residual)    # was: a copy if bad is 0

    return {
        'encode_ops': lambda: op('kvx_fp16_encode')(grad, residual, limit=bound),
        'encode_mxnet': engine_ops,
        'round_op': lambda: op('kvx_fp16_round')(grad, limit=bound),
        'widen_op': lambda: op('kvx_fp16_widen')(summed),
        'widen_mxnet': lambda: summed.astype(np.float32),
        'cast_mxnet': lambda: grad.astype(np.float16),
        'copy': lambda: grad.copy(),
        'server_add_f16': lambda: add_into(merged16, summed),
        'server_add_f32': lambda: add_into(merged32, grad),
        'server_pairs': lambda: op('kvx_decode_slots')(slot, size=n),
    }


def block_times(mx, fns, calls):
    """Seconds a call of each path, one block each, in one interleaved pass."""
    out = {}
    for name, fn in fns.items():
        mx.nd.waitall()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        mx.nd.waitall()
        out[name] = (time.perf_counter() - start) / calls
    return out


def measure(mx, op, n, blocks, rng):
    fns = paths(mx, op, n, rng)
    calls = max(3, int(2e7 // max(n, 1)))
    block_times(mx, fns, calls)                      # warm up: allocations, clones
    runs = [block_times(mx, dict(reversed(list(fns.items())) if b % 2 else fns), calls)
            for b in range(blocks)]

    def median_ms(name):
        return statistics.median(r[name] for r in runs) * 1e3

    def ratio(a, b):
        return statistics.median(r[a] / r[b] for r in runs)
    return {
        'elements': n, 'calls_per_block': calls, 'blocks': blocks,
        'ms': {name: median_ms(name) for name in fns},
        'encode_mxnet_over_ops': ratio('encode_mxnet', 'encode_ops'),
        'widen_mxnet_over_op': ratio('widen_mxnet', 'widen_op'),
        'encode_ops_over_copy': ratio('encode_ops', 'copy'),
        'widen_op_over_copy': ratio('widen_op', 'copy'),
        'cast_mxnet_over_encode_ops': ratio('cast_mxnet', 'encode_ops'),
        'round_op_over_copy': ratio('round_op', 'copy'),
        'cast_mxnet_over_round_op': ratio('cast_mxnet', 'round_op'),
        'server_add_f16_over_f32': ratio('server_add_f16', 'server_add_f32'),
        'server_add_f16_over_pairs': ratio('server_add_f16', 'server_pairs'),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--sizes', default='1e5,1605632,1e7',
                   help='elements (1,605,632: cnn512\'s 512 x 3136 weight)')
    p.add_argument('--blocks', type=int, default=15)
    p.add_argument('--json', help='write the results here')
    args = p.parse_args(argv)
    import mxnet as mx
    import kvstore_ext  # noqa: F401  (loads the plugin)
    from kvstore_ext.ops import op
    rng = np.random.default_rng(0)
    rows = [measure(mx, op, int(float(s)), args.blocks, rng) for s in args.sizes.split(',')]
    print('%10s %9s %9s %9s %9s %9s %9s  %s' % ('elements', 'encode', 'mxnet', 'round',
                                                 'widen', 'mxnet', 'copy',
                                                 'ms a call; ratios'))
    for r in rows:
        ms = r['ms']
        print('%10d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f  encode %.1fx faster, widen %.1fx, '
              'encode = %.1f copies, round = %.2f copies, a float16 server add %.1fx a '
              'float32 one and %.1fx a pairs decode' % (
                  r['elements'], ms['encode_ops'], ms['encode_mxnet'], ms['round_op'],
                  ms['widen_op'], ms['widen_mxnet'], ms['copy'], r['encode_mxnet_over_ops'],
                  r['widen_mxnet_over_op'], r['encode_ops_over_copy'], r['round_op_over_copy'],
                  r['server_add_f16_over_f32'], r['server_add_f16_over_pairs']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'machine': {'cpus': os.cpu_count(), 'platform': platform.platform(),
                                   'load_before': os.getloadavg()[0],
                                   'mxnet': mx.__version__},
                       'command': ' '.join(['python', 'bench/fp16_kernels.py'] + sys.argv[1:]),
                       'rows': rows}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
