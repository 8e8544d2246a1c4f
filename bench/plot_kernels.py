"""Plot of bench/kernels.py's results: throughput (GB/s of float32 gradient) against size,
log-log, one panel per codec family, the interleaved memory copy as the reference line.

On a shared machine the best times of two cases measured a minute apart can come from
different memory loads, so each curve is drawn as (its median paired ratio to the copy)
x (the copy's throughput at that size, median over the run): positions relative to the
copy line are then exactly the measured ratios. The raw best-time GB/s are in the JSON.

    python bench/plot_kernels.py bench/results/kernels.json bench/results/kernels.png
"""
import json
import statistics
import sys

PANELS = [
    ('fp32 pass-through', lambda c: c.startswith('fp32')),
    ('Hylo conv: filter selection encode', lambda c: c.startswith('topk_encode')),
    ('Hylo conv: decode', lambda c: c.startswith('topk_decode')),
    ('Hylo FC: ternary (base-3 payload)', lambda c: c.startswith('ternary_encode ')
     or c.startswith('ternary_decode') and 'sum' not in c),
    ('homomorphic: ternary n=4, filters', lambda c: 'sum' in c or c.startswith('filter_scores')
     or c.startswith('topk_gather') or c.startswith('topk_scatter')),
    ("MXNet 2-bit layout: ours vs MXNet's", lambda c: c.startswith('twobit')
     or c.startswith('MXNet 2bit')),
]
# The other two panels: every path of a few cases (kernel, MXNet operator, NumPy reference).
PATH_CASES = ['ternary_encode adaptive', 'topk_encode F=4608 5%', 'ternary_decode',
              'twobit_encode']
PATH_STYLE = {'kernel': '-', 'op': '--', 'numpy': ':'}
PATH_LABEL = {'kernel': 'C++ kernel (ctypes)', 'op': 'MXNet operator', 'numpy': 'NumPy reference'}


COPY = {}   # size -> copy GB/s of gradient (median over the run), set by plot()


def _series(rows, case, path):
    pts = sorted((r['elements'], r['paths'][path]['frac_copy'] * COPY[r['size']]) for r in rows
                 if r['case'] == case and path in r['paths'])
    return [p[0] for p in pts], [p[1] for p in pts]


def _copy_line(rows):
    """Copy's GB/s of gradient per size: median over all cases' interleaved copies."""
    by_size = {}
    for r in rows:
        for m in r['paths'].values():
            by_size.setdefault(r['size'], []).append(m['copy_gbps'])
    sizes = sorted(by_size)
    return sizes, [statistics.median(by_size[s]) for s in sizes]


def plot(result, out_path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rows = result['results']
    cases = []
    for r in rows:
        if r['case'] not in cases:
            cases.append(r['case'])
    copy_x, copy_y = _copy_line(rows)
    COPY.clear()
    COPY.update(zip(copy_x, copy_y))
    fig, axes = plt.subplots(3, 3, figsize=(18, 15))
    axes = axes.ravel()
    cmap = plt.get_cmap('tab10')

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    plain = FuncFormatter(lambda v, _: '%g' % v)

    def log_axes(ax, x=True):
        if x:
            ax.set_xscale('log')
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale('log')
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())

    def decorate(ax, title):
        ax.plot(copy_x, copy_y, color='black', lw=2.5, alpha=0.35, label='copy: memmove (8 B/elem moved)')
        log_axes(ax)
        if copy_x:
            ax.set_xlim(min(copy_x) / 1.6, max(copy_x) * 1.6)
        ax.set_title(title, fontsize=11)
        ax.grid(True, which='both', alpha=0.25)
        ax.legend(fontsize=7.5, loc='best', framealpha=0.75)

    for ax, (title, match) in zip(axes, PANELS):
        for i, case in enumerate(c for c in cases if match(c)):
            path = 'mxnet' if case.startswith('MXNet') else 'kernel'
            x, y = _series(rows, case, path)
            style = dict(color='gray', ls='-.', marker='s') if path == 'mxnet' else \
                dict(color=cmap(i), ls='-', marker='o')
            ax.plot(x, y, ms=4, label=case + (' (built-in)' if path == 'mxnet' else ''), **style)
        decorate(ax, title)

    # dispatch and reference: three paths of a few cases
    for ax, which, what in zip(axes[6:], (PATH_CASES[:2], PATH_CASES[2:]),
                               ('Hylo encoders', 'ternary decode, 2-bit encode')):
        for i, case in enumerate(which):
            for path in ('kernel', 'op', 'numpy'):
                x, y = _series(rows, case, path)
                if x:
                    ax.plot(x, y, color=cmap(i), ls=PATH_STYLE[path], marker='o', ms=3,
                            label='%s: %s' % (case, PATH_LABEL[path]))
        decorate(ax, '%s: kernel vs MXNet operator vs NumPy' % what)

    # threshold sweep: MXNet's branchy quantize against our branch-free encoders
    ax = axes[8]
    sweep = result.get('threshold_sweep') or []
    styles = {'mxnet': dict(color='gray', ls='-.', marker='s'),
              'ternary_encode fixed t': dict(color=cmap(1), ls='-', marker='o'),
              'twobit_encode': dict(color=cmap(2), ls='-', marker='o')}
    labels = {'mxnet': "MXNet built-in quantize", 'ternary_encode fixed t': 'ternary_encode fixed t',
              'twobit_encode': 'twobit_encode'}
    for size in sorted({r['size'] for r in sweep}):
        pts = [r for r in sweep if r['size'] == size]
        for path, style in styles.items():
            copy = statistics.median(m['copy_gbps'] for r in pts for m in r['paths'].values())
            ax.plot([100 * r['fraction_over_t'] for r in pts],
                    [r['paths'][path]['frac_copy'] * copy for r in pts], ms=4,
                    alpha=1.0 if size == max(r['size'] for r in sweep) else 0.45,
                    label='%s, n=%.0e' % (labels[path], size), **style)
    if sweep:
        log_axes(ax)
        ax.xaxis.set_major_formatter(plain)
        ax.set_xlabel('% of elements with |acc| >= t')
        ax.set_title('encode speed vs fraction over threshold', fontsize=11)
        ax.grid(True, which='both', alpha=0.25)
        ax.legend(fontsize=7.5, loc='lower left', framealpha=0.75)
    else:
        ax.axis('off')

    for ax in axes[:8]:
        ax.set_xlabel('elements (float32)')
    for ax in axes[::3]:
        ax.set_ylabel('GB/s of float32 gradient\n(ratio to copy x copy GB/s)')
    meta = result.get('meta', {})
    fig.suptitle('kvstore_ext codec kernels on one core (%s; MXNet with %s OMP thread; %s time).\n'
                 'Throughput = 4 B x elements / time, drawn as the median paired ratio to the '
                 'interleaved copy x the copy\'s GB/s; the copy moves 8 B per element.'
                 % (meta.get('cpu', '?'), meta.get('mxnet_threads', '?'),
                    meta.get('args', {}).get('clock', 'cpu').replace('cpu', 'CPU')), fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


if __name__ == '__main__':
    with open(sys.argv[1]) as f:
        plot(json.load(f), sys.argv[2])
