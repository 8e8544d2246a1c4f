"""Accuracy at equal epochs, by default: kvstore specs x models x worker counts x
schedules x seeds, on loopback, with the bytes each scheme sends.

Every job is one distributed run of gluon_scripts/train_mnist.py (``--model``) through
kvstore_ext's launcher on 127.0.0.1 (bench/cluster.py's ``job_specs`` and the
launcher's ``run_job``, which stops every node on failure, timeout or Ctrl-C). Each
worker writes ``--summary-json``; a run keeps the final test accuracy, the bytes per
step (raw float32, pushed, pulled; kvstore_ext types count them, MXNet's own send
raw float32) and the wall time.

Schedules: ``short`` = ``--short-epochs`` epochs at constant lr; ``long`` =
``--long-epochs`` epochs with ``--long-lr-mode`` (cosine by default). The optimiser is
SGD with ``--lr``, ``--momentum``, ``--batch-size`` a worker (defaults: 0.05, 0.9,
32, the accuracy matrix's settings).

Per (model, workers, schedule) the table shows, per spec over the seeds: final test
accuracy mean +- std, the paired difference to the baseline (``dist_sync``, same seed:
baseline minus spec, in points, mean +- std), a verdict on "within ``--margin`` points"
(0.5, Hylo's promise; 1 for the other schemes) from the one-sided 95% t-bound of
the paired differences (``ok``: the upper bound is below the margin; ``WORSE``: the lower
bound is above it; ``?``: the seeds cannot tell), the compression ratios raw/push and
raw/pull, wall seconds (training + evaluation), the seconds of the training steps alone
(``train s``: the slowest worker's, summed over epochs) and their ratio to the
baseline's, paired by seed (``/base``: jobs run seed-major, so a seed's runs are
neighbours in time and share the machine's load; read it only from sweeps on an idle
machine, no ``!``).

    python bench/promise.py --specs dist_sync dist_sync_hylo:aggregation=server \\
        dist_sync_hylo:aggregation=homomorphic --models cnn512 --workers 4 \\
        --schedules short --seeds 3 --json /tmp/promise_repro.json

Specs are ``KVSTORE[:KEY=VALUE,...]`` as in bench/cluster.py (values: compression
params). The training script gives a scheme with a ``momentum`` parameter its SGD
momentum unless the spec sets it: ``dist_sync_hylo`` runs with Hylo's momentum
correction, ``dist_sync_hylo:momentum=0`` without (as every run made before that). Jobs run seed-major (seed 1: every configuration and spec, then seed 2, ...),
so a change of the machine's load hits every spec alike. With ``--json`` the file is
rewritten after every job, and runs already in it are not run again (``--rerun`` runs
them anyway): an interrupted sweep continues where it stopped. ``--report [MORE_JSON ...]``
only prints the tables of the runs in ``--json`` and in the other files named (a run in
two files is an error); ``--report --matrix`` prints one line per configuration and spec
instead, with the paired loss's bound and how many seeds would show it within the margin
if its mean and spread held (a '?' that more seeds would settle, or one they never would).
"""
import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import accuracy  # noqa: E402  (bench/accuracy.py: seeds, curves, mean/std, machine load)
import cluster   # noqa: E402  (bench/cluster.py: specs, job specs, log capture, signals)

launch = cluster.launch
TRAIN = os.path.join(cluster.REPO, 'gluon_scripts', 'train_mnist.py')
BASELINE = 'dist_sync'
MARGIN = 0.5           # points
# one-sided 95% Student t quantiles by degrees of freedom
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
       9: 1.833, 10: 1.812, 15: 1.753, 20: 1.725, 30: 1.697, 60: 1.671, 120: 1.658}


def t95(df):
    if df in T95:
        return T95[df]
    return T95[max(k for k in T95 if k <= df)] if df > 1 else T95[1]


def schedule_flags(name, args):
    if name == 'short':
        return ['--num-epochs', str(args.short_epochs), '--lr-mode', 'constant']
    if name == 'long':
        flags = ['--num-epochs', str(args.long_epochs), '--lr-mode', args.long_lr_mode]
        if args.long_lr_mode == 'step':
            flags += ['--lr-steps', args.long_lr_steps]
        return flags
    raise ValueError('unknown schedule %r (short, long)' % name)


def train_command(python, kvstore, params, model, schedule, seed, args, out_dir):
    return ([python, TRAIN, '--model', model, '--kvstore', kvstore,
             '--compression-params', json.dumps(params), '--batch-size',
             str(args.batch_size), '--lr', repr(args.lr), '--momentum', repr(args.momentum),
             '--seed', str(seed), '--log-interval', '0',
             '--summary-json', os.path.join(out_dir, 'worker-{rank}.json')]
            + schedule_flags(schedule, args) + list(args.extra))


def run_key(run):
    return (run['spec'], run['model'], run['workers'], run['schedule'], run['seed'])


def run_one(args, spec, model, workers, schedule, seed, job_dir):
    """One job; a run record (``error`` set on failure). The launcher stops every node
    when one fails or the timeout passes."""
    label, kvstore, params = spec
    out_dir = os.path.join(job_dir, 'results')
    job_args = argparse.Namespace(workers=workers, servers=args.servers,
                                  threads=args.threads)
    specs = cluster.job_specs(job_args, train_command(sys.executable, kvstore, params, model,
                                                      schedule, seed, args, out_dir), None)
    busy0 = accuracy.cpu_busy_seconds()[0]
    ours0 = accuracy.children_cpu_seconds()
    started = time.monotonic()
    with cluster.Redirect(os.path.join(job_dir, 'job.log'), not args.verbose) as log:
        code = launch.run_job(specs, timeout=args.timeout)
    seconds = time.monotonic() - started
    busy = accuracy.cpu_busy_seconds()[0] - busy0
    ours = accuracy.children_cpu_seconds() - ours0
    run = {'spec': label, 'kvstore': kvstore, 'compression_params': params, 'model': model,
           'workers': workers, 'servers': args.servers, 'schedule': schedule, 'seed': seed,
           'exit_code': code, 'job_s': seconds,
           'others_cpu_share': max(0.0, busy - ours) / (seconds * (os.cpu_count() or 1))}
    summaries = cluster.worker_results(code, run, log, out_dir, workers)
    if summaries is None:
        return run
    curve = accuracy.run_curve(summaries)
    run.update({'curve': [{k: p[k] for k in ('epoch', 'test_acc', 'test_acc_spread',
                                             'wall_s', 'train_s', 'train_loss',
                                             'train_cpu_s') if k in p}
                          for p in curve],
                'final_acc': curve[-1]['test_acc'], 'wall_s': curve[-1]['wall_s'],
                'train_s': sum(p['train_s'] for p in curve),
                'steps': len(curve) * summaries[0].get('batches_per_epoch', 0)})
    if all('train_cpu_s' in p for p in curve):
        run['train_cpu_s'] = sum(p['train_cpu_s'] for p in curve)
    stats = [s.get('comm_stats') for s in summaries]
    if all(stats):
        tot = {k: sum(st[k] for st in stats) for k in ('raw_bytes', 'push_bytes',
                                                       'pull_bytes')}
        run['bytes_per_step'] = {k[:-6]: tot[k] / sum(max(1, st['steps']) for st in stats)
                                 for k in tot}
        run['push_ratio'] = tot['raw_bytes'] / max(tot['push_bytes'], 1)
        run['pull_ratio'] = tot['raw_bytes'] / max(tot['pull_bytes'], 1)
        run['codec_plan'] = summaries[0].get('codec_plan')
    else:                # MXNet's own kvstores send float32
        run['push_ratio'] = run['pull_ratio'] = 1.0
    return run


def mean_std(values):
    return accuracy.mean_std(values)


def desynced(run):
    """True if the workers' replicas ended with different test accuracies (synchronous
    training keeps them equal: a worker whose weights drifted away trains on its own
    and spoils everyone's sum). Runs recorded before the spread was kept: False."""
    return any(p.get('test_acc_spread', 0) > 0 for p in run['curve'])


def mean_half_width(diffs):
    """The paired differences' mean and the half-width of its one-sided 95% t-bound
    (two or more seeds)."""
    return (statistics.mean(diffs),
            t95(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs)))


def upper_bound(diffs):
    """One-sided 95% upper t-bound of the paired differences' mean (None: one seed)."""
    if len(diffs) < 2:
        return None
    m, half = mean_half_width(diffs)
    return m + half


def seeds_to_show(diffs, margin=MARGIN, most=1000):
    """How many seeds would show "within ``margin``" if the observed mean and spread
    held: the smallest n whose one-sided bound falls below the margin. None when the
    mean itself is not below the margin (no number of seeds shows it) or there are
    fewer than two seeds; ``most + 1`` when more than ``most`` would be needed. A
    planning figure, not evidence: it says whether a '?' is a matter of seeds."""
    if len(diffs) < 2:
        return None
    m, s = statistics.mean(diffs), statistics.stdev(diffs)
    if m >= margin:
        return None
    for n in range(2, most + 1):
        if m + t95(n - 1) * s / math.sqrt(n) < margin:
            return n
    return most + 1


def verdict(diffs, margin=MARGIN):
    """'ok' / 'WORSE' / '?' for 'baseline minus spec < margin points' (paired)."""
    if len(diffs) < 2:
        return '?'
    m, half = mean_half_width(diffs)
    if m + half < margin:
        return 'ok'
    if m - half > margin:
        return 'WORSE'
    return '?'


def summarize(runs, baseline=BASELINE, margin=MARGIN):
    """Rows per (model, workers, schedule, spec), in first-seen order."""
    groups = {}
    for r in runs:
        groups.setdefault((r['model'], r['workers'], r['schedule']), {}) \
              .setdefault(r['spec'], []).append(r)
    rows = []
    for (model, workers, schedule), by_spec in groups.items():
        base_runs = {r['seed']: r for r in by_spec.get(baseline, []) if not r.get('error')}
        base = {seed: r['final_acc'] for seed, r in base_runs.items()}
        for spec, rs in by_spec.items():
            ok = [r for r in rs if not r.get('error')]
            row = {'model': model, 'workers': workers, 'schedule': schedule, 'spec': spec,
                   'seeds': sorted(r['seed'] for r in ok),
                   'failed': sorted(r['seed'] for r in rs if r.get('error'))}
            if ok:
                diffs = [100 * (base[r['seed']] - r['final_acc']) for r in ok
                         if r['seed'] in base]
                row.update({
                    'acc': mean_std([100 * r['final_acc'] for r in ok]),
                    'paired_diff_points': mean_std(diffs) if diffs else (None, None),
                    'paired_n': len(diffs),
                    'verdict': verdict(diffs, margin) if spec != baseline else '',
                    'bound_points': upper_bound(diffs) if spec != baseline else None,
                    'seeds_to_show': seeds_to_show(diffs, margin) if spec != baseline
                    else None,
                    'push_ratio': mean_std([r['push_ratio'] for r in ok])[0],
                    'pull_ratio': mean_std([r['pull_ratio'] for r in ok])[0],
                    'wall_s': mean_std([r['wall_s'] for r in ok]),
                    'train_s': mean_std([r['train_s'] for r in ok if 'train_s' in r]),
                    'train_ratio': mean_std(train_ratios(ok, base_runs)),
                    'final_train_loss': mean_std([r['curve'][-1]['train_loss'] for r in ok]),
                    'others_cpu_share_max': max(r['others_cpu_share'] for r in ok),
                    'desynced': sorted(r['seed'] for r in ok if desynced(r))})
            rows.append(row)
    return rows


def train_ratios(runs, base_runs):
    """Each run's training seconds over the baseline's of the same seed."""
    return [r['train_s'] / base_runs[r['seed']]['train_s'] for r in runs
            if r['seed'] in base_runs and 'train_s' in r and
            base_runs[r['seed']].get('train_s')]


def _pm(pair, fmt):
    if not pair or pair[0] is None:
        return '-'
    return (fmt + ' +- ' + fmt) % pair


def format_tables(rows, margin=MARGIN):
    out, last = [], None
    for r in rows:
        group = (r['model'], r['workers'], r['schedule'])
        if group != last:
            if last is not None:
                out.append('')
            out.append('== %s, %d workers, %s ==' % group)
            head = '%-50s %5s %15s %15s %5s %15s %7s %7s %11s %11s %13s' % (
                'spec', 'seeds', 'test acc %', 'dist_sync - it', 'd<%g' % margin,
                'train loss', 'raw/push', 'raw/pull', 'wall s', 'train s', '/base')
            out += [head, '-' * len(head)]
            last = group
        if 'acc' not in r:
            out.append('%-50s failed (seeds %s)' % (r['spec'], r['failed']))
            continue
        out.append('%-50s %5d %15s %15s %5s %15s %7.1f %7.1f %11s %11s %13s%s' % (
            r['spec'][:50], len(r['seeds']), _pm(r['acc'], '%.2f'),
            _pm(r['paired_diff_points'], '%+.2f'), r['verdict'],
            _pm(r['final_train_loss'], '%.3f'), r['push_ratio'],
            r['pull_ratio'], _pm(r['wall_s'], '%.1f'), _pm(r['train_s'], '%.2f'),
            _pm(r.get('train_ratio'), '%.3f'),
            ' !' if r['others_cpu_share_max'] > accuracy.BUSY_SHARE else '') +
            (' desynced: seeds %s' % r['desynced'] if r['desynced'] else ''))
    out.append('dist_sync - it: paired by seed, points; d<%g: one-sided 95%% t-bound '
               'of it (ok: < %g shown; WORSE: > %g shown; ?: seeds cannot tell); '
               'train loss: mean over the last epoch; /base: train s over the '
               'baseline\'s, paired by seed; '
               '!: other programs used > %d%% of the cores; desynced: the workers\' '
               'replicas ended with different test accuracies' % (margin, margin, margin,
                                                                 100 * accuracy.BUSY_SHARE))
    return '\n'.join(out)


def format_matrix(rows, margin=MARGIN, baseline=BASELINE):
    """One line per configuration and spec against the baseline: the accuracy matrix at a
    glance. ``bound`` is the one-sided 95% t-bound of the paired loss; ``to show`` the
    seeds that would show it within the margin if the mean and spread held (``never``:
    the mean is not below the margin)."""
    base_loss = {(r['model'], r['workers'], r['schedule']): r['final_train_loss'][0]
                 for r in rows if r['spec'] == baseline and 'acc' in r}
    head = '%-7s %2s %-5s %-44s %5s %15s %6s %5s %13s %8s %7s' % (
        'model', 'w', 'sched', 'spec', 'seeds', 'dist_sync - it', 'bound', 'd<%g' % margin,
        'loss it/base', 'raw/push', 'to show')
    out = [head, '-' * len(head)]
    for r in rows:
        if r['spec'] == baseline or 'acc' not in r or not r['paired_n']:
            continue
        group = (r['model'], r['workers'], r['schedule'])
        need = r['seeds_to_show']
        need = 'never' if need is None else ('>1000' if need > 1000 else str(need))
        bound = r['bound_points']
        loss = '%.3f/%s' % (r['final_train_loss'][0],
                            '%.3f' % base_loss[group] if group in base_loss else '-')
        out.append('%-7s %2d %-5s %-44s %5d %15s %6s %5s %13s %8.1f %7s' % (
            r['model'], r['workers'], r['schedule'], r['spec'][:44], r['paired_n'],
            _pm(r['paired_diff_points'], '%+.2f'),
            '-' if bound is None else '%+.2f' % bound, r['verdict'], loss,
            r['push_ratio'], need))
    out.append('dist_sync - it: paired by seed, points, mean +- std over the paired seeds; '
               'bound: its one-sided 95%% t-bound (ok: below %g); loss: mean train loss of '
               'the last epoch, the spec\'s over the baseline\'s; to show: seeds that would '
               'show "within %g" if this mean and spread held' % (margin, margin))
    return '\n'.join(out)


def load_runs(paths):
    """The successful runs of several results files; a run (spec, model, workers,
    schedule, seed) found in two files is an error, not a silent pick."""
    runs, seen = [], {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)['runs']:
                if r.get('error'):
                    continue
                key = run_key(r)
                if key in seen:
                    raise ValueError('%s: run %s is also in %s' % (path, key, seen[key]))
                seen[key] = path
                runs.append(r)
    return runs


def save(path, args, runs, started):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ('work_dir', 'specs')}
    config['specs'] = [s[0] for s in args.specs]
    done = [r for r in runs if r.get('spec') != '-']
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump({'config': config, 'machine': accuracy.machine_info(),
                   'started': started, 'summary': summarize(done, margin=args.margin),
                   'runs': runs}, f,
                  indent=1)
    os.replace(tmp, path)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                epilog=__doc__.split('\n\n', 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--specs', nargs='+', default=[BASELINE, 'dist_sync_hylo:aggregation=server',
                                                  'dist_sync_hylo:aggregation=homomorphic'],
                   help='KVSTORE[:KEY=VALUE,...] each; include dist_sync for the paired '
                        'difference')
    p.add_argument('--models', nargs='+', default=['cnn512'],
                   help='train_mnist.py --model values (cnn, cnn512, lenet, mlp)')
    p.add_argument('--workers', nargs='+', type=int, default=[4])
    p.add_argument('-s', '--servers', type=int, default=2)
    p.add_argument('--schedules', nargs='+', default=['short'], choices=('short', 'long'))
    p.add_argument('--seeds', default='3', help='a count N (1..N) or a list (7,11)')
    p.add_argument('--short-epochs', type=int, default=3)
    p.add_argument('--long-epochs', type=int, default=8)
    p.add_argument('--long-lr-mode', default='cosine', choices=('cosine', 'step'))
    p.add_argument('--long-lr-steps', default='5,7', help='step mode: epochs')
    p.add_argument('--batch-size', type=int, default=32, help='per worker')
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--threads', type=int, default=1, help='OMP_NUM_THREADS per node')
    p.add_argument('--timeout', type=float, default=600, help='seconds per job')
    p.add_argument('--json', help='results file (rewritten after every job; resumed)')
    p.add_argument('--rerun', action='store_true', help='ignore runs already in --json')
    p.add_argument('--verbose', action='store_true', help="show the nodes' output")
    p.add_argument('--margin', type=float, default=MARGIN,
                   help='points: the verdict judges "dist_sync - it < margin" (the accuracy matrix: '
                        '0.5; the schemes\' issues: 1)')
    p.add_argument('--report', nargs='*', metavar='MORE_JSON', default=None,
                   help='run nothing: print the tables of the runs in --json and in any '
                        'MORE_JSON files (a run in two files is an error)')
    p.add_argument('--matrix', action='store_true',
                   help='with --report: one line per configuration and spec (the accuracy '
                        'matrix), with the bound and the seeds that would show it')
    p.add_argument('--extra', nargs=argparse.REMAINDER, default=[],
                   help='further train_mnist.py flags (last on the command line)')
    args = p.parse_args(argv)
    try:
        args.seeds = accuracy.parse_seeds(args.seeds)
        args.specs = [cluster.parse_scheme(s) for s in args.specs]
    except ValueError as e:
        p.error(str(e))
    if args.report is not None:
        for path in [args.json] + args.report:
            if not (path and os.path.isfile(path)):
                p.error('--report prints the runs of an existing --json file (and '
                        'existing MORE_JSON files): %s' % path)
    elif args.matrix:
        p.error('--matrix is a form of --report')
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.report is not None:
        try:
            runs = load_runs([args.json] + args.report)
        except ValueError as e:
            print('promise.py: %s' % e, file=sys.stderr)
            return 2
        rows = summarize(runs, margin=args.margin)
        print(format_matrix(rows, args.margin) if args.matrix
              else format_tables(rows, args.margin))
        return 0
    runs = []
    if args.json and os.path.isfile(args.json) and not args.rerun:
        with open(args.json) as f:
            runs = [r for r in json.load(f)['runs'] if not r.get('error')]
    done = {run_key(r) for r in runs}
    previous = cluster.catch_stop_signals()
    started = time.strftime('%Y-%m-%d %H:%M:%S')
    args.work_dir = tempfile.mkdtemp(prefix='kvx-promise-')
    interrupted = None
    try:
        for seed in args.seeds:
            for model in args.models:
                for workers in args.workers:
                    for schedule in args.schedules:
                        for spec in args.specs:
                            key = (spec[0], model, workers, schedule, seed)
                            if key in done:
                                continue
                            job_dir = tempfile.mkdtemp(prefix='job-', dir=args.work_dir)
                            print('seed %d %s %dw %s: %s ...' % (seed, model, workers,
                                                                  schedule, spec[0]),
                                  file=sys.stderr, flush=True)
                            run = run_one(args, spec, model, workers, schedule, seed,
                                          job_dir)
                            if run.get('error'):
                                print('  %s\n%s' % (run['error'], run.get('log_tail', '')),
                                      file=sys.stderr)
                            else:
                                print('  acc %.4f, raw/push %.1f, raw/pull %.1f, %.1f s'
                                      % (run['final_acc'], run['push_ratio'],
                                         run['pull_ratio'], run['wall_s']),
                                      file=sys.stderr, flush=True)
                            runs.append(run)
                            save(args.json, args, runs, started)
    except (KeyboardInterrupt, cluster.Interrupted) as e:
        interrupted = str(e) or 'SIGINT'
        print('interrupted (%s)' % interrupted, file=sys.stderr)
    except Exception:
        traceback.print_exc()
        interrupted = 'harness error'
    finally:
        cluster.clean_up_uninterrupted(
            previous, lambda: shutil.rmtree(args.work_dir, ignore_errors=True))
    ok = [r for r in runs if r.get('spec') != '-']
    print('loopback, %d servers, batch %d a worker, lr %g, momentum %g; short: %d epochs '
          'constant lr; long: %d epochs %s' % (args.servers, args.batch_size, args.lr,
                                               args.momentum, args.short_epochs,
                                               args.long_epochs, args.long_lr_mode))
    print(format_tables(summarize(ok, margin=args.margin), args.margin))
    save(args.json, args, runs, started)
    return 130 if interrupted else 0


if __name__ == '__main__':
    sys.exit(main())
