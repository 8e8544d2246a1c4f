"""Plots of bench/cluster.py's and bench/accuracy.py's JSON (PNG, matplotlib, no display).

* ``cluster.png``: step time per scheme, one panel per model and link rate, each bar
  split into compute (the median compute-only step) and exposed communication (the
  rest of the step), labelled with the step time, the communication share and the
  speed-up against ``dist_sync``.
* ``accuracy.png``: test accuracy against wall time (every epoch of every seed, and
  the mean over seeds), the same zoomed on the last epochs, and the final accuracy
  per scheme (mean +- std over seeds) against ``dist_sync``'s.

    python bench/plots.py --cluster bench/results/cluster.json \\
        --accuracy bench/results/accuracy.json --out-dir bench/results

The kernel plot is bench/kernels.py's own (``--plot``).
"""
import argparse
import json
import os
import sys

BUSY_RATIO = 1.25      # as bench/cluster.py: compute wall / CPU above this: machine busy
BUSY_SHARE = 0.25      # as bench/accuracy.py: others used this share of the cores

# one colour per scheme, the same in every plot. Older result files name server mode
# plain 'dist_sync_hylo' (then Hylo's default); newer
# ones name both modes explicitly
SCHEME_COLORS = {
    'dist_sync': '#444444',
    'dist_sync_none': '#999999',
    'dist_sync_hylo': '#1f77b4',
    'dist_sync_hylo(aggregation=server)': '#1f77b4',
    'dist_sync_hylo(aggregation=homomorphic)': '#2ca02c',
    'dist_sync_2bit': '#ff7f0e',
    'dist_sync(type=2bit,threshold=0.5)': '#d62728',
}
SCHEME_NAMES = {
    'dist_sync': 'dist_sync (MXNet, fp32)',
    'dist_sync_none': 'dist_sync_none (plugin, fp32)',
    'dist_sync_hylo': 'dist_sync_hylo (default: homomorphic; server decode in older files)',
    'dist_sync_hylo(aggregation=server)': 'dist_sync_hylo (server decode)',
    'dist_sync_hylo(aggregation=homomorphic)': 'dist_sync_hylo (homomorphic)',
    'dist_sync_2bit': 'dist_sync_2bit (plugin)',
    'dist_sync(type=2bit,threshold=0.5)': 'MXNet built-in 2bit',
}


def color(scheme, i=0):
    import matplotlib.pyplot as plt
    return SCHEME_COLORS.get(scheme) or plt.get_cmap('tab10')(i % 10)


def name(scheme):
    return SCHEME_NAMES.get(scheme, scheme)


# ------------------------------------------------------------------ cluster

def plot_cluster(result, out_path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rows = [r for r in result['runs'] if r.get('step_s')]
    if not rows:
        raise ValueError('no measured runs in the cluster JSON')
    panels = []
    for r in rows:
        key = (r['model'], r['rate_bps'])
        if key not in panels:
            panels.append(key)
    models = []
    for m, _ in panels:
        if m not in models:
            models.append(m)
    rates = sorted({rate for _, rate in panels})
    fig, axes = plt.subplots(len(models), len(rates), squeeze=False,
                             figsize=(7.5 * len(rates), 0.6 + 3.4 * len(models)))
    config = result.get('config', {})
    busy_any = False
    for i, model in enumerate(models):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            panel = [r for r in rows if r['model'] == model and r['rate_bps'] == rate]
            if not panel:
                ax.axis('off')
                continue
            base = [r['step_s'] for r in panel if r['scheme'] == 'dist_sync']
            labels = []
            for k, r in enumerate(panel):
                step, comp = 1e3 * r['step_s'], 1e3 * min(r['compute_s'], r['step_s'])
                c = color(r['scheme'], k)
                ax.barh(k, comp, color=c, alpha=0.35, edgecolor=c)
                ax.barh(k, step - comp, left=comp, color=c, edgecolor=c)
                busy = r.get('compute_wall_over_cpu', 0) > BUSY_RATIO
                busy_any |= busy
                text = ' %.0f ms, comm %.0f%%' % (step, 100 * r['comm_share'])
                if base:
                    text += ', %.2fx' % (base[0] / r['step_s'])
                ax.text(step, k, text + (' !' if busy else ''), va='center', fontsize=8.5)
                labels.append(name(r['scheme']))
            ax.set_yticks(range(len(panel)))
            ax.set_yticklabels(labels, fontsize=9)
            ax.invert_yaxis()
            longest = max(1e3 * r['step_s'] for r in panel)
            ax.set_xlim(0, longest * 1.6)
            ax.set_xlabel('time per training step (ms): light = compute, dark = '
                          'exposed communication', fontsize=9)
            g = panel[0]
            ax.set_title('%s (%.2f MB fp32 gradient) at %s per link'
                         % (model, g['gradient_bytes'] / 1e6, panel[0]['rate']), fontsize=11)
            ax.grid(True, axis='x', alpha=0.3)
    note = ('speed-up against dist_sync at the same model and rate; comm = 1 - compute/step'
            + ('; !: the machine was busy (compute wall > %.2fx CPU time)' % BUSY_RATIO
               if busy_any else ''))
    fig.suptitle('Emulated cluster: %s workers, %s server(s), batch %s per worker, '
                 'median of %s steps\n%s'
                 % (config.get('workers', '?'), config.get('servers', '?'),
                    config.get('batch_size', '?'), config.get('steps', '?'), note),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------ accuracy

def plot_accuracy(result, out_path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    summary = [s for s in result['summary'] if 'final_acc_mean' in s]
    runs = [r for r in result['runs'] if r.get('curve')]
    if not summary:
        raise ValueError('no successful runs in the accuracy JSON')
    config = result.get('config', {})
    target = summary[0]['target']
    fig, axes = plt.subplots(1, 3, figsize=(19, 6.8),
                             gridspec_kw={'width_ratios': [1.1, 1.1, 0.95]})
    best = max(s['final_acc_mean'] for s in summary)
    # the zoom shows the schemes within 5 points of the best; the others are named
    close = [s for s in summary if s['final_acc_mean'] >= best - 0.05]
    handles = []
    for zoom, ax in enumerate(axes[:2]):
        for k, s in enumerate(summary):
            c = color(s['scheme'], k)
            for r in runs:
                if r['scheme'] == s['scheme']:
                    ax.plot([p['wall_s'] for p in r['curve']],
                            [100 * p['test_acc'] for p in r['curve']],
                            color=c, lw=0.8, alpha=0.4, marker='.', ms=3)
            xs = [p['wall_s'][0] for p in s['curve_mean']]
            ys = [100 * p['test_acc'][0] for p in s['curve_mean']]
            line, = ax.plot(xs, ys, color=c, lw=2.2, marker='o', ms=4.5,
                            label='%s: %.2f%% after %.0f s' % (name(s['scheme']), ys[-1], xs[-1]))
            if not zoom:
                handles.append(line)
        ax.axhline(100 * target, color='black', ls=':', lw=1.2)
        ax.set_xlabel('wall time since training started (s; start-up excluded)')
        ax.set_ylabel('test accuracy (%, 1000 held-out digits)')
        ax.grid(True, alpha=0.3)
    axes[0].set_xlim(left=0)
    axes[0].set_title('test accuracy after each epoch\n(thin: each seed; thick: mean '
                      'over seeds; dotted: the %.0f%% target)' % (100 * target), fontsize=10.5)
    last = [p for s in close for p in s['curve_mean'][-3:]]
    finals = [100 * p['test_acc'][0] for p in last]
    axes[1].set_ylim(min(min(finals), 100 * target) - 0.5, max(finals) + 0.4)
    times = [p['wall_s'][0] for s in summary for p in s['curve_mean'][-3:]]
    axes[1].set_xlim(min(times) * 0.85, max(times) * 1.04)
    title = 'zoom on the last 3 epochs'
    far = [s for s in summary if s not in close]
    if far:
        title += '\n(off scale: %s)' % ', '.join(
            '%s %.1f%%' % (name(s['scheme']), 100 * s['final_acc_mean']) for s in far)
    axes[1].set_title(title, fontsize=10.5)

    # difference of the final accuracy to dist_sync's, per scheme
    ax = axes[2]
    base = next((s for s in summary if s['scheme'] == 'dist_sync'), None)
    if base is None:
        ax.axis('off')
    else:
        others = [s for s in summary if s is not base]
        diffs = [100 * (s['final_acc_mean'] - base['final_acc_mean']) for s in others]
        limit = 2.5
        lo = max(-limit, min(diffs + [-1.0]) - 0.4)
        hi = min(limit, max(diffs + [1.0]) + 0.4)
        ax.axvspan(lo, -0.5, color='#d62728', alpha=0.08)
        ax.axvline(-0.5, color='#d62728', ls='--', lw=1)
        ax.axvline(0, color='black', lw=0.8)
        for k, (s, d) in enumerate(zip(others, diffs)):
            c = color(s['scheme'], k)
            shown = min(max(d, lo), hi)
            ax.barh(k, shown, color=c, alpha=0.85)
            std = 100 * s['final_acc_std']
            if lo < d < hi:
                ax.errorbar(d, k, xerr=std, color='black', capsize=4, lw=1)
            for a in s['final_accs']:
                v = 100 * (a - base['final_acc_mean'])
                if lo <= v <= hi:
                    ax.plot(v, k, 'k.', ms=6)
            text = '%+.2f pts (%.2f%%)' % (d, 100 * s['final_acc_mean'])
            if d <= lo:                      # bar cut at the left edge: text inside it
                ax.text(lo + 0.05, k, text + ', off scale', va='center', ha='left',
                        fontsize=8.5, color='white', fontweight='bold')
            elif d >= hi:
                ax.text(hi - 0.05, k, text + ', off scale', va='center', ha='right',
                        fontsize=8.5, color='white', fontweight='bold')
            else:
                ax.text(0.02 if d < 0 else -0.02, k + 0.32, text, va='center',
                        ha='left' if d < 0 else 'right', fontsize=8.5)
        ax.set_yticks(range(len(others)))
        ax.set_yticklabels([name(s['scheme']) for s in others], fontsize=9)
        ax.invert_yaxis()
        ax.set_xlim(lo, hi)
        ax.set_xlabel('final test accuracy minus dist_sync\'s (points)')
        ax.set_title('final accuracy against dist_sync (%.2f%%): bar = mean,\n'
                     'whisker = std, dots = seeds; red: lost > 0.5 pts (target)'
                     % (100 * base['final_acc_mean']), fontsize=10.5)
        ax.grid(True, axis='x', alpha=0.3)
    where = 'loopback (no bandwidth limit)' if config.get('loopback') else \
        '%s links (emulated cluster)' % config.get('rate', '?')
    busy = any(s.get('others_cpu_share_max', 0) > BUSY_SHARE for s in summary)
    fig.suptitle('Time to accuracy: MNIST CNN, %s workers, %s servers, %s, batch %s per '
                 'worker, lr %s %s, %s epochs, seeds %s%s'
                 % (config.get('workers', '?'), config.get('servers', '?'), where,
                    config.get('batch_size', '?'), config.get('lr', '?'),
                    config.get('lr_mode', ''), config.get('epochs', '?'),
                    ','.join(map(str, config.get('seeds', []))),
                    '\nwall times measured while other programs used the machine '
                    '(see docs/RESULTS.md)' if busy else ''), fontsize=11.5)
    fig.legend(handles=handles, loc='lower center', ncol=3, fontsize=9.5, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 0.93 if busy else 0.96))
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--cluster', help="bench/cluster.py's JSON")
    parser.add_argument('--accuracy', help="bench/accuracy.py's JSON")
    parser.add_argument('--out-dir', default='bench/results')
    args = parser.parse_args(argv)
    if not args.cluster and not args.accuracy:
        parser.error('give --cluster and/or --accuracy')
    os.makedirs(args.out_dir, exist_ok=True)
    code = 0
    for path, plot, out in ((args.cluster, plot_cluster, 'cluster.png'),
                            (args.accuracy, plot_accuracy, 'accuracy.png')):
        if not path:
            continue
        try:
            with open(path) as f:
                result = json.load(f)
            plot(result, os.path.join(args.out_dir, out))
            print('wrote %s' % os.path.join(args.out_dir, out))
        except (OSError, ValueError, KeyError) as e:
            print('%s: %s' % (path, e), file=sys.stderr)
            code = 1
    return code


if __name__ == '__main__':
    sys.exit(main())
