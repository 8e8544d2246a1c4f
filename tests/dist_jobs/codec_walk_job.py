"""One worker of a codec's walk (run under kvstore_ext.launch): imports ``--module``
(which may register a scheme from outside kvstore_ext, as tests/toy_codec does),
pushpulls the same gradients through ``--kvstore`` and saves what it pulled at every
step. Any codec's test can run it (docs/ADDING_A_SCHEME.md)."""
import argparse
import os

import numpy as np

SHAPES = {'a': (6, 5), 'b': (40,), 'c': (3, 7, 2)}


def gradient(rank, step, key):
    """The gradient of a worker (same function in the test)."""
    rng = np.random.default_rng([rank, step, sorted(SHAPES).index(key), 11])
    return rng.standard_normal(SHAPES[key]).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', required=True)
    parser.add_argument('--module', default='kvstore_ext')
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--out', required=True)
    args = parser.parse_args()

    import importlib
    import mxnet as mx
    importlib.import_module(args.module)
    kv = mx.kv.create(args.kvstore)
    record = {}
    for step in range(args.steps):
        for key in sorted(SHAPES):
            value = mx.nd.array(gradient(kv.rank, step, key))
            kv.pushpull(key, value)
            record['out/%s/%d' % (key, step)] = value.asnumpy()
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **record)


if __name__ == '__main__':
    main()
