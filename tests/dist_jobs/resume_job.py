"""One worker of the resume test (run under kvstore_ext.launch): dist_sync_hylo with a
compressed pull, over steps [--first, --last) of gradients seeded by (rank, step).

--load DIR: restore this worker's state (and, through rank 0's file, the servers')
from DIR before the first step; --save DIR: save it after the last step. Every step
prints a digest of the pulled sum's bytes, for the test to compare a resumed run with
one that never stopped. --unread: read no sum before the save (digests are printed
after it), as a loop that saves right after its last ``trainer.step`` does: the save
is then issued while the last rounds may still be in flight. --late-gradient N: rank
1's last gradients come out of N x N matrix products (as from a slow backward pass), so
that the other worker's last rounds reach the servers after rank 0 is done with its
last pushpull calls.
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
    parser.add_argument('--unread', action='store_true')
    parser.add_argument('--scale', type=int, default=1,
                        help='multiply the tensors\' first dimension (slower rounds)')
    parser.add_argument('--late-gradient', type=int, default=0)
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(PARAMS)
    if args.load:
        kv.load_compression_state(os.path.join(args.load, 'state-%d.kvx' % kv.rank))
    unread = []

    def report(step, key, value):
        digest = hashlib.sha1(value.asnumpy().tobytes()).hexdigest()[:16]
        print('rank %d step %d key %s sum %s' % (kv.rank, step, key, digest), flush=True)

    for step in range(args.first, args.last):
        for index, (key, shape) in enumerate(sorted(SHAPES.items())):
            shape = (shape[0] * args.scale,) + shape[1:]
            rng = np.random.default_rng([kv.rank, step, index])
            value = mx.nd.array(rng.standard_normal(shape).astype(np.float32))
            if args.late_gradient and kv.rank == 1 and step == args.last - 1:
                value = late(mx, value, args.late_gradient)
            kv.pushpull(key, value)
            if args.unread:
                unread.append((step, key, value))
            else:
                report(step, key, value)
    if args.save:
        kv.save_compression_state(os.path.join(args.save, 'state-%d.kvx' % kv.rank))
    for step, key, value in unread:
        report(step, key, value)


def late(mx, value, size):
    """``value`` exactly (x + 0.0 == x), as the result of engine ops that take a while:
    a product of two ``size`` x ``size`` matrices, times zero."""
    square = mx.nd.ones((size, size)) / size
    for _ in range(3):
        square = mx.nd.dot(square, square)
    return value + square.sum() * 0


if __name__ == '__main__':
    main()
