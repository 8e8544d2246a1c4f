"""One worker of the no-wait test (run under kvstore_ext.launch).

Ranks other than 0 push a new array every step and never read what they pull, so
nothing but the store orders their step s+1 after step s: MXNet's dist_sync would let
that push leave while step s's round is still open, and the server would count it in
that round. Rank 0 starts each step late (so the others run ahead), reads every sum
and checks it against the sum of all workers' gradients (seeded by rank, step, key).
"""
import argparse
import time

import numpy as np

SHAPES = {'bias': (64,), 'weight': (32, 300)}
PARAMS = {'dist_sync_hylo': {'size_threshold': 1000}, 'dist_sync_none': {},
          'dist_sync_fp16': {'size_threshold': 1000}}
# the keys each kvstore pushes: float32 through MXNet's own pushpull (under the size
# threshold, or uncompressed), and float16 through a Sum round (transport/ps.py)
KEYS = {'dist_sync_hylo': ['bias'], 'dist_sync_none': ['bias', 'weight'],
        'dist_sync_fp16': ['weight']}
TOLERANCE = {'dist_sync_fp16': 1e-2}      # float16 payloads; float32 keys: 1e-5


def gradient(rank, step, key):
    rng = np.random.default_rng([rank, step, sorted(SHAPES).index(key)])
    return (rng.standard_normal(SHAPES[key]) * 0.1).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', required=True, choices=sorted(PARAMS))
    parser.add_argument('--steps', type=int, default=30)
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(args.kvstore)
    kv.set_gradient_compression(PARAMS[args.kvstore])
    keys = KEYS[args.kvstore]
    worst = 0.0
    for step in range(args.steps):
        if kv.rank == 0:
            time.sleep(0.02)
        for key in keys:
            value = mx.nd.array(gradient(kv.rank, step, key))
            kv.pushpull(key, value)
            if kv.rank != 0:
                continue
            expect = sum(gradient(rank, step, key) for rank in range(kv.num_workers))
            error = float(np.abs(value.asnumpy() - expect).max() / np.abs(expect).max())
            worst = max(worst, error)
            if error > TOLERANCE.get(args.kvstore, 1e-5):
                raise SystemExit('step %d key %s: the sum differs from the workers\' by %g '
                                 '(relative): a round took another step\'s push'
                                 % (step, key, error))
    mx.nd.waitall()
    if kv.rank == 0:
        print('no-wait %s steps %d worst relative error %.3g'
              % (args.kvstore, args.steps, worst), flush=True)
    print('rank %d done' % kv.rank, flush=True)


if __name__ == '__main__':
    main()
