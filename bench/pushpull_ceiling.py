"""One-process pushpull of a large FC gradient against what its kernels allow.

The target: a pushpull reaches at least half of the encode + decode kernels'
ceiling. In one process (rank 0 of 1, no launcher) dist_sync_hylo still runs its whole
codec path, in either aggregation mode (``--aggregation``; Hylo's default,
homomorphic, unless given). This harness times, interleaved in one run (best of
--reps blocks):

* ``copy``: ``out[:] = grad`` (reads 4 B, writes 4 B an element): the machine's
  memory bandwidth as MXNet's NDArray sees it;
* ``encode``: server mode: ``kvx_ternary_encode`` (reads grad + residual, writes
  residual + payload); homomorphic: ``kvx_ternary_encode_sum`` and the statistic the
  payload carries for the next step's agreement, ``kvx_acc_abs_sum`` (one more read of
  grad + residual);
* ``decode``: server mode: ``kvx_decode_slots`` of one payload; homomorphic:
  ``kvx_ternary_decode_sum`` of the summed words (reads the payload, writes the sum);
* ``pushpull``: ``kv.pushpull`` of the same tensor through dist_sync_hylo.

The ceiling is stated twice: from the kernels (encode + decode, as timed) and from
memory traffic (bytes the kernels must move, at the copy's bandwidth). The ratio
pushpull / ceiling is the measure (target: pushpull <= 2 x kernel time).

    python bench/pushpull_ceiling.py --rows 4096 --cols 1024 --reps 20
    python bench/pushpull_ceiling.py --aggregation server
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault('OMP_NUM_THREADS', '1')


def best_of(fn, reps, inner):
    """Best per-call seconds over ``reps`` blocks of ``inner`` calls (waits included)."""
    import mxnet as mx
    best = float('inf')
    for _ in range(reps):
        mx.nd.waitall()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        mx.nd.waitall()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                epilog=__doc__.split('\n\n', 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--rows', type=int, default=4096)
    p.add_argument('--cols', type=int, default=1024)
    p.add_argument('--reps', type=int, default=20, help='blocks; the best one counts')
    p.add_argument('--inner', type=int, default=5, help='calls a block')
    p.add_argument('--aggregation', choices=('homomorphic', 'server'), default=None,
                   help="Hylo's aggregation mode (default: Hylo's own default)")
    p.add_argument('--json', help='write the numbers here')
    args = p.parse_args(argv)

    import mxnet as mx
    import numpy as np
    import kvstore_ext  # noqa: F401  (registers dist_sync_hylo)
    from kvstore_ext import wire
    from kvstore_ext.codecs import AdditiveTernaryCodec
    from kvstore_ext.codecs.ternary import VALUE_RULES
    from kvstore_ext.ops import op, shape_attr
    from kvstore_ext.schemes import Hylo
    from kvstore_ext.schemes.hylo import FC_VALUE

    n = args.rows * args.cols
    rng = np.random.default_rng(0)
    grad = mx.nd.array(rng.standard_normal((args.rows, args.cols), dtype=np.float32))
    out = mx.nd.zeros_like(grad)
    residual = mx.nd.zeros((n,))
    flat = grad.reshape((n,))
    # Hylo's FC defaults
    defaults = {name: Hylo.PARAMS[name].default for name in ('fc_scale', 'aggregation')}
    defaults['fc_value'] = FC_VALUE
    aggregation = args.aggregation or defaults['aggregation']

    def run_copy():
        grad.copyto(out)

    if aggregation == 'server':
        words = wire.ternary_payload_words(n)
        encode, decode_slots = op('kvx_ternary_encode'), op('kvx_decode_slots')
        rule = dict(scale=defaults['fc_scale'], threshold=0.0,
                    value_rule=VALUE_RULES[defaults['fc_value']])
        slots = encode(flat, residual, **rule)[0].reshape((1, words))
        # encode: read grad + residual, write residual + payload; decode: read the
        # payload, write the sum
        traffic = 12.0 * n + 4.0 * words + 4.0 * words + 4.0 * n

        def run_encode():
            encode(flat, residual, **rule)

        def run_decode():
            decode_slots(slots, size=n)
    else:
        # the codec's own rules for the statistic and (t, v), one worker; its encode and
        # decode are timed as raw ops (the codec's methods also read their statuses)
        codec = AdditiveTernaryCodec((n,), defaults['fc_scale'], 0.0, 'previous',
                                     defaults['fc_value'])
        words = codec.sum_words(1)
        encode_sum, decode_sum = op('kvx_ternary_encode_sum'), op('kvx_ternary_decode_sum')
        fc_t, fc_v = codec.settle(codec.statistic(flat, residual), 1)
        summed = encode_sum(flat, residual, threshold=fc_t, num_workers=1, value=fc_v)[0]
        # encode: read grad + residual, write residual + payload, then read grad +
        # residual again for the carried statistic; decode: read the payload, write
        traffic = 12.0 * n + 4.0 * words + 8.0 * n + 4.0 * words + 4.0 * n

        def run_encode():
            encode_sum(flat, residual, threshold=fc_t, num_workers=1, value=fc_v)
            codec.statistic(flat, residual)

        def run_decode():
            decode_sum(summed, threshold=fc_v, num_workers=1, shape=shape_attr((n,)))

    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'aggregation': aggregation})

    def run_pushpull():
        kv.pushpull(0, grad, out=out)

    run_encode()
    run_decode()
    run_pushpull()      # plans the key, allocates its buffers
    times = {}
    for _ in range(2):  # two passes, interleaved; the best of each counts
        for name, fn in (('copy', run_copy), ('encode', run_encode),
                         ('decode', run_decode), ('pushpull', run_pushpull)):
            t = best_of(fn, args.reps // 2 or 1, args.inner)
            times[name] = min(times.get(name, t), t)
    bandwidth = 8.0 * n / times['copy']                       # bytes/s of a copy
    memory_ceiling = traffic / bandwidth
    kernel_ceiling = times['encode'] + times['decode']
    result = {
        'elements': n, 'aggregation': aggregation, 'seconds': times,
        'copy_GBps': bandwidth / 1e9,
        'encode_decode_bytes': traffic, 'memory_ceiling_s': memory_ceiling,
        'kernel_ceiling_s': kernel_ceiling,
        'pushpull_over_kernels': times['pushpull'] / kernel_ceiling,
        'pushpull_over_memory': times['pushpull'] / memory_ceiling,
        'target_holds': times['pushpull'] <= 2 * kernel_ceiling,
    }
    print('%d elements (%.1f MB float32), %s aggregation, best of %d x %d calls' % (
        n, 4e-6 * n, aggregation, args.reps, args.inner))
    for name in ('copy', 'encode', 'decode', 'pushpull'):
        print('  %-9s %8.2f ms' % (name, 1e3 * times[name]))
    print('  copy bandwidth %.2f GB/s; encode + decode move %.1f MB: memory ceiling %.2f ms'
          % (bandwidth / 1e9, traffic / 1e6, 1e3 * memory_ceiling))
    print('  kernel ceiling (encode + decode) %.2f ms; pushpull = %.2fx kernels, %.2fx memory '
          'ceiling; target (<= 2x kernels) %s' % (
              1e3 * kernel_ceiling, result['pushpull_over_kernels'],
              result['pushpull_over_memory'], 'holds' if result['target_holds'] else 'fails'))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    sys.exit(main())
