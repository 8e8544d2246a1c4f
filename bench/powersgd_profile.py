"""Where a training step's time goes inside the workers of a loopback job, per kvstore.

The codec's arithmetic, the store's Python and the waits for rounds are measured
inside the workers of a real job.

Why: ``dist_sync_powersgd`` cost 1.35-1.51x ``dist_sync``'s training time on the short
cnn512 run (bench/torch_ddp.py) while its arithmetic, timed alone in one process, is a
few milliseconds a step (bench/experiments/powersgd_cost.py). Only timers inside the
job's workers say where the rest goes. The machine is shared and loaded, so this
reports CPU seconds (which other processes do not inflate) and shares within one run,
not wall-clock step times; it is a profile, not a benchmark.

Each kvstore runs ``gluon_scripts/train_mnist.py`` through ``python -m
kvstore_ext.launch`` (4 workers, 2 servers, cnn512, batch 32, OMP_NUM_THREADS=1, as
bench/torch_ddp.py), each worker wrapped by this script (``--worker``), which times,
per training step after the first ``--skip`` steps:

* the step (``_sum_and_update`` to the next: wall, the worker's CPU, all threads, and
  the Python thread's own CPU); MXNet's engine threads (forward, backward, the codecs'
  operators) get the difference of the two CPUs;
* ``allreduce``: Trainer.allreduce_grads, the kvstore's calls for every key (for
  kvstore_ext: the store's Python, the codecs' Python, and any wait inside them);
* ``sync``: after allreduce_grads, until the step's sum is read (the loop's finite
  check): waiting for the rounds the store left in flight and the update;
* for kvstore_ext stores: ``codec`` (the codecs' step bodies between rounds),
  ``exchange`` (the transport's pushes and pulls of compressed rounds), ``plain``
  (float32 keys through MXNet's pushpull), ``check_finite`` (the whole-gradient NaN
  check a key runs before its first round where its codec needs one: it waits for the
  key's backward pass; PowerSGD's keys run none, codecs/powersgd.py).
  The ``wait`` columns are wall minus the Python thread's CPU of those calls.

The job's CPU (scheduler, servers and workers, from the launcher's children) is
reported too, and split by role: each scheduler and server node runs under a wrapper
(``--node``) that writes its own CPU (all threads, from start-up to exit) when it
ends, so the workers' share is the job's less theirs. Per step, that is each role's
CPU over the steps a worker ran (start-up included: compare kvstores, not absolutes). With ``--naive``, MXNet runs every operator on the calling thread
(MXNET_ENGINE_TYPE=NaiveEngine): ``codec`` CPU is then the codec's arithmetic itself
(threaded, it is the Python that dispatches it).

``--ops`` instead runs no job: one process pushpulls random gradients of cnn512's
shapes through the kvstore (rank 0 of 1: the codecs run, the rounds are free) and
prints MXNet's operator profile (aggregate statistics), which splits the codec's
arithmetic by operator.

    python bench/powersgd_profile.py --epochs 1 --kvstores dist_sync dist_sync_fp16 \\
        dist_sync_powersgd
    python bench/powersgd_profile.py --ops --kvstores dist_sync_powersgd
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TRAIN = os.path.join(REPO, 'gluon_scripts', 'train_mnist.py')
KVSTORES = ('dist_sync', 'dist_sync_fp16', 'dist_sync_powersgd')
TIMERS = ('allreduce', 'sync', 'codec', 'exchange', 'plain', 'check_finite')


# -- inside a worker -------------------------------------------------------------------

class Timers:
    """Per step: {name: [calls, Python-thread CPU s, wall s]} and the step's totals."""

    def __init__(self):
        self.steps = []
        self.current = None
        self.started = None

    def start_step(self):
        now = (time.perf_counter(), time.process_time(), time.thread_time())
        if self.started is not None:
            self.current['step'] = [1, now[2] - self.started[2], now[0] - self.started[0],
                                    now[1] - self.started[1]]
            self.steps.append(self.current)
        self.current, self.started = {}, now

    def add(self, name, cpu, wall):
        if self.current is None:
            return
        entry = self.current.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += cpu
        entry[2] += wall

    def wrap(self, owner, attr, name):
        inner = getattr(owner, attr)
        timers = self

        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                timers.add(name, time.thread_time() - cpu, time.perf_counter() - wall)
        setattr(owner, attr, timed)


def instrument(timers):
    """Wrap the calls the module docstring lists (kvstore_ext's only if importable)."""
    from mxnet import gluon
    sys.path.insert(0, os.path.join(REPO, 'gluon_scripts'))
    from training import loop
    timers.wrap(gluon.Trainer, 'allreduce_grads', 'allreduce')
    inner_sum_and_update = loop._sum_and_update

    def sum_and_update(trainer, params, batch_size):
        timers.start_step()
        original = trainer.allreduce_grads
        marks = {}

        def allreduce():
            original()
            marks['after'] = (time.perf_counter(), time.thread_time())
        trainer.allreduce_grads = allreduce
        try:
            return inner_sum_and_update(trainer, params, batch_size)
        finally:
            del trainer.allreduce_grads
            if 'after' in marks:
                timers.add('sync', time.thread_time() - marks['after'][1],
                           time.perf_counter() - marks['after'][0])
    loop._sum_and_update = sum_and_update

    from kvstore_ext import policy, rounds, void_steps
    from kvstore_ext.transport import ps
    timers.wrap(rounds, '_advance', 'codec')
    timers.wrap(ps.PSTransport, 'exchange', 'exchange')
    timers.wrap(policy, 'pushpull_plain', 'plain')
    timers.wrap(void_steps, 'check_finite', 'check_finite')


def worker(out_dir, skip, argv):
    import runpy
    timers = Timers()
    instrument(timers)
    rank = os.environ.get('DMLC_WORKER_ID', '0')

    def dump():     # the last step is left out: it runs into the evaluation
        steps = timers.steps[skip:]
        total = {}
        for step in steps:
            for name, (calls, cpu, wall, *process) in step.items():
                t = total.setdefault(name, [0, 0.0, 0.0, 0.0])
                t[0] += calls
                t[1] += cpu
                t[2] += wall
                t[3] += process[0] if process else 0.0
        with open(os.path.join(out_dir, 'worker-%s.json' % rank), 'w') as f:
            json.dump({'steps': len(steps), 'totals': total}, f)
    sys.argv = [TRAIN] + list(argv)
    try:
        runpy.run_path(TRAIN, run_name='__main__')
    finally:
        dump()


def node(out_dir):
    """A scheduler or server: MXNet's own (started by ``import mxnet``), then its CPU."""
    import atexit
    import resource

    def dump():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        name = '%s-%d.json' % (os.environ.get('DMLC_ROLE', 'node'), os.getpid())
        with open(os.path.join(out_dir, name), 'w') as f:
            json.dump({'role': os.environ.get('DMLC_ROLE'),
                       'cpu_s': usage.ru_utime + usage.ru_stime}, f)
    atexit.register(dump)
    import mxnet  # noqa: F401  (serves until the job ends, then exits)


def node_cpu(out_dir):
    """{role: CPU seconds summed over that role's nodes} of the non-worker nodes."""
    cpu = {}
    for name in os.listdir(out_dir):
        if name.startswith(('server-', 'scheduler-')):
            with open(os.path.join(out_dir, name)) as f:
                row = json.load(f)
            cpu[row['role']] = cpu.get(row['role'], 0.0) + row['cpu_s']
    return cpu


# -- one process: the operators -------------------------------------------------------

def operator_profile(kvstore, steps=50, json_path=None):
    """MXNet's aggregate operator table of ``steps`` pushpulls of cnn512's keys; with
    ``json_path``, each operator's calls and milliseconds a step are added to that file
    under the kvstore's name."""
    import numpy as np
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    sys.path.insert(0, os.path.join(REPO, 'gluon_scripts'))
    import train_mnist
    net = train_mnist.build_net('cnn512')
    net.initialize()
    net(mx.nd.zeros((1, 1, 28, 28)))
    rng = np.random.default_rng(0)
    grads = {p.name: mx.nd.array(rng.standard_normal(p.shape).astype(np.float32) * 1e-2)
             for p in net.collect_params().values()}
    kv = mx.kv.create(kvstore)

    def run(count):
        for _ in range(count):
            for key, grad in grads.items():
                kv.pushpull(key, grad)
            mx.nd.waitall()
    run(5)
    mx.profiler.set_config(profile_imperative=True, aggregate_stats=True,
                           filename=os.path.join(tempfile.gettempdir(), 'kvx_ops.json'))
    mx.profiler.set_state('run')
    run(steps)
    mx.profiler.set_state('stop')
    print('%s, %d steps of cnn512\'s keys in one process:' % (kvstore, steps))
    print(mx.profiler.dumps(format='table', sort_by='total'))
    if json_path:
        stats = json.loads(mx.profiler.dumps(format='json'))['Time']['operator']
        ops = {name: {'calls_per_step': v['Count'] / steps,
                      'ms_per_step': v['Total'] / steps}
               for name, v in stats.items()}
        results = {}
        if os.path.exists(json_path):
            with open(json_path) as f:
                results = json.load(f)
        results.setdefault('steps', steps)
        results.setdefault('runs', {})[kvstore] = {
            'operators': ops, 'operator_ms_per_step': sum(o['ms_per_step'] for o in ops.values())}
        with open(json_path, 'w') as f:
            json.dump(results, f, indent=1)


# -- the driver ------------------------------------------------------------------------

def run_job(kvstore, args, out_dir):
    """One job; (the job's CPU seconds, wall seconds, exit code)."""
    env = dict(os.environ, OMP_NUM_THREADS='1')
    if args.naive:
        env['MXNET_ENGINE_TYPE'] = 'NaiveEngine'
    from cluster import parse_scheme     # dist_sync_fp16:aggregation=server
    _, name, params = parse_scheme(kvstore)
    train = ['--model', 'cnn512', '--kvstore', name, '--batch-size', '32',
             '--compression-params', json.dumps(params), '--lr', '0.05',
             '--momentum', '0.9', '--lr-mode', 'constant', '--num-epochs', str(args.epochs),
             '--seed', '1', '--log-interval', '0']
    node = '%s %s --node %s' % (sys.executable, os.path.abspath(__file__), out_dir)
    cmd = [sys.executable, '-m', 'kvstore_ext.launch', '-n', '4', '-s', '2', '--timeout',
           str(args.timeout), '--server-command', node, '--', sys.executable, os.path.abspath(__file__), '--worker',
           out_dir, '--skip', str(args.skip), '--'] + train
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(os.path.join(out_dir, 'job.log'), 'w') as log:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=args.timeout + 60).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, time.monotonic() - started, code


def summarise(out_dir, workers=4):
    """Mean over workers of each timer, per step, in ms: calls, CPU, wall, wait."""
    rows = []
    for w in range(workers):
        with open(os.path.join(out_dir, 'worker-%d.json' % w)) as f:
            rows.append(json.load(f))
    steps = sum(r['steps'] for r in rows)
    out = {'steps_per_worker': steps / workers}
    names = sorted({n for r in rows for n in r['totals']})
    for name in names:
        calls, cpu, wall, process = (sum(r['totals'].get(name, [0, 0, 0, 0])[i] for r in rows)
                                     for i in range(4))
        entry = {'calls': calls / steps, 'cpu_ms': 1e3 * cpu / steps,
                 'wall_ms': 1e3 * wall / steps, 'wait_ms': 1e3 * (wall - cpu) / steps}
        if name == 'step':
            entry['process_cpu_ms'] = 1e3 * process / steps
            entry['engine_cpu_ms'] = 1e3 * (process - cpu) / steps
        out[name] = entry
    return out


def report(kvstore, summary, job_cpu, job_wall):
    step = summary['step']
    print('%s: %d steps a worker (after the first ones), job CPU %.1f s in %.1f s'
          % (kvstore, summary['steps_per_worker'], job_cpu, job_wall))
    roles = summary.get('role_cpu_s')
    if roles:
        print('  CPU by role: ' + ', '.join('%s %.1f s' % kv for kv in sorted(roles.items())))
    print('  step: wall %.1f ms, worker CPU %.1f ms (Python thread %.1f, engine threads %.1f)'
          % (step['wall_ms'], step['process_cpu_ms'], step['cpu_ms'], step['engine_cpu_ms']))
    for name in TIMERS:
        t = summary.get(name)
        if t:
            print('  %-13s %5.1f calls  CPU %6.2f ms  wall %7.2f ms  wait %7.2f ms  '
                  '(%4.1f%% of the step\'s wall)' % (name, t['calls'], t['cpu_ms'],
                                                     t['wall_ms'], t['wait_ms'],
                                                     100 * t['wall_ms'] / step['wall_ms']))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--kvstores', nargs='+', default=list(KVSTORES),
                   help='kvstore types, each with its parameters if any: '
                        'dist_sync_fp16:aggregation=server,error_feedback=1')
    p.add_argument('--epochs', type=int, default=1,
                   help='epochs of 31 steps (a step that spans an evaluation counts it)')
    p.add_argument('--skip', type=int, default=3, help='first steps not counted')
    p.add_argument('--naive', action='store_true',
                   help='NaiveEngine: every operator on the calling thread')
    p.add_argument('--timeout', type=float, default=900.0, help='seconds per job')
    p.add_argument('--json', help='write the summaries here (with --ops: each operator\'s '
                   'milliseconds a step, added to the file per kvstore)')
    p.add_argument('--ops', action='store_true',
                   help='no job: the operator profile of each kvstore in one process')
    p.add_argument('--worker', metavar='DIR', help=argparse.SUPPRESS)
    p.add_argument('--node', metavar='DIR', help=argparse.SUPPRESS)
    args, rest = p.parse_known_args()
    if args.node:
        node(args.node)
        return
    if args.worker:
        worker(args.worker, args.skip, rest[1:] if rest[:1] == ['--'] else rest)
        return
    if args.ops:
        for kvstore in args.kvstores:
            env = dict(os.environ, OMP_NUM_THREADS='1')
            if args.naive:
                env['MXNET_ENGINE_TYPE'] = 'NaiveEngine'
            subprocess.run([sys.executable, '-c', 'import sys; sys.path.insert(0, %r); '
                            'import powersgd_profile as p; p.operator_profile(%r, 50, %r)'
                            % (HERE, kvstore, args.json and os.path.abspath(args.json))],
                           env=env, check=True)
        return
    results = {'load_average_1min_before': os.getloadavg()[0], 'cores': os.cpu_count(),
               'naive': args.naive, 'runs': {}}
    for kvstore in args.kvstores:
        with tempfile.TemporaryDirectory(prefix='powersgd-profile-') as out_dir:
            job_cpu, job_wall, code = run_job(kvstore, args, out_dir)
            if code != 0:
                with open(os.path.join(out_dir, 'job.log')) as f:
                    print(f.read()[-3000:])
                sys.exit('%s: job exited %d' % (kvstore, code))
            summary = summarise(out_dir)
            roles = node_cpu(out_dir)
        roles['worker'] = job_cpu - sum(roles.values())
        summary.update(job_cpu_s=job_cpu, job_wall_s=job_wall, role_cpu_s=roles)
        results['runs'][kvstore] = summary
        report(kvstore, summary, job_cpu, job_wall)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)


if __name__ == '__main__':
    main()
