"""Time to accuracy: the MNIST CNN under every scheme, several seeds, on the emulated cluster.

For each seed and each scheme, one distributed job of gluon_scripts/train_mnist.py
(W workers, S servers) runs on the cluster of bench/netns.py (every node in its own
network namespace behind a shaped link; bench/cluster.py's harness places the nodes
through ``kvstore_ext.launch.in_namespaces``), or with ``--loopback`` on 127.0.0.1
(no root needed, but then every byte moves at memory speed). Every worker writes
``--summary-json``: test accuracy and wall time after each epoch.

Per scheme over the seeds: final test accuracy (mean +- std), the loss against
``dist_sync`` (MXNet, uncompressed) in points, wall time to reach ``--target``
accuracy, and total wall time (training + per-epoch evaluation, after start-up).

    python bench/accuracy.py --seeds 2 --epochs 8 --rate 200mbit --json bench/results/accuracy.json
    python bench/accuracy.py --loopback --schemes dist_sync dist_sync_hylo --seeds 1

Schemes are given as in bench/cluster.py: ``KVSTORE[:KEY=VALUE,...]`` (the values are
the scheme's compression_params). Seeds are interleaved (seed 1: every scheme, seed 2:
every scheme, ...) so that a change of the machine's load hits all schemes alike.

Wall time is only as good as the machine is idle: for each job the CPU time that
*other* programs used during it (``/proc/stat`` busy time minus our job's) is recorded
as ``others_cpu_share`` (fraction of all cores); runs above 0.25 are marked ``!``.
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cluster  # noqa: E402  (bench/cluster.py: scheme syntax, log capture, signals)
import netns    # noqa: E402

launch = cluster.launch          # kvstore_ext/launch.py, loaded by path (no mxnet import)
REPO = cluster.REPO
TRAIN = os.path.join(REPO, 'gluon_scripts', 'train_mnist.py')
DEFAULT_SCHEMES = ['dist_sync', 'dist_sync_none', 'dist_sync_hylo:aggregation=server',
                   'dist_sync_hylo:aggregation=homomorphic', 'dist_sync_2bit']
BASELINE = 'dist_sync'
TARGETS = (0.90, 0.95, 0.96, 0.97)     # times to these accuracies are kept in the JSON too
BUSY_SHARE = 0.25      # others used more than this share of all cores during a job: '!'
DEFAULT_PREFIX = 'kvxa'


# ------------------------------------------------------------------ pure parts

def parse_seeds(text):
    """'3' -> [1, 2, 3] (that many seeds); '7,11' -> [7, 11] (these seeds)."""
    text = str(text).strip()
    if ',' in text:
        seeds = [int(s) for s in text.split(',') if s.strip()]
    else:
        count = int(text)
        if count < 1:
            raise ValueError('--seeds: at least one seed')
        seeds = list(range(1, count + 1))
    if len(set(seeds)) != len(seeds):
        raise ValueError('--seeds: repeated seed in %r' % text)
    return seeds


def train_command(python, kvstore, params, seed, args, out_dir):
    """What each worker runs: train_mnist.py with the flags that gave parity."""
    return [python, TRAIN, '--kvstore', kvstore, '--compression-params', json.dumps(params),
            '--num-epochs', str(args.epochs), '--batch-size', str(args.batch_size),
            '--lr', repr(args.lr), '--lr-mode', args.lr_mode, '--seed', str(seed),
            '--log-interval', '0',
            '--summary-json', os.path.join(out_dir, 'worker-{rank}.json')]


def mean_std(values):
    """(mean, sample std) of a list; std 0 for one value; (None, None) for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run_curve(summaries):
    """One job's curve from its workers' summaries (synchronous training: every worker
    holds the same weights, so the accuracies agree; the wall time of an epoch is the
    slowest worker's)."""
    epochs = min(len(s['epochs']) for s in summaries)
    curve = []
    for e in range(epochs):
        accs = [s['epochs'][e]['test_acc'] for s in summaries]
        curve.append({'epoch': e + 1,
                      'test_acc': accs[0],
                      'test_acc_spread': max(accs) - min(accs),      # 0 if in sync
                      'wall_s': max(s['epochs'][e]['wall_time'] for s in summaries),
                      'epoch_s': max(s['epochs'][e]['epoch_time'] for s in summaries),
                      'train_s': max(s['epochs'][e]['train_time'] for s in summaries),
                      'train_loss': statistics.mean(s['epochs'][e]['train_loss']
                                                    for s in summaries)})
        if all('train_cpu' in s['epochs'][e] for s in summaries):
            # the workers' CPU while they trained (every thread of each), summed
            curve[-1]['train_cpu_s'] = sum(s['epochs'][e]['train_cpu'] for s in summaries)
    return curve


def time_to(curve, target):
    """Wall time at the end of the first epoch whose test accuracy >= target, or None."""
    for point in curve:
        if point['test_acc'] >= target:
            return point['wall_s']
    return None


def summarize_runs(runs, target, baseline=BASELINE):
    """Per scheme (in first-seen order): accuracy and time statistics over seeds."""
    order, by_scheme = [], {}
    for run in runs:
        if run['scheme'] not in by_scheme:
            order.append(run['scheme'])
            by_scheme[run['scheme']] = []
        by_scheme[run['scheme']].append(run)
    base_ok = {r['seed']: r for r in by_scheme.get(baseline, []) if not r.get('error')}
    base_mean = mean_std([r['final_acc'] for r in base_ok.values()])[0]
    rows = []
    for scheme in order:
        ok = [r for r in by_scheme[scheme] if not r.get('error')]
        row = {'scheme': scheme, 'kvstore': by_scheme[scheme][0]['kvstore'],
               'seeds': [r['seed'] for r in ok],
               'failed_seeds': [r['seed'] for r in by_scheme[scheme] if r.get('error')],
               'errors': sorted({r['error'].split(':')[0] for r in by_scheme[scheme]
                                 if r.get('error')})}
        if not ok:
            rows.append(row)
            continue
        acc_mean, acc_std = mean_std([r['final_acc'] for r in ok])
        reached = [r['time_to_target_s'] for r in ok if r['time_to_target_s'] is not None]
        paired = [base_ok[r['seed']]['final_acc'] - r['final_acc'] for r in ok
                  if r['seed'] in base_ok]
        epochs = min(len(r['curve']) for r in ok)
        times = {}
        for t in sorted(set(TARGETS) | {target}):
            got = [r['time_to_s'][str(t)] for r in ok
                   if r.get('time_to_s', {}).get(str(t)) is not None]
            times[str(t)] = {'reached': len(got), 'of': len(ok), 'mean_std': mean_std(got)}
        row.update({
            'time_to_s': times,
            'final_acc_mean': acc_mean, 'final_acc_std': acc_std,
            'final_accs': [r['final_acc'] for r in ok],
            # points (percent) below the baseline's mean final accuracy; < 0: better
            'loss_vs_baseline_points': (None if base_mean is None
                                        else 100 * (base_mean - acc_mean)),
            'loss_vs_baseline_paired_points': mean_std([100 * d for d in paired]),
            'target': target,
            'reached_target': len(reached),
            'time_to_target_s': mean_std(reached),
            'wall_s': mean_std([r['curve'][-1]['wall_s'] for r in ok]),
            'epoch_s': mean_std([r['curve'][-1]['wall_s'] / len(r['curve']) for r in ok]),
            'job_s': mean_std([r['job_s'] for r in ok]),
            'others_cpu_share_max': max(r['others_cpu_share'] for r in ok),
            'curve_mean': [{'epoch': e + 1,
                            'test_acc': mean_std([r['curve'][e]['test_acc'] for r in ok]),
                            'wall_s': mean_std([r['curve'][e]['wall_s'] for r in ok])}
                           for e in range(epochs)],
            'push_bytes_per_step': mean_std([r.get('push_bytes_per_step') for r in ok])[0],
            'pull_bytes_per_step': mean_std([r.get('pull_bytes_per_step') for r in ok])[0],
        })
        rows.append(row)
    return rows


def _pm(pair, fmt, scale=1.0):
    mean, std = pair if pair else (None, None)
    if mean is None:
        return '-'
    return (fmt + ' +- ' + fmt) % (scale * mean, scale * std)


def format_table(rows, target, baseline=BASELINE):
    head = '%-40s %5s %15s %11s %14s %13s %9s' % (
        'scheme', 'seeds', 'final acc %', 'loss pts', 'to %.1f%% s' % (100 * target),
        'total s', 's/epoch')
    lines = [head, '-' * len(head)]
    for r in rows:
        if 'final_acc_mean' not in r:
            lines.append('%-40s %s (seeds %s)' % (r['scheme'], '/'.join(r['errors']),
                                                  ','.join(map(str, r['failed_seeds']))))
            continue
        loss = r['loss_vs_baseline_points']
        reach = _pm(r['time_to_target_s'], '%.0f')
        if r['reached_target'] < len(r['seeds']):
            reach = '%s (%d/%d)' % (reach if r['reached_target'] else 'never',
                                    r['reached_target'], len(r['seeds']))
        lines.append('%-40s %5d %15s %11s %14s %13s %9s%s' % (
            r['scheme'], len(r['seeds']), _pm((r['final_acc_mean'], r['final_acc_std']),
                                               '%.2f', 100),
            '-' if loss is None else '%+.2f' % loss, reach, _pm(r['wall_s'], '%.0f'),
            '%.1f' % r['epoch_s'][0],
            ' !' if r['others_cpu_share_max'] > BUSY_SHARE else ''))
    lines.append('loss pts: %s mean final accuracy minus the scheme\'s, in points '
                 '(negative: better than %s); times: wall seconds of training and '
                 'evaluation after start-up, mean +- std over seeds' % (baseline, baseline))
    if any(r.get('others_cpu_share_max', 0) > BUSY_SHARE for r in rows):
        lines.append('!: other programs used > %d%% of the machine\'s cores during a run '
                     'of this scheme; its times are unreliable' % (100 * BUSY_SHARE))
    return '\n'.join(lines)


# ------------------------------------------------------------------ machine load

def cpu_busy_seconds():
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat)."""
    with open('/proc/stat') as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ticks = os.sysconf('SC_CLK_TCK')
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)       # idle + iowait
    total = sum(fields[:8])                                         # without guest
    return (total - idle) / ticks, total / ticks


def children_cpu_seconds():
    """CPU seconds (user + system) of our reaped children: the job's nodes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_info():
    info = {'platform': platform.platform(), 'python': platform.python_version(),
            'cpus': os.cpu_count()}
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    info['cpu'] = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    return info


# ------------------------------------------------------------------ running

def run_one(placement, args, scheme, seed, job_dir):
    """One training job; a run record (``error`` set on failure)."""
    label, kvstore, params = scheme
    out_dir = os.path.join(job_dir, 'results')
    specs = cluster.job_specs(
        args, train_command(sys.executable, kvstore, params, seed, args, out_dir), placement)
    load_before = os.getloadavg()[0]
    busy0, _ = cpu_busy_seconds()
    ours0 = children_cpu_seconds()
    started = time.monotonic()
    with cluster.Redirect(os.path.join(job_dir, 'job.log'), not args.verbose) as log:
        code = launch.run_job(specs, timeout=args.timeout)
    seconds = time.monotonic() - started
    busy = cpu_busy_seconds()[0] - busy0
    ours = children_cpu_seconds() - ours0
    run = {'scheme': label, 'kvstore': kvstore, 'compression_params': params, 'seed': seed,
           'exit_code': code, 'job_s': seconds, 'job_cpu_s': ours,
           'others_cpu_share': max(0.0, busy - ours) / (seconds * (os.cpu_count() or 1)),
           'loadavg_1min_before': load_before}
    summaries = cluster.worker_results(code, run, log, out_dir, args.workers)
    if summaries is None:
        return run
    curve = run_curve(summaries)
    run.update({'curve': curve, 'final_acc': curve[-1]['test_acc'],
                'time_to_target_s': time_to(curve, args.target),
                'time_to_s': {str(t): time_to(curve, t)
                              for t in sorted(set(TARGETS) | {args.target})},
                'samples_per_sec': statistics.mean(s['samples_per_sec'] for s in summaries)})
    stats = [s.get('comm_stats') for s in summaries]
    if all(stats):      # kvstore_ext types: bytes this worker pushed / pulled per step
        steps = [max(1, st['steps']) for st in stats]
        run['push_bytes_per_step'] = statistics.mean(
            st['push_bytes'] / n for st, n in zip(stats, steps))
        run['pull_bytes_per_step'] = statistics.mean(
            st['pull_bytes'] / n for st, n in zip(stats, steps))
        run['raw_bytes_per_step'] = statistics.mean(
            st['raw_bytes'] / n for st, n in zip(stats, steps))
    run['workers'] = [{k: s.get(k) for k in ('rank', 'final_test_acc', 'total_time',
                                             'comm_stats', 'samples_per_sec', 'epochs')}
                      for s in summaries]
    return run


def run_all(placement, args, plugin, out):
    for seed in args.seeds:
        for scheme in args.schemes:
            label, kvstore, _ = scheme
            if kvstore not in cluster.NATIVE_KVSTORES and (
                    not isinstance(plugin, set) or kvstore not in plugin):
                reason = plugin if isinstance(plugin, str) else 'not registered'
                out.append({'scheme': label, 'kvstore': kvstore, 'seed': seed,
                            'error': 'skipped: %s (%s)' % (kvstore, reason)})
                print('skipped %s: %s' % (label, reason), file=sys.stderr)
                continue
            job_dir = tempfile.mkdtemp(prefix='job-', dir=args.work_dir)
            print('seed %d: %s ...' % (seed, label), file=sys.stderr, flush=True)
            run = run_one(placement, args, scheme, seed, job_dir)
            if run.get('error'):
                print('  %s\n%s' % (run['error'], run['log_tail']), file=sys.stderr)
            else:
                tt = run['time_to_target_s']
                print('  final acc %.4f, %.0f s of training (job %.0f s), %.1f%% in %s, '
                      'others used %.0f%% of the cores'
                      % (run['final_acc'], run['curve'][-1]['wall_s'], run['job_s'],
                         100 * args.target, 'never' if tt is None else '%.0f s' % tt,
                         100 * run['others_cpu_share']), file=sys.stderr, flush=True)
            out.append(run)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--schemes', nargs='+', default=DEFAULT_SCHEMES,
                        help='KVSTORE[:KEY=VALUE,...] each (compression_params); '
                             'include dist_sync for the loss column')
    parser.add_argument('--seeds', default='3',
                        help='a count N (seeds 1..N) or a comma-separated list (default 3)')
    parser.add_argument('--epochs', type=int, default=8)
    parser.add_argument('--target', type=float, default=0.95,
                        help='test accuracy for "time to accuracy" (default %(default)s)')
    parser.add_argument('-n', '--workers', type=int, default=4)
    parser.add_argument('-s', '--servers', type=int, default=2)
    parser.add_argument('--rate', default='200mbit',
                        help='per link and direction, tc units (default %(default)s; '
                             'see docs/RESULTS.md for why)')
    parser.add_argument('--loopback', action='store_true',
                        help='no namespaces: every node on 127.0.0.1 (no root needed; '
                             'no bandwidth limit, so compression cannot show)')
    parser.add_argument('--batch-size', type=int, default=32, help='per worker')
    parser.add_argument('--lr', type=float, default=0.1)
    parser.add_argument('--lr-mode', default='cosine', choices=('cosine', 'step', 'constant'))
    parser.add_argument('--threads', type=int, default=1, help='OMP_NUM_THREADS per node')
    parser.add_argument('--timeout', type=float, default=900, help='seconds per job')
    parser.add_argument('--json', help='write the raw numbers and the summary here')
    parser.add_argument('--prefix', default=DEFAULT_PREFIX,
                        help='namespace prefix (default %(default)s; not bench/cluster.py\'s, '
                             'so both can run at once)')
    parser.add_argument('--subnet', default=netns.DEFAULT_SUBNET)
    parser.add_argument('--verbose', action='store_true', help='show the nodes\' output')
    args = parser.parse_args(argv)
    try:
        args.seeds = parse_seeds(args.seeds)
        args.schemes = [cluster.parse_scheme(s) for s in args.schemes]
        if not args.loopback:
            netns.parse_rate(args.rate)
    except ValueError as e:
        parser.error(str(e))
    if args.epochs < 1 or args.workers < 1 or args.servers < 1:
        parser.error('--epochs, --workers and --servers must be at least 1')
    if not args.loopback:
        reason = netns.available()
        if reason:
            parser.error('%s; or run with --loopback (no bandwidth limit)' % reason)
    return args


def main(argv=None):
    args = parse_args(argv)
    previous = cluster.catch_stop_signals()
    runs, interrupted = [], None
    args.work_dir = tempfile.mkdtemp(prefix='kvx-accuracy-')
    net = None if args.loopback else netns.Cluster(args.workers, args.servers, args.prefix,
                                                   args.subnet)
    started = time.time()
    try:
        needs_plugin = any(k not in cluster.NATIVE_KVSTORES for _, k, _ in args.schemes)
        plugin = cluster.plugin_kvstores(sys.executable) if needs_plugin else set()
        placement = None
        if net is not None:
            net.create()
            if net.stale:
                print('removed stale namespaces: %s' % ' '.join(net.stale), file=sys.stderr)
            net.shape(netns.parse_rate(args.rate))
            placement = net.placement
        run_all(placement, args, plugin, runs)
    except (KeyboardInterrupt, cluster.Interrupted) as e:
        interrupted = str(e) or 'SIGINT'
        print('interrupted (%s): cleaning up' % interrupted, file=sys.stderr)
    except Exception:
        traceback.print_exc()
        runs.append({'scheme': '-', 'kvstore': '-', 'seed': None,
                     'error': 'FAILED: harness error (traceback above)'})
    finally:
        def cleanup():
            if net is not None:
                net.destroy()
            shutil.rmtree(args.work_dir, ignore_errors=True)
        cluster.clean_up_uninterrupted(previous, cleanup)
    done = [r for r in runs if r.get('scheme') != '-']
    summary = summarize_runs(done, args.target)
    where = ('loopback' if args.loopback else '%s links' % args.rate)
    print('MNIST CNN, %d workers, %d servers, %s, %d epochs, seeds %s'
          % (args.workers, args.servers, where, args.epochs,
             ','.join(map(str, args.seeds))))
    print(format_table(summary, args.target))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != 'work_dir'}
        config['train_command'] = train_command('python', '<kvstore>', {}, '<seed>', args,
                                                '<out>')[1:]
        with open(args.json, 'w') as f:
            json.dump({'config': config, 'machine': machine_info(),
                       'started': time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started)),
                       'elapsed_s': time.time() - started, 'interrupted': interrupted,
                       'summary': summary, 'runs': runs}, f, indent=1)
    if interrupted:
        return 130
    return 1 if any(str(r.get('error', '')).startswith('FAILED') for r in runs) else 0


if __name__ == '__main__':
    sys.exit(main())
