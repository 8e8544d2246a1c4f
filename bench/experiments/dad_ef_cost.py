"""What rank-dAD's error feedback costs a worker: the kvstore's part of a training step,
without the network.

In one process (rank 0 of 1: every codec runs, the rounds are free; 'rankdad' re-factorises
in the one-process transport as a server would), a bundled MNIST model with
``kvstore_ext.dad.attach`` runs forward and backward on a random batch of 32, then
``Trainer.allreduce_grads`` on ``dist_sync_dad`` with each configuration. The median over
``--steps`` steps of the allreduce, in wall and CPU seconds (this process, every thread),
and of forward + backward for scale. OMP_NUM_THREADS=1, as bench/promise.py runs every
node; the load average is recorded (other jobs inflate wall times; CPU time less so).

    OMP_NUM_THREADS=1 python bench/experiments/dad_ef_cost.py --models mlp cnn512 \\
        --json bench/results/dad_ef_cost.json
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), 'gluon_scripts'))

CONFIGS = [('dad', {}), ('oneway', {'method': 'oneway', 'error_feedback': 0}),
           ('oneway, error feedback', {'method': 'oneway', 'error_feedback': 1}),
           ('rankdad', {'method': 'rankdad', 'error_feedback': 0}),
           ('rankdad, error feedback', {'method': 'rankdad', 'error_feedback': 1})]


def step_times(model, params, steps, warmup=5, batch=32):
    import mxnet as mx
    from mxnet import autograd, gluon
    import kvstore_ext  # noqa: F401
    import kvstore_ext.dad
    import train_mnist
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression(params)
    mx.random.seed(1)
    net = train_mnist.build_net(model)
    net.initialize(mx.init.Xavier())
    kvstore_ext.dad.attach(net)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01},
                            kvstore=kv, update_on_kvstore=False)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.random((batch, 1, 28, 28)).astype(np.float32))
    y = mx.nd.array(rng.integers(0, 10, batch).astype(np.float32))
    backward, wall, cpu = [], [], []
    for _ in range(warmup + steps):
        mx.nd.waitall()
        t = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        mx.nd.waitall()
        backward.append(time.perf_counter() - t)
        start, start_cpu = time.perf_counter(), time.process_time()
        trainer.allreduce_grads()
        mx.nd.waitall()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        trainer.update(batch)
    med = lambda v: 1e3 * float(np.median(v[warmup:]))  # noqa: E731
    return {'allreduce_wall_ms': med(wall), 'allreduce_cpu_ms': med(cpu),
            'forward_backward_wall_ms': med(backward),
            'codecs': sorted(d for d in kv.codec_plan().values()
                             if d and not d.startswith(('float32', 'hylo', 'fp32')))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', nargs='+', default=['mlp', 'cnn512'])
    p.add_argument('--steps', type=int, default=40)
    p.add_argument('--json', default=None)
    args = p.parse_args()
    out = {'steps': args.steps, 'omp_num_threads': os.environ.get('OMP_NUM_THREADS'),
           'load_average_1min_before': os.getloadavg()[0], 'models': {}}
    for model in args.models:
        rows = out['models'][model] = {}
        for label, params in CONFIGS:
            rows[label] = row = step_times(model, params, args.steps)
            print('%-7s %-24s allreduce %6.2f ms (CPU %6.2f ms), forward+backward %6.2f ms'
                  % (model, label, row['allreduce_wall_ms'], row['allreduce_cpu_ms'],
                     row['forward_backward_wall_ms']), flush=True)
    out['load_average_1min_after'] = os.getloadavg()[0]
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=1)


if __name__ == '__main__':
    main()
