"""Time to accuracy against the number of workers: bench/accuracy.py's results for
several worker counts, side by side, as a table and a plot.

Run bench/accuracy.py once per worker count (same schemes, seeds, rate and epochs), each
with its own ``--json``, then:

    python bench/scale.py bench/results/accuracy_scale_2w.json \\
        bench/results/accuracy_scale_4w.json bench/results/accuracy_scale_8w.json \\
        --baselines dist_sync dist_sync_2bit --txt bench/results/accuracy_scale.txt \\
        --plot bench/results/accuracy_scale.png

Per worker count and scheme: final accuracy (mean +- std over seeds), the paired loss
against ``dist_sync``, time to the runs' target accuracy, time per epoch, and the
speed-ups to the target and per epoch against each baseline (baseline time / scheme
time; ``-`` where one of them never reached the target in some seed).
"""
import argparse
import json
import sys


def load(paths):
    """{workers: accuracy.py's result} of each file; one worker count a file."""
    results = {}
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        workers = result['config']['workers']
        if workers in results:
            sys.exit('%s: a second file for %d workers' % (path, workers))
        results[workers] = result
    return results


def time_to_target(row):
    """Mean seconds to the target if every seed reached it, else None."""
    if row['reached_target'] != len(row['seeds']) or not row['seeds']:
        return None
    return row['time_to_target_s'][0]


def ratio(a, b):
    return '-' if a is None or b is None or b <= 0 else '%.2fx' % (a / b)


def table(results, baselines):
    lines = []
    for workers in sorted(results):
        result = results[workers]
        rows = {r['scheme']: r for r in result['summary']}
        target = result['config']['target']
        cfg = result['config']
        lines.append('== %d workers, %d servers, %s, %d epochs, seeds %s, target %.0f%% =='
                     % (workers, cfg['servers'], 'loopback' if cfg['loopback'] else cfg['rate'],
                        cfg['epochs'], cfg['seeds'], 100 * target))
        head = '%-42s %15s %14s %12s %8s' % ('scheme', 'final acc %', 'paired loss',
                                             'to target s', 's/epoch')
        for b in baselines:
            head += ' %22s %22s' % ('vs %s tgt' % b, 'vs %s ep' % b)
        lines.append(head)
        for scheme, row in rows.items():
            paired = row['loss_vs_baseline_paired_points']
            t = time_to_target(row)
            line = '%-42s %7.2f +- %4.2f %+6.2f +- %4.2f %12s %8.2f' % (
                scheme, 100 * row['final_acc_mean'], 100 * row['final_acc_std'],
                paired[0], paired[1], 'never' if t is None else '%.1f' % t,
                row['epoch_s'][0])
            for b in baselines:
                base = rows.get(b)
                if base is None:
                    line += ' %22s %22s' % ('', '')
                    continue
                line += ' %22s %22s' % (ratio(time_to_target(base), t),
                                        ratio(base['epoch_s'][0], row['epoch_s'][0]))
            if row.get('others_cpu_share_max', 0) > 0.25:
                line += ' !'
            lines.append(line)
        lines.append('')
    lines.append('paired loss: dist_sync minus the scheme, seed by seed, points; vs X tgt: '
                 "X's time to target / the scheme's; vs X ep: the same per epoch; "
                 '!: other programs used > 25% of the cores during some run')
    return '\n'.join(lines)


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    schemes = []
    for workers in sorted(results):
        for row in results[workers]['summary']:
            if row['scheme'] not in schemes:
                schemes.append(row['scheme'])
    for scheme in schemes:
        xs, ts, es = [], [], []
        for workers in sorted(results):
            row = {r['scheme']: r for r in results[workers]['summary']}.get(scheme)
            if row is None:
                continue
            xs.append(workers)
            ts.append(time_to_target(row))
            es.append(row['epoch_s'][0])
        ax_t.plot([x for x, t in zip(xs, ts) if t is not None],
                  [t for t in ts if t is not None], 'o-', label=scheme)
        ax_e.plot(xs, es, 'o-', label=scheme)
    target = next(iter(results.values()))['config']['target']
    ax_t.set_title('wall seconds to %.0f%% test accuracy (missing: never)' % (100 * target))
    ax_e.set_title('wall seconds per epoch')
    for ax in (ax_t, ax_e):
        ax.set_xlabel('workers')
        ax.set_xticks(sorted(results))
        ax.grid(alpha=0.3)
    ax_e.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     epilog=__doc__.split('\n\n', 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('results', nargs='+', help="bench/accuracy.py's JSON, one per worker count")
    parser.add_argument('--baselines', nargs='+', default=['dist_sync', 'dist_sync_2bit'])
    parser.add_argument('--txt', help='write the table here too')
    parser.add_argument('--plot', help='PNG to draw')
    args = parser.parse_args(argv)
    results = load(args.results)
    text = table(results, args.baselines)
    print(text)
    if args.txt:
        with open(args.txt, 'w') as f:
            f.write(text + '\n')
    if args.plot:
        plot(results, args.plot)


if __name__ == '__main__':
    main()
