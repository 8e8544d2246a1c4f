"""AdaComp's per-layer picture: how many elements each compressed layer sends a step,
against its size and its slot (what the PS key carries), in one process (the store's
local transport runs the same codec and the same server-side decode).

    python bench/experiments/adacomp_layers.py --model cnn512 --epochs 1 --json out.json

One worker, so the gradients are the full batch's, not a shard's: the rates are
indicative of a distributed run, not equal to it.
"""
import argparse
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'gluon_scripts'))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--model', default='cnn512')
    p.add_argument('--epochs', type=int, default=1)
    p.add_argument('--batch-size', type=int, default=32)
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--params', default='{}', help='compression_params (JSON)')
    p.add_argument('--json')
    args = p.parse_args()

    import mxnet as mx
    from mxnet import autograd, gluon
    import kvstore_ext  # noqa: F401  registers dist_sync_adacomp
    from kvstore_ext.codecs import AdaCompCodec
    from kvstore_ext.codecs.base import innermost
    import train_mnist

    mx.random.seed(1)
    x, y, xt, yt = train_mnist.load_digits(False, 1)
    net = train_mnist.build_net(args.model)
    net.initialize(mx.init.Xavier())
    kv = mx.kv.create('dist_sync_adacomp')
    kv.set_gradient_compression(json.loads(args.params))
    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': args.lr, 'momentum': args.momentum},
                            kvstore=kv, update_on_kvstore=False)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    sent = {}
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(y))
        for start in range(0, len(y) - args.batch_size + 1, args.batch_size):
            idx = order[start:start + args.batch_size]
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
            loss.backward()
            trainer.step(args.batch_size)
            for key, state in kv._keys.items():
                if isinstance(innermost(state.codec), AdaCompCodec):
                    count = sum(float(cs.last['sent'].asscalar()) for cs in state.chunk_states)
                    sent.setdefault(key, []).append(count)
    acc = (net(mx.nd.array(xt)).argmax(axis=1).asnumpy() == yt).mean()
    rows = []
    for key, counts in sorted(sent.items()):
        state = kv._keys[key]
        chunks = [c.codec for c in state.chunks]
        size = state.codec.size
        capacity = sum(c.capacity for c in chunks)
        slot = sum(c.payload_words() for c in chunks)
        counts = np.array(counts)
        rows.append({'key': key, 'kind': 'conv' if len(state.shape) >= 3 else 'fc', 'shape': list(state.shape),
                     'bin': state.codec.bin, 'capacity': capacity,
                     'sent_mean': counts.mean(), 'sent_frac_mean': counts.mean() / size,
                     'steps_at_capacity': float((counts >= capacity).mean()),
                     'payload_ratio': size / (8 * len(chunks) + counts.mean()),
                     'slot_ratio': size / slot})
        r = rows[-1]
        print('key %-4s %-4s %-18s bin %4d  sent %8.1f (%.3f%%)  at capacity %3.0f%% of steps  '
              'raw/payload %6.1f  raw/slot %6.1f' % (
                  r['key'], r['kind'], tuple(r['shape']), r['bin'], r['sent_mean'],
                  100 * r['sent_frac_mean'], 100 * r['steps_at_capacity'],
                  r['payload_ratio'], r['slot_ratio']))
    print('test accuracy %.4f, comm_stats %s' % (acc, kv.comm_stats()))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'model': args.model, 'epochs': args.epochs, 'params': args.params,
                       'test_acc': float(acc), 'layers': rows,
                       'comm_stats': kv.comm_stats()}, f, indent=1)


if __name__ == '__main__':
    main()
