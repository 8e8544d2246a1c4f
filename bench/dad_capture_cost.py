"""What dAD's capture costs a training step, before anything is sent: one process's
forward and backward pass of a Gluon network with and without ``kvstore_ext.dad.attach``,
no kvstore.

Why: ``dist_sync_dad`` on loopback used about the CPU of ``dist_sync`` and still took
longer a step, so the question is where the worker waits. The capture sits between each
Dense layer's FullyConnected and its activation, either as a Python ``CustomOp`` (MXNet
runs it on its custom-operator thread, which takes the GIL, in every forward and every
backward pass, and the operators after it wait meanwhile) or as the plugin's operator
``kvx_dad_capture`` (``attach(capture=...)``).

Three copies of the same network (same weights, same batch) are timed in turn, block
after block: the plain one, then the one attached with each capture, each block
``steps`` passes ending in a ``waitall``; a ratio is the median over blocks of the ratio
within a block, so a change of machine load between blocks cancels. Also per pass
(median over blocks): the forward alone, and when the first attached Dense layer's
weight gradient is ready after the backward starts (what ``dist_sync_dad``'s step waits
for before it can send that layer).

    python bench/dad_capture_cost.py [--model cnn512] [--batch 32] [--blocks 15]
                                     [--steps 10] [--json PATH]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'gluon_scripts'))


CAPTURES = ('python', 'plugin')


def build(model, mx, capture, seed):
    import train_mnist
    import kvstore_ext.dad as dad
    mx.random.seed(seed)
    net = train_mnist.build_net(model)
    net.initialize(mx.init.Xavier())
    if capture:
        dad.attach(net, capture=capture)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def one_block(net, x, y, loss_fn, steps, mx, autograd, dense):
    """Seconds of ``steps`` passes, then medians of (forward, dense gradient ready)."""
    import kvstore_ext.dad as dad
    forward, ready = [], []
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.wait_to_read()
        t1 = time.perf_counter()
        loss.backward()
        dense.grad().wait_to_read()
        t2 = time.perf_counter()
        mx.nd.waitall()
        for layer in dad.layers():       # what the kvstore would take at its push
            layer.take()
        forward.append(t1 - t0)
        ready.append(t2 - t1)
    return time.perf_counter() - start, statistics.median(forward), statistics.median(ready)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='cnn512')
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--blocks', type=int, default=15)
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--json', help='write the results here')
    args = parser.parse_args()
    import mxnet as mx
    from mxnet import autograd, gluon
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.random((args.batch, 1, 28, 28), dtype=np.float32))
    y = mx.nd.array(rng.integers(0, 10, args.batch))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    nets = {'plain': build(args.model, mx, None, 1)}
    nets.update((capture, build(args.model, mx, capture, 1)) for capture in CAPTURES)
    dense = {}
    for name, net in nets.items():
        net(x).wait_to_read()                       # shapes known, graphs built
        weights = [p for p in net.collect_params().values() if len(p.shape) == 2]
        dense[name] = weights[0]                    # the first Dense weight
    blocks = {name: [] for name in nets}
    for _ in range(args.blocks + 1):                # the first block warms up
        for name, net in nets.items():
            blocks[name].append(one_block(net, x, y, loss_fn, args.steps, mx, autograd,
                                          dense[name]))
    for name in blocks:
        del blocks[name][0]
    ratios = {capture: statistics.median(a[0] / p[0] for p, a in zip(blocks['plain'],
                                                                     blocks[capture]))
              for capture in CAPTURES}
    result = {'model': args.model, 'batch': args.batch, 'blocks': args.blocks,
              'steps': args.steps, 'ratios': ratios,
              'machine': {'platform': platform.platform(), 'cpus': os.cpu_count(),
                          'omp_num_threads': os.environ.get('OMP_NUM_THREADS')}}
    for name, rows in blocks.items():
        result[name] = {
            'pass_ms': 1e3 * statistics.median(r[0] for r in rows) / args.steps,
            'forward_ms': 1e3 * statistics.median(r[1] for r in rows),
            'dense_grad_ready_ms': 1e3 * statistics.median(r[2] for r in rows)}
    for name in blocks:
        r = result[name]
        print('%-9s pass %.2f ms (forward %.2f, first Dense weight gradient ready %.2f ms '
              'into the backward)' % (name, r['pass_ms'], r['forward_ms'],
                                      r['dense_grad_ready_ms']))
    for capture in CAPTURES:
        print('%s capture / plain: %.3f (median over %d blocks of %d passes)'
              % (capture, ratios[capture], args.blocks, args.steps))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
