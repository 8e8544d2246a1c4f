"""Compression schemes on an emulated cluster: step time, bytes on the links, comm share.

Every node (scheduler, servers, workers) runs in its own network namespace behind a
shaped link (bench/netns.py); kvstore_ext's launcher places the nodes there. For each
link rate, model and scheme the harness runs one job of bench/cluster_worker.py and
reports, per worker and step:

* step time: the median of the timed steps (after warm-up) of all workers;
* compute time: the median of compute-only steps (same worker, same model, no
  kvstore), interleaved with the timed steps, so that all workers compute at once
  and both see the same background load; ``comm share = 1 - compute / step``: the
  part of the step that communication (with its encoding and waiting) adds;
* bytes on the links: the worker's interface counters (rx + tx of its ``eth0``,
  read by the worker around the timed steps), next to ``kv.comm_stats()``
  (push_bytes + pull_bytes) of kvstore_ext's types; MXNet's own have no comm_stats;
* with ``policy='auto'``: the link rate it agreed on and its choice per key (``policy``).

    python bench/cluster.py --workers 2 --servers 1 --rate 100mbit \\
        --models vgg resnet --rate-multipliers 1,4 --json out.json

Needs root. Namespaces are named ``PREFIX-...``: stale ones (of a killed run) are
removed at start, and all of ours, with every process in them, at the end, also on
failure, Ctrl-C, SIGTERM or SIGHUP.
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns  # noqa: E402

REPO = os.path.dirname(HERE)
WORKER = os.path.join(HERE, 'cluster_worker.py')
LAUNCH = os.path.join(REPO, 'kvstore_ext', 'launch.py')
NATIVE_KVSTORES = ('dist_sync', 'dist_async', 'dist_sync_device', 'dist_device_sync')
DEFAULT_SCHEMES = ['dist_sync', 'dist_sync_none', 'dist_sync_hylo:aggregation=server',
                   'dist_sync_hylo:aggregation=homomorphic', 'dist_sync_2bit',
                   'dist_sync:type=2bit,threshold=0.5']    # MXNet's own 2-bit
BUSY_RATIO = 1.25     # compute wall / CPU time above this: the workers waited for a core
STOP_CODES = {128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP}


def load_launch():
    """kvstore_ext/launch.py by path: the package's __init__ would import mxnet."""
    spec = importlib.util.spec_from_file_location('kvstore_ext_launch', LAUNCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


launch = load_launch()


# ------------------------------------------------------------------ pure parts

def parse_scheme(text):
    """'dist_sync_hylo:aggregation=homomorphic,size_threshold=1000'
    -> ('dist_sync_hylo(aggregation=homomorphic,size_threshold=1000)',
        'dist_sync_hylo', {'aggregation': 'homomorphic', 'size_threshold': 1000})."""
    kvstore, _, rest = text.partition(':')
    params = {}
    for pair in filter(None, rest.split(',')):
        key, sep, value = pair.partition('=')
        if not sep or not key:
            raise ValueError('scheme %r: parameters are KEY=VALUE,...' % text)
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    label = kvstore + ('(%s)' % rest if rest else '')
    return label, kvstore, params


def split_list(values):
    """['vgg,resnet', 'x'] -> ['vgg', 'resnet', 'x']."""
    return [v for item in values for v in item.split(',') if v]


def worker_command(python, model, kvstore, params, args, out_dir):
    argv = [python, WORKER, '--model', model, '--kvstore', kvstore,
            '--compression-params', json.dumps(params), '--batch-size', str(args.batch_size),
            '--steps', str(args.steps), '--warmup', str(args.warmup), '--out-dir', out_dir]
    if args.crash_worker is not None:
        argv += ['--crash-worker', str(args.crash_worker)]
    return argv


def median(values):
    return statistics.median(values) if values else None


def policy_of(workers):
    """policy='auto''s decisions (rate, choice per key: the same on every worker) with
    each worker's own fit of the rate (``rate_fits``, by launch id); None for other
    kvstores."""
    found = [w.get('policy') for w in workers]
    if not all(found):
        return None
    return dict({k: v for k, v in found[0].items() if k != 'rate_fit'},
                rate_fits=[f['rate_fit'] for f in found])


def summarize(workers, before, after):
    """One run's row from the workers' JSON results and the cluster's counters."""
    steps = len(workers[0]['step_s'])

    def pooled(key):            # median over every worker's steps
        return median([t for w in workers for t in w[key]])

    def per_step(bytes_of):     # mean over workers, per timed step
        return statistics.mean(bytes_of(w) / steps for w in workers)

    step, compute, compute_cpu = pooled('step_s'), pooled('compute_step_s'), \
        pooled('compute_cpu_s')
    link = per_step(lambda w: w['link_rx_bytes'] + w['link_tx_bytes'])
    comm = None
    if all(w['comm_stats'] for w in workers):
        comm = per_step(lambda w: w['comm_stats']['push_bytes'] + w['comm_stats']['pull_bytes'])
    return {
        'parameters': workers[0]['parameters'],
        'gradient_bytes': workers[0]['gradient_bytes'],
        'steps': steps,
        'step_s': step,
        'compute_s': compute,
        'comm_share': max(0.0, 1.0 - compute / step),
        'step_cpu_s': pooled('step_cpu_s'),
        'compute_cpu_s': compute_cpu,
        # well above 1: compute-only steps waited for a core (other load on the machine)
        'compute_wall_over_cpu': compute / max(1e-9, compute_cpu),
        'link_bytes_per_step': link,                      # per worker: rx + tx
        'link_tx_bytes_per_step': per_step(lambda w: w['link_tx_bytes']),
        'link_rx_bytes_per_step': per_step(lambda w: w['link_rx_bytes']),
        'comm_stats_bytes_per_step': comm,                # per worker: push + pull
        'link_over_comm_stats': link / comm if comm else None,
        'policy': policy_of(workers),                     # policy='auto' only
        'job_link_bytes': {                               # whole job, each node's eth0
            name: {'rx': after[name]['node'][0] - before[name]['node'][0],
                   'tx': after[name]['node'][1] - before[name]['node'][1]}
            for name in after},
        'workers': workers,
    }


def format_table(rows):
    """The human-readable table; speed-up is against dist_sync at the same model/rate."""
    base = {(r['rate'], r['model']): r['step_s'] for r in rows
            if r.get('kvstore') == 'dist_sync' and not r.get('compression_params')
            and r.get('step_s')}
    head = ('%-8s %-7s %-42s %8s %8s %6s %10s %10s %6s %7s'
            % ('rate', 'model', 'scheme', 'step ms', 'comp ms', 'comm%', 'link MB',
               'stats MB', 'l/s', 'speedup'))
    lines = [head, '-' * len(head)]
    for r in rows:
        lead = '%-8s %-7s %-42s' % (r['rate'], r['model'], r['scheme'])
        if r.get('error'):
            lines.append('%s %s' % (lead, r['error']))
            continue
        b = base.get((r['rate'], r['model']))
        comm = r['comm_stats_bytes_per_step']
        busy = r['compute_wall_over_cpu'] > BUSY_RATIO
        lines.append('%s %8.0f %8.0f %6.0f %10.2f %10s %6s %7s%s' % (
            lead, 1e3 * r['step_s'], 1e3 * r['compute_s'], 100 * r['comm_share'],
            r['link_bytes_per_step'] / 1e6, '-' if comm is None else '%.2f' % (comm / 1e6),
            '-' if comm is None else '%.3f' % r['link_over_comm_stats'],
            '-' if b is None else '%.2fx' % (b / r['step_s']), ' !' if busy else ''))
    lines.append('link MB / stats MB: per worker and step, rx+tx on its link / '
                 'comm_stats push+pull; comm% = 1 - compute/step')
    if any(r.get('compute_wall_over_cpu', 0) > BUSY_RATIO for r in rows):
        lines.append('!: compute-only steps took > %.2fx their CPU time: other load on '
                     'the machine; timings unreliable' % BUSY_RATIO)
    return '\n'.join(lines)


# ------------------------------------------------------------------ running

class Interrupted(Exception):
    pass


def _raise_interrupted(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def catch_stop_signals():
    """SIGTERM/SIGHUP raise Interrupted (like Ctrl-C), so a harness cleans up; returns
    the handlers to give to ``clean_up_uninterrupted``."""
    return {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}


def clean_up_uninterrupted(previous, cleanup):
    """Run ``cleanup`` with stop signals ignored (a second Ctrl-C must not leave
    namespaces or processes behind), then restore the handlers."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    try:
        cleanup()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for s, handler in previous.items():
            signal.signal(s, handler)


def plugin_kvstores(python):
    """kvstore types kvstore_ext registers in ``python`` (set), or the import error."""
    code = 'import kvstore_ext; print(" ".join(kvstore_ext.kvstore_types()))'
    done = subprocess.run([python, '-c', code], capture_output=True, text=True,
                          cwd=tempfile.gettempdir(), timeout=120)
    if done.returncode:
        return (done.stderr.strip().splitlines() or ['import failed'])[-1]
    return set(done.stdout.split())


class Redirect:
    """Node output (the launcher forwards it to sys.stdout/stderr) into a log file."""

    def __init__(self, path, enabled):
        self.path, self.enabled = path, enabled

    def __enter__(self):
        if self.enabled:
            self.saved = sys.stdout, sys.stderr
            self.file = open(self.path, 'w')
            sys.stdout = sys.stderr = self.file
        return self

    def __exit__(self, *exc):
        if self.enabled:
            sys.stdout, sys.stderr = self.saved
            self.file.close()

    def tail(self, lines=30):
        if not self.enabled:
            return ''
        with open(self.path, errors='replace') as f:
            return ''.join(f.readlines()[-lines:])


def job_specs(args, command, placement):
    """Launcher specs of one job: workers run ``command``, scheduler and servers
    ``import mxnet``; each node in its namespace when ``placement`` is given.
    Shared with bench/accuracy.py."""
    python = sys.executable
    specs = launch.local_nodes(args.workers, args.servers, command,
                               [python, '-c', 'import mxnet'], launch.free_port(),
                               {'OMP_NUM_THREADS': str(args.threads)})
    return launch.in_namespaces(specs, placement) if placement is not None else specs


def run_one(cluster, args, model, scheme, job_dir):
    """One job on the cluster as it is shaped now; a row (``error`` set on failure)."""
    label, kvstore, params = scheme
    out_dir = os.path.join(job_dir, 'results')
    specs = job_specs(args, worker_command(sys.executable, model, kvstore, params, args,
                                           out_dir), cluster.placement)
    before = cluster.counters()
    load_before = os.getloadavg()[0]     # others' load on the machine skews timings
    started = time.monotonic()
    with Redirect(os.path.join(job_dir, 'job.log'), not args.verbose) as log:
        code = launch.run_job(specs, timeout=args.timeout)
    seconds = time.monotonic() - started
    row = {'model': model, 'scheme': label, 'kvstore': kvstore,
           'compression_params': params, 'exit_code': code, 'job_s': seconds,
           'loadavg_1min_before': load_before}
    workers = worker_results(code, row, log, out_dir, args.workers)
    if workers is not None:
        row.update(summarize(workers, before, cluster.counters()))
    return row


def worker_results(code, row, log, out_dir, count):
    """The JSON each worker wrote (worker-N.json), or None with row['error'] set.

    Shared with bench/accuracy.py. Raises Interrupted when the launcher stopped the job
    because we were asked to stop (Ctrl-C/SIGTERM/SIGHUP)."""
    if code in STOP_CODES:
        raise Interrupted('job stopped by a signal (exit %d)' % code)
    if code != 0:
        row['error'] = 'FAILED: job exited %d' % code
        row['log_tail'] = log.tail()
        return None
    results = []
    for i in range(count):
        try:
            with open(os.path.join(out_dir, 'worker-%d.json' % i)) as f:
                results.append(json.load(f))
        except (OSError, ValueError) as e:
            row['error'] = 'FAILED: no result from worker %d (%s)' % (i, e)
            row['log_tail'] = log.tail()
            return None
    return results


def run_all(cluster, args, schemes, plugin, out):
    """Every (rate multiplier, model, scheme) job; rows are appended to ``out``."""
    base_rate = netns.parse_rate(args.rate)
    delay = netns.parse_delay(args.delay)
    for multiplier in args.rate_multipliers:
        rate = base_rate * multiplier
        cluster.shape(rate, delay)
        for model in args.models:
            for scheme in schemes:
                label, kvstore, _ = scheme
                row_id = {'rate': netns.format_rate(rate), 'rate_bps': rate,
                          'rate_multiplier': multiplier, 'model': model, 'scheme': label}
                if kvstore not in NATIVE_KVSTORES and (
                        not isinstance(plugin, set) or kvstore not in plugin):
                    reason = plugin if isinstance(plugin, str) else 'not registered'
                    out.append(dict(row_id, kvstore=kvstore,
                                    error='skipped: %s (%s)' % (kvstore, reason)))
                    print('skipped %s: %s' % (label, reason), file=sys.stderr)
                    continue
                job_dir = tempfile.mkdtemp(prefix='job-', dir=args.work_dir)
                print('running %s %s at %s ...' % (model, label, row_id['rate']),
                      file=sys.stderr, flush=True)
                row = dict(row_id, **run_one(cluster, args, model, scheme, job_dir))
                if row.get('error'):
                    print('  %s\n%s' % (row['error'], row['log_tail']), file=sys.stderr)
                else:
                    print('  step %.0f ms, comm %.0f%%' % (1e3 * row['step_s'],
                                                          100 * row['comm_share']),
                          file=sys.stderr)
                out.append(row)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('-n', '--workers', type=int, default=2)
    parser.add_argument('-s', '--servers', type=int, default=1)
    parser.add_argument('--rate', default='100mbit',
                        help='per link and direction, tc units (default %(default)s); '
                             '"none": unshaped (the veth\'s own speed)')
    parser.add_argument('--rate-multipliers', default='1',
                        type=lambda s: [float(x) for x in s.split(',')],
                        help='also run at these multiples of --rate, e.g. 1,4')
    parser.add_argument('--delay', default='0ms',
                        help='one-way node-to-node delay (netem; needs sch_netem)')
    parser.add_argument('--models', nargs='+', default=['vgg', 'resnet'],
                        help='vgg (FC-heavy), resnet (conv-heavy), or gluoncv model-zoo names '
                        '(resnet50_v1, vgg16: 224x224 images)')
    parser.add_argument('--schemes', nargs='+', default=DEFAULT_SCHEMES,
                        help='KVSTORE[:KEY=VALUE,...] each (compression_params)')
    parser.add_argument('--kvstore', help='a single scheme instead of --schemes')
    parser.add_argument('--compression-params', default='{}', type=json.loads,
                        help='JSON dict for --kvstore')
    parser.add_argument('--steps', type=int, default=20,
                        help='timed steps (each followed by a compute-only step)')
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--batch-size', type=int, default=32, help='per worker')
    parser.add_argument('--threads', type=int, default=1, help='OMP_NUM_THREADS per node')
    parser.add_argument('--timeout', type=float, default=600, help='seconds per job')
    parser.add_argument('--json', help='write the raw numbers here')
    parser.add_argument('--prefix', default=netns.DEFAULT_PREFIX, help='namespace prefix')
    parser.add_argument('--subnet', default=netns.DEFAULT_SUBNET)
    parser.add_argument('--verbose', action='store_true', help='show the nodes\' output')
    parser.add_argument('--crash-worker', type=int, help=argparse.SUPPRESS)  # tests
    args = parser.parse_args(argv)
    args.models = split_list(args.models)
    try:
        netns.parse_rate(args.rate)
        netns.parse_delay(args.delay)
        args.schemes = [parse_scheme(s) for s in args.schemes]
    except ValueError as e:
        parser.error(str(e))
    if args.kvstore:
        params = args.compression_params
        label = args.kvstore + ('(%s)' % json.dumps(params, separators=(',', ':'))
                                if params else '')
        args.schemes = [(label, args.kvstore, params)]
    reason = netns.available()
    if reason:
        parser.error(reason)
    return args


def main(argv=None):
    args = parse_args(argv)
    previous = catch_stop_signals()
    rows, interrupted = [], None
    args.work_dir = tempfile.mkdtemp(prefix='kvx-cluster-')
    cluster = netns.Cluster(args.workers, args.servers, args.prefix, args.subnet)
    try:
        needs_plugin = any(k not in NATIVE_KVSTORES for _, k, _ in args.schemes)
        plugin = plugin_kvstores(sys.executable) if needs_plugin else set()
        cluster.create()
        if cluster.stale:
            print('removed stale namespaces: %s' % ' '.join(cluster.stale), file=sys.stderr)
        run_all(cluster, args, args.schemes, plugin, rows)
    except (KeyboardInterrupt, Interrupted) as e:
        interrupted = str(e) or 'SIGINT'
        print('interrupted (%s): cleaning up' % interrupted, file=sys.stderr)
    except Exception:           # a bug or a broken machine: still report what we have
        traceback.print_exc()
        rows.append({'rate': '-', 'model': '-', 'scheme': '-',
                     'error': 'FAILED: harness error (traceback above)'})
    finally:
        def cleanup():
            cluster.destroy()
            shutil.rmtree(args.work_dir, ignore_errors=True)
        clean_up_uninterrupted(previous, cleanup)
    print(format_table(rows))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k not in ('work_dir',)}
        with open(args.json, 'w') as f:
            json.dump({'config': config, 'interrupted': interrupted, 'runs': rows}, f,
                      indent=1)
    if interrupted:
        return 130
    return 1 if any(r.get('error', '').startswith('FAILED') for r in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
