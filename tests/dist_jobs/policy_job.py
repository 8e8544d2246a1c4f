"""One worker of the policy='auto' tests: SGD on a few tensors with deterministic
gradients (each worker and device its own), broadcast initial weights first, and save
per step whether each key went compressed (kv.plan), the agreed link rate, the
agreed codec seconds, what kv.policy_decisions() reports at the end, the byte counters
and the final weights; kvstore_ext's log lines (INFO) go to stdout. ``--codec-seconds``
(one number per rank) makes each worker report that its codecs take that long a step
through the scheme's ``codec_timer`` hook, instead of timing them. ``--slow-plan``
(seconds per rank, and 'compressed' or 'float32') makes a worker's step that long
slower while its keys go that way: a plan's cost the trial of policy='auto' must see
(plan_trial.py)."""
import argparse
import json
import logging
import os
import sys
import time

import numpy as np

SHAPES = {'conv': (24, 8, 3, 3), 'fc': (70, 33), 'bias': (50,), 'wide': (5000,)}
CONTEXT_COUNT = 2
LR = 0.1


def gradient(rank, step, key, device):
    rng = np.random.default_rng([rank, step, device, sorted(SHAPES).index(key)])
    return rng.standard_normal(SHAPES[key]).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', default='dist_sync_hylo')
    parser.add_argument('--params', default='{}')
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--out', required=True)
    parser.add_argument('--codec-seconds', default=None,
                        help='JSON list: the codec seconds each rank reports')
    parser.add_argument('--slow-plan', default=None,
                        help='JSON [[seconds per rank], "compressed" or "float32"]')
    args = parser.parse_args()
    slow, slow_when = json.loads(args.slow_plan) if args.slow_plan else ([], None)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)

    import mxnet as mx
    import kvstore_ext  # noqa: F401  registers the kvstore types
    kv = mx.kv.create(args.kvstore)
    kv.set_gradient_compression(json.loads(args.params))
    if args.codec_seconds:
        from kvstore_ext import chunking, cost
        seconds = json.loads(args.codec_seconds)[kv.rank]

        def timer(codec, workers, chunk_size):
            return {cost.signature(c.codec): (seconds, 0.0)
                    for c in chunking.split(codec, chunk_size)}
        kv.scheme.codec_timer = timer
    ctxs = [mx.cpu(i) for i in range(CONTEXT_COUNT)]
    weights = {}
    for i, (key, shape) in enumerate(SHAPES.items()):
        init = np.random.default_rng([kv.rank, 99, i]).standard_normal(shape)
        out = mx.nd.zeros(shape)
        kv.broadcast(key, mx.nd.array(init.astype(np.float32)), out)
        weights[key] = out.asnumpy()
    info = {'rank': kv.rank, 'compressed': {}, 'rate': {}}
    for step in range(args.steps):
        if slow_when is not None and step:     # the plan of the step before
            if any(info['compressed'][step - 1].values()) == (slow_when == 'compressed'):
                time.sleep(slow[kv.rank])
        for key in SHAPES:
            vals = [mx.nd.array(gradient(kv.rank, step, key, d), ctx=c)
                    for d, c in enumerate(ctxs)]
            kv.pushpull(key, vals)
            weights[key] = weights[key] - LR * vals[0].asnumpy()
        info['compressed'][step] = {k: bool(kv.plan(k).compressed) for k in SHAPES}
        info['rate'][step] = float(getattr(kv.scheme, 'agreed_rate', 0.0))
    speeds = getattr(kv.scheme, 'codec_speeds', None)
    info['codec_seconds'] = speeds.measured if speeds is not None else None
    info['stats'] = kv.comm_stats()
    info['policy'] = kv.policy_decisions()
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **weights)
    with open(os.path.join(args.out, 'rank%d.json' % kv.rank), 'w') as f:
        json.dump(info, f)


if __name__ == '__main__':
    main()
