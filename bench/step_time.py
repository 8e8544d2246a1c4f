"""Time per step of the kvstore alone (no model compute), per kvstore type, on loopback.

Each worker pushpulls random gradients of a real model's shapes, key by key as
Gluon's Trainer does, and the median step time over many steps is reported, so the
plugin's own overhead shows against MXNet's native ``dist_sync`` (target: the plugin
with no compression, ``dist_sync_none``, at most 10% slower). One run, one table.
Next to it, the CPU time a step costs all workers and all servers together (user +
system, every thread; median over rounds): on a machine with fewer cores than nodes
that, not the latency, is what a step's wall time follows.

    python bench/step_time.py [--workers 2 --servers 1 --steps 50 --model mnist_cnn]
        [--kvstores dist_sync dist_sync_none dist_sync_hylo:aggregation=homomorphic ...]
        [--rounds 3] [--json out.json]

Kvstores are given as in bench/cluster.py: ``KVSTORE[:KEY=VALUE,...]``. With
``--rounds R`` the whole list runs R times in turn and each kvstore's steps are pooled,
so that a change of the machine's load hits all kvstores alike.

To compare two versions of the code in one run, give the other version's interpreter
(a venv where it is installed) a name and suffix a kvstore with it:

    python bench/step_time.py --python old=/tmp/old/.venv/bin/python \
        --kvstores dist_sync dist_sync_hylo@old dist_sync_hylo --rounds 3
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args):
    """Runs inside each worker: time ``args.steps`` steps, write rank 0's numbers."""
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    from kvstore_ext.transport_calibrate import job_cpu_seconds
    sys.path.insert(0, HERE)
    from wire_bytes import model_shapes
    shapes = list(model_shapes(args.model).values())
    kv = mx.kv.create(args.kvstore)
    params = json.loads(args.compression_params)
    if params:
        kv.set_gradient_compression(params)
    rng = np.random.default_rng(kv.rank)
    grads = [mx.nd.array(rng.standard_normal(s).astype(np.float32) * 1e-2) for s in shapes]
    outs = [mx.nd.zeros(s) for s in shapes]
    for i, g in enumerate(grads):
        kv.broadcast(i, mx.nd.zeros(g.shape), outs[i])
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup and kv.rank == 0:
            cpu_before = job_cpu_seconds()
        mx.nd.waitall()
        start = time.perf_counter()
        for i, g in enumerate(grads):
            kv.pushpull(i, g, out=outs[i])
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    if kv.rank == 0:        # rank 0 reads every node's CPU time
        cpu = {role: (seconds - cpu_before.get(role, 0.0)) / args.steps
               for role, seconds in job_cpu_seconds().items()}
        with open(args.out, 'w') as f:
            json.dump({'times': times[args.warmup:], 'cpu_s_per_step': cpu,
                       'stats': kv.comm_stats() if hasattr(kv, 'comm_stats') else None}, f)


def run(kvstore, params, args, python=sys.executable):
    out = tempfile.mktemp(suffix='.json')
    cmd = [python, '-m', 'kvstore_ext.launch', '-n', str(args.workers), '-s',
           str(args.servers), '--timeout', '600', python, os.path.abspath(__file__),
           '--worker', '--kvstore', kvstore, '--compression-params', params,
           '--model', args.model, '--steps', str(args.steps), '--warmup', str(args.warmup),
           '--out', out]
    # run from the version's own tree (<tree>/.venv/bin/python), so that what
    # ``-m kvstore_ext.launch`` and the nodes import is that version's code
    tree = None
    if python != sys.executable:
        tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(python))))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tree)
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--out', help=argparse.SUPPRESS)
    p.add_argument('--kvstore', default='dist_sync', help=argparse.SUPPRESS)
    p.add_argument('--compression-params', default='{}', help=argparse.SUPPRESS)
    p.add_argument('--kvstores', nargs='+', metavar='KVSTORE[:KEY=VALUE,...]',
                   default=['dist_sync', 'dist_sync_none', 'dist_sync_hylo:aggregation=server',
                            'dist_sync_hylo:aggregation=homomorphic', 'dist_sync_2bit'])
    p.add_argument('--rounds', type=int, default=1, help='times the list runs, in turn')
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--servers', type=int, default=1)
    p.add_argument('--model', default='mnist_cnn')
    p.add_argument('--steps', type=int, default=50)
    p.add_argument('--warmup', type=int, default=5)
    p.add_argument('--json', default=None)
    p.add_argument('--python', nargs='*', default=[], metavar='NAME=PATH',
                   help='interpreters of other code versions; KVSTORE@NAME runs with one')
    args = p.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, HERE)
    from cluster import parse_scheme
    pythons = dict(item.split('=', 1) for item in args.python)
    schemes, interpreters = [], {}
    for spec in args.kvstores:
        spec, _, version = spec.partition('@')
        label, kvstore, params = parse_scheme(spec)
        label += '@' + version if version else ''
        schemes.append((label, kvstore, params))
        interpreters[label] = pythons[version] if version else sys.executable
    times, stats, cpu = {}, {}, {}
    for _ in range(args.rounds):
        for label, kvstore, params in schemes:
            result = run(kvstore, json.dumps(params), args, interpreters[label])
            times.setdefault(label, []).extend(result['times'])
            stats[label] = result['stats']
            cpu.setdefault(label, []).append(result['cpu_s_per_step'])
    rows = [{'kvstore': label, 'median_step_s': float(np.median(times[label])),
             'p90_step_s': float(np.percentile(times[label], 90)), 'stats': stats[label],
             'cpu_s_per_step': {role: float(np.median([c.get(role, 0.0) for c in cpu[label]]))
                                for role in ('worker', 'server', 'scheduler')}}
            for label, _, _ in schemes]
    base = rows[0]['median_step_s']
    print('%d workers, %d servers, model %s, %d steps x %d rounds' % (
        args.workers, args.servers, args.model, args.steps, args.rounds))
    for r in rows:
        c = r['cpu_s_per_step']
        print('%-44s median %6.2f ms  p90 %6.2f ms  x%.2f of %s   CPU a step: workers '
              '%5.2f ms, servers %5.2f ms' % (
                  r['kvstore'], 1e3 * r['median_step_s'], 1e3 * r['p90_step_s'],
                  r['median_step_s'] / base, rows[0]['kvstore'], 1e3 * c['worker'],
                  1e3 * c['server']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'workers': args.workers, 'servers': args.servers, 'model': args.model,
                       'steps': args.steps, 'rounds': args.rounds, 'rows': rows}, f, indent=1)


if __name__ == '__main__':
    main()
