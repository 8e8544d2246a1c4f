"""How much of each large FC gradient is exactly zero, and what that does to Hylo's FC
threshold ``t = fc_scale * mean|acc|``.

An FC weight's gradient is ``delta^T x`` over the batch: a column is zero when its input
is zero on every example of the batch (a blank border pixel of a digit; a ReLU unit of
the layer below that is silent for the whole batch), a row when its unit's delta is. Those
entries count in ``mean|acc|`` (a border pixel's stay zero in ``acc`` too: its residual
never grows; this tool measures the gradient, not ``acc``). So the same
``fc_scale`` gives a layer with half its inputs blank half the threshold, relative to its
live values, of a layer with none (an MLP on raw pixels against LeNet's tanh features).
This tool trains one process (no kvstore, plain momentum SGD, one worker's batch) and
prints, for every FC weight with at least ``size_threshold`` elements, at a few steps:
the share of zero entries, ``mean|g| over the nonzero / mean|g|``, and the share of
entries at or above 2 and 3 times ``mean|g|`` (what Hylo sends at ``fc_scale`` 2 and 3).
docs/decisions/hylo-fc-scale.md reads it.

    python bench/experiments/fc_zeros.py --models mlp lenet cnn512 --out bench/results/fc_zeros.txt
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'gluon_scripts'))


def layer_rows(model, steps, report_at, batch, lr, momentum, seed, size_threshold):
    """One line a (step in report_at, large FC weight) of the one-process run."""
    import mxnet as mx
    from mxnet import autograd, gluon
    import train_mnist
    xtr, ytr, _, _ = train_mnist.load_digits(False, seed)
    mx.random.seed(seed)
    rng = np.random.default_rng(seed)
    net = train_mnist.build_net(model)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': lr, 'momentum': momentum})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rows = []
    for step in range(steps):
        i = int(rng.integers(0, len(xtr) - batch))
        x, y = mx.nd.array(xtr[i:i + batch]), mx.nd.array(ytr[i:i + batch])
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if step in report_at:
            for p in net.collect_params().values():
                if p.grad_req == 'null' or len(p.shape) != 2 or \
                        int(np.prod(p.shape)) < size_threshold:
                    continue
                g = np.abs(p.grad().asnumpy())
                live = g[g > 0]
                mean = g.mean()
                rows.append('%-7s %4d  %-16s %-12s %9.3f %14.2f %8.3f %8.3f' % (
                    model, step, p.name, 'x'.join(map(str, p.shape)), 1 - live.size / g.size,
                    live.mean() / mean if live.size else float('nan'),
                    (g >= 2 * mean).mean(), (g >= 3 * mean).mean()))
        trainer.step(batch)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--models', nargs='+', default=['mlp', 'lenet', 'cnn512'])
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--report-at', default='0,10,39', help='steps to report, comma-separated')
    ap.add_argument('--batch-size', type=int, default=32, help="one worker's batch")
    ap.add_argument('--lr', type=float, default=0.05)
    ap.add_argument('--momentum', type=float, default=0.9)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--size-threshold', type=int, default=32768,
                    help="Hylo's: smaller tensors go uncompressed")
    ap.add_argument('--out', help='also write the table to this file')
    args = ap.parse_args(argv)
    report_at = {int(s) for s in args.report_at.split(',')}
    lines = ['model   step  layer            shape        zero share  mean_nz/mean  >=2mean  >=3mean']
    for model in args.models:
        lines += layer_rows(model, args.steps, report_at, args.batch_size, args.lr,
                            args.momentum, args.seed, args.size_threshold)
    text = '\n'.join(lines)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')


if __name__ == '__main__':
    main()
