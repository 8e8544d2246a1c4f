"""One worker of the resume test (run under kvstore_ext.launch): dist_sync_hylo with a
compressed pull, over steps [--first, --last) of gradients seeded by (rank, step).

--load DIR: restore this worker's state (and, through rank 0's file, the servers')
from DIR before the first step; --save DIR: save it after the last step. Every step
prints a digest of the pulled sum's bytes, for the test to compare a resumed run with
one that never stopped.
"""
import argparse
import hashlib
import os

import numpy as np

SHAPES = {'fc': (64, 40), 'conv': (16, 8, 3, 3)}
PARAMS = {'size_threshold': 100, 'aggregation': 'server', 'pull': 'compressed'}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--first', type=int, default=0)
    parser.add_argument('--last', type=int, required=True)
    parser.add_argument('--save')
    parser.add_argument('--load')
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(PARAMS)
    if args.load:
        kv.load_compression_state(os.path.join(args.load, 'state-%d.kvx' % kv.rank))
    for step in range(args.first, args.last):
        for index, (key, shape) in enumerate(sorted(SHAPES.items())):
            rng = np.random.default_rng([kv.rank, step, index])
            value = mx.nd.array(rng.standard_normal(shape).astype(np.float32))
            kv.pushpull(key, value)
            digest = hashlib.sha1(value.asnumpy().tobytes()).hexdigest()[:16]
            print('rank %d step %d key %s sum %s' % (kv.rank, step, key, digest), flush=True)
    if args.save:
        kv.save_compression_state(os.path.join(args.save, 'state-%d.kvx' % kv.rank))


if __name__ == '__main__':
    main()
