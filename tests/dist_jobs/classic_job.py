"""One worker of the init/push/pull test on ps-lite (run under kvstore_ext.launch).

Every worker inits each key with its own value: a pull before any push must return
rank 0's. Then key K goes through push (two devices) and pull, and key 'twin_K'
through pushpull, with the same gradients: a push is a pushpull round, so what they
return is bit-identical, error feedback included (checked here). What was pulled is
saved for the test, which compares workers and sums.
"""
import argparse
import json

import numpy as np

SHAPES = {'fc': (70, 33), 'bias': (50,)}     # fc compressed (2-bit), bias float32
PARAMS = {'type': 'hylo', 'size_threshold': 100}
STEPS = 4


def gradient(rank, step, key, device):
    """What a device of a worker pushes (the same function in the test)."""
    seed = [rank, step, device, sorted(SHAPES).index(key)]
    return np.random.default_rng(seed).standard_normal(SHAPES[key]).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--out', required=True, help='.npz path; {rank} is replaced')
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(PARAMS)
    ctxs = [mx.cpu(0), mx.cpu(1)]
    saved = {}
    for key, shape in SHAPES.items():
        kv.init([key, 'twin_' + key], [mx.nd.full(shape, kv.rank + 1), mx.nd.zeros(shape)])
        initial = mx.nd.zeros(shape)
        kv.pull(key, out=initial)
        assert (initial.asnumpy() == 1).all(), 'pull after init must return rank 0\'s value'
    for step in range(STEPS):
        for key, shape in SHAPES.items():
            grads = [gradient(kv.rank, step, key, d) for d in range(len(ctxs))]
            kv.push(key, [mx.nd.array(g, ctx=c) for g, c in zip(grads, ctxs)])
            outs = [mx.nd.zeros(shape, ctx=c) for c in ctxs]
            kv.pull(key, out=outs)
            twin = [mx.nd.array(g, ctx=c) for g, c in zip(grads, ctxs)]
            kv.pushpull('twin_' + key, twin)
            for out, expect in zip(outs, twin):
                assert np.array_equal(out.asnumpy(), expect.asnumpy()), (key, step)
            saved['%s/%d' % (key, step)] = outs[0].asnumpy()
    saved['stats'] = np.array(json.dumps(kv.comm_stats()))
    np.savez(args.out.replace('{rank}', str(kv.rank)), **saved)
    print('rank %d ok' % kv.rank, flush=True)


if __name__ == '__main__':
    main()
