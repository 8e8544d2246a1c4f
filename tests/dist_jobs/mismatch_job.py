"""One worker of the configuration-mismatch test (run under kvstore_ext.launch): a few
keys declared as Gluon's Trainer declares them (``broadcast``), as Module does
(``init``) or by their first ``pushpull``, then a few steps of gradients seeded by
(rank, step). Rank 0 (launch index 0 for --worker0-kvstore) can be configured differently from
the others.

Every step prints a digest of each pulled sum (the workers' sums must be equal) and a
digest of a 'weight' updated by plain SGD on the sums (replicas that drift apart show
different weight digests); the last line is 'rank R done'.
"""
import argparse
import hashlib
import json
import os

import numpy as np

SHAPES = {'bias': (64,), 'conv': (16, 8, 3, 3), 'fc': (64, 40)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', default='dist_sync_hylo')
    parser.add_argument('--params', default='{}', help='JSON compression params, every rank')
    parser.add_argument('--worker0-kvstore', help='launch index 0 creates this kvstore type '
                        'instead (a process makes one kvstore: its rank is known only after)')
    parser.add_argument('--rank0-params', help='JSON params merged over --params on rank 0')
    parser.add_argument('--rank0-fc-rows', type=int, help="rank 0's 'fc' has this many rows")
    parser.add_argument('--rank0-params-after-declare',
                        help='JSON params rank 0 sets after declaring the keys, before the '
                             'first step')
    parser.add_argument('--declare', choices=['broadcast', 'init', 'pushpull'],
                        default='broadcast')
    parser.add_argument('--steps', type=int, default=4)
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    from kvstore_ext.launch import announce_rank
    kv = mx.kv.create(args.worker0_kvstore if args.worker0_kvstore and
                      os.environ['DMLC_WORKER_ID'] == '0' else args.kvstore)
    announce_rank(kv.rank)
    params = json.loads(args.params)
    if args.rank0_params and kv.rank == 0:
        params.update(json.loads(args.rank0_params))
    if params:
        kv.set_gradient_compression(params)
    shapes = dict(SHAPES)
    if args.rank0_fc_rows and kv.rank == 0:
        shapes['fc'] = (args.rank0_fc_rows,) + shapes['fc'][1:]
    weights = {}
    for index, (key, shape) in enumerate(sorted(shapes.items())):
        weights[key] = mx.nd.array(np.random.default_rng([7, index]).standard_normal(shape)
                                   .astype(np.float32))
        if args.declare == 'broadcast':
            kv.broadcast(key, weights[key], out=weights[key])
        elif args.declare == 'init':
            kv.init(key, weights[key])
    if args.rank0_params_after_declare and kv.rank == 0:
        kv.set_gradient_compression(dict(params, **json.loads(args.rank0_params_after_declare)))
    for step in range(args.steps):
        for index, (key, shape) in enumerate(sorted(shapes.items())):
            rng = np.random.default_rng([kv.rank, step, index])
            grad = mx.nd.array(rng.standard_normal(shape).astype(np.float32))
            kv.pushpull(key, grad)
            weights[key] -= 0.1 * grad
            print('rank %d step %d key %s sum %s weight %s' % (
                kv.rank, step, key, hashlib.sha1(grad.asnumpy().tobytes()).hexdigest()[:16],
                hashlib.sha1(weights[key].asnumpy().tobytes()).hexdigest()[:16]), flush=True)
    print('rank %d done' % kv.rank, flush=True)


if __name__ == '__main__':
    main()
