"""One worker of the distributed dAD tests (run under kvstore_ext.launch).

A small network (conv, three Dense layers) with ``kvstore_ext.dad.attach``, two CPU
devices a worker, a Gluon Trainer on the kvstore under test. Every step it saves, per
parameter, this worker's own gradient (its devices summed) and the sum the kvstore
returned, and per attached layer the rows its backward passes captured, so that the
test can recompute the sum with the NumPy reference and compare it with what
``dist_sync`` would return (the sum of the workers' gradients), and the residual of
every dAD key that keeps one (rank-dAD's error feedback).
"""
import argparse
import json
import os

import numpy as np

CONTEXT_COUNT = 2
ROWS = 6           # samples a device


def build_net():
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3, activation='relu'), nn.Dense(64, activation='relu'),
            nn.Dense(48, activation='tanh', flatten=False), nn.Dense(5))
    return net


def batch(rank, step, device):
    rng = np.random.default_rng([rank, step, device])
    return rng.standard_normal((ROWS, 1, 8, 8)).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', default='dist_sync_dad')
    parser.add_argument('--params', default='{}')
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--hybridize', action='store_true')
    parser.add_argument('--out', required=True)
    args = parser.parse_args()

    import mxnet as mx
    from mxnet import autograd, gluon
    import kvstore_ext
    import kvstore_ext.dad
    kv = mx.kv.create(args.kvstore)
    kv.set_gradient_compression(json.loads(args.params))
    ctxs = [mx.cpu(i) for i in range(CONTEXT_COUNT)]
    mx.random.seed(3)                       # the same initial weights on every worker
    net = build_net()
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    layers = kvstore_ext.dad.attach(net)
    if args.hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05},
                            kvstore=kv, update_on_kvstore=False)
    params = list(net.collect_params().items())
    record = {}
    for step in range(args.steps):
        with autograd.record():
            losses = [(net(mx.nd.array(batch(kv.rank, step, d), ctx=c)) ** 2).sum()
                      for d, c in enumerate(ctxs)]
        for loss in losses:
            loss.backward()
        for name, p in params:
            record['local/%s/%d' % (name, step)] = sum(g.asnumpy() for g in p.list_grad())
        for i, layer in enumerate(layers):
            layer.wait()                            # the capture has run
            pending = layer.peek()                  # the kvstore takes them
            if pending is not None:
                record['A/%d/%d' % (i, step)], record['D/%d/%d' % (i, step)] = pending
        trainer.allreduce_grads()
        for name, p in params:
            record['sum/%s/%d' % (name, step)] = p.list_grad()[1].asnumpy()
        for key, layer in getattr(kv.scheme, '_bound', {}).items():
            residual = kv.key_state(key).residual     # rank-dAD's error feedback
            if residual is not None:
                record['residual/%s/%d' % (layer.block.weight.name, step)] = residual
        trainer.update(ROWS * CONTEXT_COUNT * kv.num_workers)
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **record)
    with open(os.path.join(args.out, 'rank%d.json' % kv.rank), 'w') as f:
        json.dump({'rank': kv.rank, 'num_workers': kv.num_workers, 'stats': kv.comm_stats(),
                   'plan': sorted(kv.codec_plan().values()),
                   'layers': [l.block.weight.name for l in layers]}, f)


if __name__ == '__main__':
    main()
