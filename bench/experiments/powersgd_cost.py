"""Is PowerSGD's arithmetic hot? The worker-side cost of a step, without the network.

In one process (rank 0 of 1: every codec runs, the rounds are free), each kvstore
pushpulls random gradients of a bundled MNIST model's parameters, key by key as Gluon's
Trainer does; the median time of a step over ``--steps`` steps, per kvstore, and, for
PowerSGD, per compressed tensor. ``dist_sync_none`` is the floor (float32 as it is),
``dist_sync_fp16`` an element-wise codec for scale. Each engine runs in a child process
with OMP_NUM_THREADS=1, as bench/promise.py runs every node (its default ``--threads
1``): MXNet's threaded engine (what training uses) and the NaiveEngine (every op on the
calling thread: the arithmetic alone, without the hand-offs between threads, which a
loaded machine makes slow). The load average is recorded: other jobs inflate times.

    python bench/experiments/powersgd_cost.py --models cnn512 mlp \\
        --json bench/results/powersgd_cost.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), 'gluon_scripts'))

KVSTORES = ('dist_sync_none', 'dist_sync_fp16', 'dist_sync_powersgd')


def model_shapes(model):
    import mxnet as mx
    import train_mnist
    net = train_mnist.build_net(model)
    net.initialize()
    net(mx.nd.zeros((1, 1, 28, 28)))
    return {p.name: p.shape for p in net.collect_params().values() if p.grad_req != 'null'}


def step_times(kvstore, shapes, steps, warmup=5):
    """Medians over steps of one step over all keys, in wall and in CPU seconds (this
    process, every thread: what a loaded machine does not inflate), and wall per key."""
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(kvstore)
    rng = np.random.default_rng(0)
    grads = {k: mx.nd.array(rng.standard_normal(s).astype(np.float32) * 1e-2)
             for k, s in shapes.items()}
    wall, cpu, per_key = [], [], {k: [] for k in shapes}
    for step in range(warmup + steps):
        mx.nd.waitall()
        start, start_cpu = time.perf_counter(), time.process_time()
        for k, g in grads.items():
            t = time.perf_counter()
            kv.pushpull(k, g)
            g.wait_to_read()
            per_key[k].append(time.perf_counter() - t)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {'wall_ms': 1e3 * float(np.median(wall[warmup:])),
            'cpu_ms': 1e3 * float(np.median(cpu[warmup:])),
            'per_key_wall_ms': {k: 1e3 * float(np.median(v[warmup:]))
                                for k, v in per_key.items()},
            'codecs': {k: kv.plan(k).codec.describe() for k in shapes}}


ENGINES = ('ThreadedEnginePerDevice', 'NaiveEngine')


def measure(args):
    """In this process (its engine set by the parent): {model: {kvstore: times}}."""
    return {model: {kvstore: step_times(kvstore, model_shapes(model), args.steps)
                    for kvstore in KVSTORES} for model in args.models}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--models', nargs='+', default=['cnn512', 'mlp'])
    p.add_argument('--steps', type=int, default=50)
    p.add_argument('--json', default=None)
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        json.dump(measure(args), sys.stdout)
        return
    out = {'steps': args.steps, 'omp_num_threads': 1, 'engines': {}}
    for engine in ENGINES:
        env = dict(os.environ, OMP_NUM_THREADS='1', MXNET_ENGINE_TYPE=engine)
        load = os.getloadavg()[0]
        child = subprocess.run([sys.executable, os.path.abspath(__file__), '--child',
                                '--steps', str(args.steps), '--models'] + args.models,
                               env=env, check=True, capture_output=True, text=True)
        models = json.loads(child.stdout)
        out['engines'][engine] = {'load_average_1min': load, 'models': models}
        print('%s (load average %.1f on %d cores)' % (engine, load, os.cpu_count()))
        for model, rows in models.items():
            for kvstore, row in rows.items():
                print('  %-8s %-20s %7.2f ms a step (CPU %.2f ms)'
                      % (model, kvstore, row['wall_ms'], row['cpu_ms']))
            psgd = rows['dist_sync_powersgd']
            for k, desc in psgd['codecs'].items():
                if desc.startswith('powersgd'):
                    print('     %-24s %-34s %6.2f ms' % (k, desc, psgd['per_key_wall_ms'][k]))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=1)


if __name__ == '__main__':
    main()
