"""Measure the CPU that moving float32 keys costs, for the cost model's transport term.

Why: the cost model's wire time is bytes over the link's rate, but moving a byte also
costs CPU at both ends: ps-lite's and ZeroMQ's copies, the kernel's TCP stack, the
server's float32 additions, MXNet's engine and Python per key. On a fast link (or with
many nodes sharing a host's cores) that CPU, not the link, sets the step time; the
validation on the emulated cluster under-predicted its fast links by tens of ms a step
for this reason (docs/COST_MODEL.md). This measures it apart from any validation job:
a 1-worker, 1-server job over loopback TCP (as the emulated cluster's nodes talk: TCP,
not Unix sockets) pushes and pulls plain float32 keys with MXNet's own ``dist_sync``
(no codec), in phases of a few key sizes, and reads the CPU seconds (user + system,
every thread) of each node from /proc between phases. A least-squares fit per role
of each phase's median over ``--runs`` jobs gives seconds per byte moved (pushed +
pulled) and per key:

    worker CPU a step = worker_per_key x keys + worker_per_byte x (P + Q)
    server CPU a step = server_per_key x keys x W + server_per_byte x (I_s + O_s)

    python -m kvstore_ext.transport_calibrate --json bench/results/transport_cpu.json

CPU seconds, not wall time: other programs on the machine slow a job's wall time but
add little to its own CPU seconds (caches and frequency aside). The fit is checked by
its residuals, printed and stored.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# (keys, float32 elements a key): many small keys (per-key cost) to few large ones
# (per-byte cost); every key below MXNet's bigarray bound (10^6), so one server holds it
PHASES = [(256, 256), (64, 4096), (16, 65536), (4, 1000000)]
STEPS = 60
WARMUP = 3
RUNS = 3


def job_cpu_seconds():
    """{role: CPU seconds (user + system, all threads) so far} of this job's nodes (the
    processes whose environment has this process's DMLC_PS_ROOT_PORT), from /proc."""
    port = ('DMLC_PS_ROOT_PORT=%s' % os.environ.get('DMLC_PS_ROOT_PORT')).encode()
    tick = os.sysconf('SC_CLK_TCK')
    totals = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open('/proc/%s/environ' % pid, 'rb') as f:
                env = f.read().split(b'\0')
            with open('/proc/%s/stat' % pid) as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:             # gone, or not ours to read
            continue
        role = [e[len(b'DMLC_ROLE='):].decode() for e in env if e.startswith(b'DMLC_ROLE=')]
        if role and port in env:
            totals[role[0]] = totals.get(role[0], 0.0) + \
                (int(fields[11]) + int(fields[12])) / tick
    return totals


def worker(out, steps, warmup):
    """Inside the job's one worker: each phase's CPU seconds a step, per role."""
    import mxnet as mx
    import numpy as np
    kv = mx.kv.create('dist_sync')
    rows = []
    base = 0
    for keys, elements in PHASES:
        names = list(range(base, base + keys))
        base += keys
        values = [mx.nd.ones((elements,)) for _ in names]
        outs = [mx.nd.zeros((elements,)) for _ in names]
        kv.init(names, values)
        for step in range(warmup + steps):
            if step == warmup:
                mx.nd.waitall()
                before, wall = job_cpu_seconds(), time.perf_counter()
            for name, value, result in zip(names, values, outs):
                kv.push(name, value)
                kv.pull(name, out=result)
            mx.nd.waitall()
        after, wall = job_cpu_seconds(), time.perf_counter() - wall
        assert np.allclose(outs[-1].asnumpy()[:4], 1.0)     # the sum of one worker
        rows.append({'keys': keys, 'elements': elements,
                     'bytes_moved': 2 * 4 * keys * elements,    # pushed + pulled
                     'wall_s': wall / steps,
                     'cpu_s': {role: (after.get(role, 0.0) - before.get(role, 0.0)) / steps
                               for role in after}})
    with open(out, 'w') as f:
        json.dump(rows, f)


def fit(rows, role):
    """(seconds per key, seconds per byte moved) of ``role`` by least squares over the
    phases, each held >= 0; and each phase's relative residual."""
    import numpy as np
    a = np.array([[r['keys'], r['bytes_moved']] for r in rows], dtype=float)
    y = np.array([r['cpu_s'].get(role, 0.0) for r in rows])
    scale = a.max(axis=0)
    coef = np.linalg.lstsq(a / scale, y, rcond=None)[0] / scale
    if coef[0] < 0:             # a negative cost is noise: fit the other alone
        coef = np.array([0.0, float(a[:, 1] @ y / (a[:, 1] @ a[:, 1]))])
    if coef[1] < 0:
        coef = np.array([float(a[:, 0] @ y / (a[:, 0] @ a[:, 0])), 0.0])
    residual = [(float(p) - t) / t if t else None for p, t in zip(a @ coef, y)]
    return float(coef[0]), float(coef[1]), residual


def run_job(python, steps, warmup, timeout):
    """One job's phases: [{'keys', 'elements', 'bytes_moved', 'wall_s', 'cpu_s'}]."""
    with tempfile.TemporaryDirectory(prefix='kvx-transport-') as tmp:
        out = os.path.join(tmp, 'rows.json')
        cmd = [python, '-m', 'kvstore_ext.launch', '-n', '1', '-s', '1', '--transport',
               'tcp', '--timeout', str(timeout), python, '-m',
               'kvstore_ext.transport_calibrate', '--worker', '--out', out,
               '--steps', str(steps), '--warmup', str(warmup)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=timeout + 60)
        with open(out) as f:
            return json.load(f)


def calibrate(python=sys.executable, steps=STEPS, warmup=WARMUP, timeout=300, runs=RUNS):
    """Run the job ``runs`` times and fit each phase's median CPU seconds: the dict
    stored in --json (cost.TransportCPU reads its four constants)."""
    import statistics
    jobs = [run_job(python, steps, warmup, timeout) for _ in range(runs)]
    rows = [dict(phase, cpu_s={role: statistics.median(job[i]['cpu_s'].get(role, 0.0)
                                                        for job in jobs)
                               for role in ('worker', 'server', 'scheduler')},
                 wall_s=statistics.median(job[i]['wall_s'] for job in jobs))
            for i, phase in enumerate(jobs[0])]
    worker_key, worker_byte, worker_res = fit(rows, 'worker')
    server_key, server_byte, server_res = fit(rows, 'server')
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {'source': 'kvstore_ext.transport_calibrate: 1 worker, 1 server, loopback TCP, '
                      'MXNet dist_sync float32 keys, %d steps a phase, median of %d jobs'
                      % (steps, runs),
            'worker_s_per_key': worker_key, 'worker_s_per_byte': worker_byte,
            'server_s_per_key': server_key, 'server_s_per_byte': server_byte,
            'host_cores': os.cpu_count(), 'loadavg_1min': load,
            'phases': rows, 'fit_residual': {'worker': worker_res, 'server': server_res},
            'jobs': jobs}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--json', help='write the result here (default: print it)')
    parser.add_argument('--steps', type=int, default=STEPS)
    parser.add_argument('--warmup', type=int, default=WARMUP)
    parser.add_argument('--runs', type=int, default=RUNS,
                        help='jobs; each phase\'s median CPU is fitted (%(default)s)')
    parser.add_argument('--timeout', type=float, default=300, help='seconds a job')
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--out', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.out, args.steps, args.warmup)
    for flag, value in (('--steps', args.steps), ('--runs', args.runs)):
        if value < 1:
            parser.error('%s must be >= 1, got %d' % (flag, value))
    result = calibrate(steps=args.steps, warmup=args.warmup, timeout=args.timeout,
                       runs=args.runs)
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, 'w') as f:
            f.write(text + '\n')
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
