"""One worker of the policy='auto' tests: SGD on a few tensors with deterministic
gradients (each worker and device its own), broadcast initial weights first, and save
per step whether each key went compressed (kv.plan), the agreed link rate, the
byte counters and the final weights."""
import argparse
import json
import os

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
    args = parser.parse_args()

    import mxnet as mx
    import kvstore_ext  # noqa: F401  registers the kvstore types
    kv = mx.kv.create(args.kvstore)
    kv.set_gradient_compression(json.loads(args.params))
    ctxs = [mx.cpu(i) for i in range(CONTEXT_COUNT)]
    weights = {}
    for i, (key, shape) in enumerate(SHAPES.items()):
        init = np.random.default_rng([kv.rank, 99, i]).standard_normal(shape)
        out = mx.nd.zeros(shape)
        kv.broadcast(key, mx.nd.array(init.astype(np.float32)), out)
        weights[key] = out.asnumpy()
    info = {'rank': kv.rank, 'compressed': {}, 'rate': {}}
    for step in range(args.steps):
        for key in SHAPES:
            vals = [mx.nd.array(gradient(kv.rank, step, key, d), ctx=c)
                    for d, c in enumerate(ctxs)]
            kv.pushpull(key, vals)
            weights[key] = weights[key] - LR * vals[0].asnumpy()
        info['compressed'][step] = {k: bool(kv.plan(k).compressed) for k in SHAPES}
        info['rate'][step] = float(getattr(kv.scheme, 'agreed_rate', 0.0))
    info['stats'] = kv.comm_stats()
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **weights)
    with open(os.path.join(args.out, 'rank%d.json' % kv.rank), 'w') as f:
        json.dump(info, f)


if __name__ == '__main__':
    main()
