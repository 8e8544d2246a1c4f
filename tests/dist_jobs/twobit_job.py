"""One worker of the 2-bit comparison (run under kvstore_ext.launch): the same gradients
through MXNet's built-in 2-bit compression on its own ``dist_sync`` (push, then pull:
MXNet refuses pushpull with compression) or through kvstore_ext's ``dist_sync_2bit``
(pushpull). Saves what it pulled at every step."""
import argparse
import os

import numpy as np

SHAPES = {'conv': (24, 8, 3, 3), 'fc': (70, 33), 'bias': (50,), 'wide': (5000,)}
CONTEXT_COUNT = 2


def gradient(rank, step, key, device):
    """The gradient a device of a worker produces (same function in the test): of the
    order of the threshold, so that residuals decide what is sent."""
    rng = np.random.default_rng([rank, step, device, sorted(SHAPES).index(key), 2])
    return (rng.standard_normal(SHAPES[key]) * 0.3).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', choices=('mxnet', 'ext'), required=True)
    parser.add_argument('--threshold', type=float, required=True)
    parser.add_argument('--steps', type=int, default=6)
    parser.add_argument('--out', required=True)
    args = parser.parse_args()

    import mxnet as mx
    ctxs = [mx.cpu(i) for i in range(CONTEXT_COUNT)]
    keys = sorted(SHAPES)
    if args.kvstore == 'mxnet':
        kv = mx.kv.create('dist_sync')
        kv.set_gradient_compression({'type': '2bit', 'threshold': args.threshold})
        kv.init(keys, [mx.nd.zeros(SHAPES[k]) for k in keys])
    else:
        import kvstore_ext  # noqa: F401  registers dist_sync_2bit
        kv = mx.kv.create('dist_sync_2bit')
        kv.set_gradient_compression({'threshold': args.threshold})

    record = {}
    for step in range(args.steps):
        for key in keys:
            vals = [mx.nd.array(gradient(kv.rank, step, key, d), ctx=c)
                    for d, c in enumerate(ctxs)]
            if args.kvstore == 'mxnet':
                kv.push(key, vals)
                kv.pull(key, out=vals)
            else:
                kv.pushpull(key, vals)
            record['out/%s/%d' % (key, step)] = vals[1].asnumpy()
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **record)


if __name__ == '__main__':
    main()
