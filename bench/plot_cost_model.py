"""Tables and plots of bench/validate_cost_model.py's JSON: predicted against measured.

* ``cost_model_validation.md``: every cell (workers, model, link, scheme) with the
  predicted and the measured step time, their ratio and whether the prediction is
  within 20% of the measurement; the count of such cells; policy='auto' per cell
  against the best fixed choice and dist_sync.
* ``cost_model_<model>.png``: step time against link rate per scheme at the first
  worker count: measured points over the model's predicted lines, and the rate where
  compression stops paying (where the best compressing scheme meets dist_sync),
  predicted and measured.

The predicted lines are the cost model at each rate with the compute time measured in
that model's jobs (their median): the same inputs as the cells, at rates between.

    .venv/bin/python bench/plot_cost_model.py --json bench/results/cost_model_validation.json
"""
import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

WITHIN = 0.20          # a prediction is good if |predicted - measured| <= 20% of measured
AUTO_WITHIN = 0.05     # policy='auto': within 5% of the best fixed choice
AUTO_NOT_SLOWER = 0.03  # ... and never more than 3% slower than dist_sync
FLOAT32 = ('dist_sync', 'dist_sync_none')


def is_auto(scheme):
    return 'policy=auto' in scheme


def cells(result):
    """[(row, predicted s, measured s, ratio measured/predicted)] of the rows with both."""
    out = []
    for r in result['runs']:
        p = (r.get('predicted') or {}).get('step_s')
        if r.get('error') or not r.get('step_s') or p is None:
            continue
        out.append((r, p, r['step_s'], r['step_s'] / p))
    return out


def within(measured, predicted, share=WITHIN):
    return abs(predicted - measured) <= share * measured


def md_table(head, rows):
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def cell_table(result):
    rows = []
    for r, p, m, ratio in cells(result):
        q = r['predicted']
        rows.append((r['workers'], r['model'], r['rate'], '`%s`' % r['scheme'],
                     '%.0f' % (1e3 * p), '%.0f' % (1e3 * m), '%.2f' % ratio,
                     'yes' if within(m, p) else 'no', '%.0f' % (1e3 * r['compute_s']),
                     '%.0f' % (1e3 * q['wire_s']),
                     '%.0f' % (1e3 * ((q['codec_s'] or 0) + (q['server_s'] or 0))),
                     ms_or_dash(q.get('transport_s')), ms_or_dash(q.get('host_s')),
                     serial_words(q, m)))
    return md_table(('W', 'model', 'link', 'scheme', 'predicted ms', 'measured ms',
                     'measured / predicted', 'within 20%', 'compute ms (measured)',
                     'wire ms (pred.)', 'codec+server ms (pred.)',
                     'bytes\' CPU ms (pred.)', 'all nodes\' CPU / cores ms (pred.)',
                     'every push in, then every pull out: ms (within 20%?)'), rows)


def ms_or_dash(seconds):
    return '-' if seconds is None else '%.0f' % (1e3 * seconds)


def serial_words(predicted, measured):
    s = predicted.get('serial_server_step_s')
    if s is None:
        return '-'
    return '%.0f (%s)' % (1e3 * s, 'yes' if within(measured, s) else 'no')


def not_predicted(result):
    """Rows measured but not predicted (a codec's speed unknown) or failed."""
    out = []
    for r in result['runs']:
        if r.get('error'):
            out.append((r['workers'], r['model'], r['rate'], r['scheme'], r['error']))
        elif (r.get('predicted') or {}).get('step_s') is None:
            why = r.get('predict_error') or 'codec speed not measured: %s' % ', '.join(
                (r.get('predicted') or {}).get('unmeasured', [])[:3])
            out.append((r['workers'], r['model'], r['rate'], r['scheme'], why))
    return out


def summary(result):
    """{'cells', 'within', by group: (within, cells)} over the predicted cells."""
    all_cells = cells(result)
    good = [c for c in all_cells if within(c[2], c[1])]
    groups = {}
    for key in ('workers', 'model', 'rate'):
        for c in all_cells:
            g = groups.setdefault((key, c[0][key]), [0, 0])
            g[1] += 1
            g[0] += within(c[2], c[1])
    serial = [c for c in all_cells if c[0]['predicted'].get('serial_server_step_s')
              and within(c[2], c[0]['predicted']['serial_server_step_s'])]
    return {'cells': len(all_cells), 'within': len(good), 'groups': groups,
            'serial_within': len(serial)}


def policy_rows(result):
    """Per (workers, model, rate): auto (given, measured), the best fixed choice and
    dist_sync, measured; whether the 5% and 3% targets hold."""
    by = {}
    for r in result['runs']:
        if r.get('error') or not r.get('step_s'):
            continue
        by.setdefault((r['workers'], r['model'], r['rate_bps']), {})[r['scheme']] = r
    out = []
    for (w, model, bps), runs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                   kv[0][2])):
        # the same step with the cell's median compute time in place of the job's own:
        # the other load on the machine moved compute-only steps by up to 3x between jobs
        compute = statistics.median(r['compute_s'] for r in runs.values())
        adjusted = {s: r['step_s'] - r['compute_s'] + compute for s, r in runs.items()}
        fixed = {s: r['step_s'] for s, r in runs.items() if not is_auto(s)}
        base = runs.get('dist_sync')
        if base is None or 'dist_sync_hylo' not in fixed:
            continue
        # the choices auto makes between: every key float32, or every key Hylo's
        choice = min(('dist_sync', 'dist_sync_hylo'), key=lambda s: fixed[s])
        best_any = min(fixed, key=fixed.get)
        for s, r in runs.items():
            if not is_auto(s):
                continue
            t = r['step_s']
            out.append({
                'workers': w, 'model': model, 'rate': r['rate'], 'scheme': s,
                'auto_s': t, 'best_fixed': choice, 'best_fixed_s': fixed[choice],
                'best_any': best_any, 'best_any_s': fixed[best_any],
                'dist_sync_s': base['step_s'],
                'within_5': t <= (1 + AUTO_WITHIN) * fixed[choice],
                'not_3_slower': t <= (1 + AUTO_NOT_SLOWER) * base['step_s'],
                'adjusted_s': adjusted[s], 'best_fixed_adjusted_s': min(
                    adjusted['dist_sync'], adjusted['dist_sync_hylo']),
                'dist_sync_adjusted_s': adjusted['dist_sync'],
                'compressed': (r.get('predicted') or {}).get('compressed_tensors')})
    return out


def policy_table(result):
    rows = []
    for p in policy_rows(result):
        rows.append((p['workers'], p['model'], p['rate'],
                     'given' if 'link_rate' in p['scheme'] else 'measured',
                     '%.0f' % (1e3 * p['auto_s']),
                     '%s %.0f' % (p['best_fixed'], 1e3 * p['best_fixed_s']),
                     '%.0f' % (1e3 * p['dist_sync_s']),
                     '%.2f' % (p['auto_s'] / p['best_fixed_s']),
                     'yes' if p['within_5'] else '**no**',
                     '%.2f' % (p['auto_s'] / p['dist_sync_s']),
                     'yes' if p['not_3_slower'] else '**no**',
                     '%.2f' % (p['adjusted_s'] / p['best_fixed_adjusted_s']),
                     '%.2f' % (p['adjusted_s'] / p['dist_sync_adjusted_s'])))
    return md_table(('W', 'model', 'link', 'auto: rate', 'auto ms', 'best fixed ms',
                     'dist_sync ms', 'auto / best', 'within 5%', 'auto / dist_sync',
                     'not > 3% slower', 'auto / best, same compute',
                     'auto / dist_sync, same compute'), rows)


def report(result):
    s = summary(result)
    transport = result.get('transport') or {}
    lines = ['# The cost model on the emulated cluster', '',
             'Codec speeds: %s.' % result.get('speeds'), '',
             'Transport CPU: %s; host term: %s.' % (
                 transport.get('source', 'not counted'),
                 '%s cores shared by every node' % result['host_cores']
                 if result.get('host_cores') else 'none'), '',
             '**%d of %d cells within 20%%** of the measured step time.' % (
                 s['within'], s['cells']),
             'Diagnostic, not the model: if the server\'s link carried every push and '
             'then every pull (in + out, no pipeline of keys), %d of %d.' % (
                 s['serial_within'], s['cells']), '']
    for (key, value), (good, n) in sorted(s['groups'].items(), key=str):
        lines.append('* %s %s: %d of %d' % (key, value, good, n))
    lines += ['', '## Cells', '', cell_table(result), '']
    missing = not_predicted(result)
    if missing:
        lines += ['## Not predicted or failed', '',
                  md_table(('W', 'model', 'link', 'scheme', 'why'), missing), '']
    lines += ['## Links (probe: one TCP stream, worker 0 to server 0)', '',
              md_table(('W', 'link', 'probe Mbit/s', 'round trip us'),
                       [(lk['workers'], lk['rate'], '%.0f' % (lk['probe']['rate_bps'] / 1e6),
                         '%.0f' % (1e6 * lk['probe']['rtt_s']))
                        for lk in result['links']]), '',
              "## policy='auto'", '', policy_table(result), '']
    return '\n'.join(lines)


# ------------------------------------------------------------------ plots

def crossing(xs, a, b):
    """The first x (log-interpolated) where series ``a`` stops being below ``b``
    (compression stops paying), or None if it never does / always did."""
    for i in range(1, len(xs)):
        d0, d1 = a[i - 1] - b[i - 1], a[i] - b[i]
        if d0 < 0 <= d1:
            f = d0 / (d0 - d1)
            return math.exp(math.log(xs[i - 1]) + f * (math.log(xs[i]) - math.log(xs[i - 1])))
    return None


def plot_model(result, model, workers, out_path, speeds):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import validate_cost_model as vcm

    runs = [r for r in result['runs'] if r['model'] == model and r['workers'] == workers
            and not r.get('error') and r.get('step_s')]
    if not runs:
        return None
    shapes = vcm.model_shapes(model)
    compute = statistics.median(r['compute_s'] for r in runs)
    latency = statistics.median(r['link']['latency_s'] for r in runs)
    x_of = {}
    for r in runs:
        x_of[r['rate_bps']] = vcm.link_rate_of(r['link'])
    top = max(x_of.values())
    grid = [10 ** (7 + 0.05 * i) for i in range(200) if 10 ** (7 + 0.05 * i) <= 2 * top]
    def series(scheme):      # policy=auto with each rate given: one series
        return 'dist_sync_hylo(policy=auto,link_rate=<the rate>)' if (
            is_auto(scheme) and 'link_rate' in scheme) else scheme

    schemes = []
    for r in runs:
        if series(r['scheme']) not in schemes:
            schemes.append(series(r['scheme']))
    fig, ax = plt.subplots(figsize=(14, 7))
    cmap = plt.get_cmap('tab20')
    lines = {}
    for i, s in enumerate(schemes):
        mine = sorted((r for r in runs if series(r['scheme']) == s),
                      key=lambda r: x_of[r['rate_bps']])
        c = cmap(i % 20)
        kv, params = mine[0]['kvstore'], mine[0]['compression_params']
        if 'link_rate' in params:       # predicted as policy=auto measured: its line
            ys = None
        else:
            ys = [(vcm.predict(shapes, kv, params, workers, mine[0]['servers'], x, latency,
                               compute, speeds, result.get('host_cores'))['step_s'])
                  for x in grid]
        if ys and all(y is not None for y in ys):
            ax.plot([x / 1e6 for x in grid], [1e3 * y for y in ys], '-', color=c, lw=1.2,
                    alpha=0.8)
            lines[s] = ys
        ax.plot([x_of[r['rate_bps']] / 1e6 for r in mine], [1e3 * r['step_s'] for r in mine],
                'o' if ys else 's', color=c, ms=6,
                label=s if ys else s + ' (its line: policy=auto\'s)')
    # where compression stops paying: the lowest predicted line among compressing
    # schemes meets dist_sync's
    title = '%s, %d workers, 1 server: measured (points) over predicted (lines)' % (
        model, workers)
    if 'dist_sync' in lines:
        packed = [s for s in lines if s not in FLOAT32 and not is_auto(s)]
        if packed:
            best = [min(lines[s][i] for s in packed) for i in range(len(grid))]
            x = crossing(grid, best, lines['dist_sync'])
            if x:
                ax.axvline(x / 1e6, color='k', ls='--', lw=1)
                ax.text(x / 1e6, ax.get_ylim()[1], ' predicted crossover\n %.0f Mbit/s' %
                        (x / 1e6), va='top', fontsize=8)
        measured = sorted({r['rate_bps'] for r in runs})
        base = {r['rate_bps']: r['step_s'] for r in runs if r['scheme'] == 'dist_sync'}
        best_m = {}
        for r in runs:
            if r['scheme'] not in FLOAT32 and not is_auto(r['scheme']):
                best_m[r['rate_bps']] = min(best_m.get(r['rate_bps'], 1e9), r['step_s'])
        xs = [b for b in measured if b in base and b in best_m]
        x = crossing([x_of[b] for b in xs], [best_m[b] for b in xs], [base[b] for b in xs])
        if x:
            ax.axvline(x / 1e6, color='r', ls=':', lw=1.5)
            ax.text(x / 1e6, ax.get_ylim()[0], ' measured crossover\n %.0f Mbit/s' %
                    (x / 1e6), va='bottom', fontsize=8, color='r')
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('link rate, Mbit/s (unshaped: the probe\'s TCP rate)')
    ax.set_ylabel('step time, ms')
    ax.set_title(title, fontsize=10)
    ax.grid(True, which='both', alpha=0.3)
    for b, x in x_of.items():
        if b == float('inf'):
            ax.annotate('unshaped', (x / 1e6, ax.get_ylim()[0]), fontsize=8, ha='center',
                        va='bottom')
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--json', default=os.path.join(HERE, 'results',
                                                       'cost_model_validation.json'))
    parser.add_argument('--out-dir', default=os.path.join(HERE, 'results'))
    parser.add_argument('--no-plots', action='store_true')
    args = parser.parse_args(argv)
    with open(args.json) as f:
        result = json.load(f)
    text = report(result)
    with open(os.path.join(args.out_dir, 'cost_model_validation.md'), 'w') as f:
        f.write(text + '\n')
    print(text)
    if not args.no_plots:
        import validate_cost_model as vcm
        # the speeds the rows were last predicted with (--predict-only records them)
        path = result.get('speeds_file', result['config'].get('speeds'))
        speeds = vcm.load_speeds(path and os.path.join(os.path.dirname(HERE), path))
        first = min(r['workers'] for r in result['runs']) if result['runs'] else None
        for model in sorted({r['model'] for r in result['runs']}):
            path = plot_model(result, model, first,
                              os.path.join(args.out_dir, 'cost_model_%s.png' % model), speeds)
            if path:
                print('wrote', path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
