"""One worker of a 2-worker job with a plain Gluon script (tests/test_handover.py): a
Trainer with SGD momentum and ``kvstore=kv``, nothing else. Writes what the store's
scheme got (its parameters, the rate it reads, its conv codec) to ``<out>/rank<r>.json``.
"""
import argparse
import json
import os

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext  # noqa: F401


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--out', required=True)
    args = parser.parse_args()
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'momentum_correction': 'on'})    # 'auto': from 8 workers
    mx.random.seed(1)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(64, 5, in_channels=32), gluon.nn.Flatten(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05,
                                                          'momentum': 0.9}, kvstore=kv)
    x = mx.nd.array(np.random.default_rng(kv.rank).standard_normal((2, 32, 8, 8)))
    for _ in range(2):
        with autograd.record():
            loss = net(x).square().mean()
        loss.backward()
        trainer.step(2 * kv.num_workers)
    conv = next(k for k in kv.codec_plan() if kv.plan(k).layer == 'conv')
    codec = kv.plan(conv).chunks[0].codec
    inner = getattr(codec, 'inner', None)
    name = type(codec).__name__ + ('(%s)' % type(inner).__name__ if inner else '')
    with open(os.path.join(args.out, 'rank%d.json' % kv.rank), 'w') as f:
        rate = kv.scheme.learning_rate
        json.dump({'params': kv.scheme.params, 'rate': rate() if rate else None,
                   'conv_codec': name}, f)


if __name__ == '__main__':
    main()
