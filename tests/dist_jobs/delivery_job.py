"""One worker of the delivery job (run under kvstore_ext.launch): gradients whose
elements all have the same magnitude (a constant, a random sign per element, one
element) pushed through ``dist_sync_hylo`` for several steps; saves every pulled sum.
Before the delivery cap of the FC threshold every one of them was exactly 0."""
import argparse
import os

import numpy as np

SHAPES = {'constant': (300, 200), 'sign': (300, 200), 'one': (1,)}


def gradient(rank, key):
    """The same gradient at every step: +1 everywhere, a random +-1 per element (its own
    on each worker), or one element of 1."""
    if key == 'constant':
        return np.ones(SHAPES[key], np.float32)
    if key == 'sign':
        rng = np.random.default_rng([rank, 7])
        return rng.choice(np.float32([-1, 1]), size=SHAPES[key])
    return np.ones(SHAPES[key], np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--aggregation', choices=('homomorphic', 'server'), required=True)
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--out', required=True)
    args = parser.parse_args()

    import mxnet as mx
    import kvstore_ext  # noqa: F401  registers dist_sync_hylo
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'size_threshold': 0, 'aggregation': args.aggregation})
    record = {}
    for key in sorted(SHAPES):
        kv.broadcast(key, mx.nd.zeros(SHAPES[key]), mx.nd.zeros(SHAPES[key]))
    for step in range(args.steps):
        for key in sorted(SHAPES):
            out = mx.nd.zeros(SHAPES[key])
            kv.pushpull(key, mx.nd.array(gradient(kv.rank, key)), out=out)
            record['%s/%d' % (key, step)] = out.asnumpy()
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **record)


if __name__ == '__main__':
    main()
