"""Which kvstore type pays on your model and link? ``python -m kvstore_ext.advise``.

Why: compression costs encode and decode time and saves link time; which wins depends
on the model, the workers and servers, the link and the compute time of a step. This
prints the cost model's prediction (kvstore_ext/cost.py, docs/COST_MODEL.md) for MXNet's
``dist_sync`` and every registered scheme and aggregation mode, names the fastest, and
says what accuracy evidence this repository has for each (a short static table: the
prediction is about time only).

    python -m kvstore_ext.advise --model resnet50_v1 --workers 8 --servers 2 \\
        --link 10Gbit --compute-ms 250
    python -m kvstore_ext.advise --shapes shapes.json --workers 4 --link 100Mbit \\
        --compute-ms 40 --calibrate

``--shapes``: a JSON object {parameter name: shape}, in the order the trainer pushes
them. ``--model``: a gluoncv model-zoo name; the net is built with random weights
(nothing is downloaded) and run once on a zero image to learn its shapes.
"""
import argparse
import json
import sys

import numpy as np

# What docs/RESULTS.md (and the bench/results files it names) shows about each kvstore
# type's accuracy against dist_sync. All of it is MNIST-size models (cnn512, the MLP,
# LeNet) trained on CPU; nothing for ImageNet-size models.
_HYLO_DEFAULT = ('within 0.5 points of dist_sync, shown by a one-sided bound, in all 12 '
                 'MNIST cells (cnn512, MLP, LeNet; 4 and 8 workers; short and long runs): '
                 'docs/RESULTS.md ("Hylo\'s accuracy matrix"), '
                 'hylo_fc_momentum_correction_8w.json, hylo_masking_high_rate_8w_long.json')
_DEFAULTS_4W = ('shown within 1 point of dist_sync at its defaults (cnn512, 4 workers, '
                'short run; docs/RESULTS.md, "Every scheme at its defaults")')
_LONG_4W = ('within 0.5 points on the mean on cnn512 and the MLP at 4 workers, long '
            'runs, 2 seeds (not shown): schemes_4w_long.json')
EVIDENCE = {
    'dist_sync': 'the baseline',
    'dist_sync_none': 'no compression: the same float32 sums as dist_sync',
    'dist_sync_hylo': _HYLO_DEFAULT,
    'dist_sync_hylo:aggregation=server':
        'within 0.5 points of dist_sync, shown by a one-sided bound, in 11 of the 12 MNIST '
        'cells; on cnn512 at 4 workers, short, 38 seeds do not resolve it (loss +0.38 +- '
        '1.01 points, bound 0.66): docs/RESULTS.md ("Hylo\'s accuracy matrix"), '
        'loopback_step_4w_cnn512.json',
    'dist_sync_hylo:aggregation=server,pull=compressed':
        'not within 0.5: about 1 point below dist_sync on cnn512 at 4 workers (short, 16 '
        'seeds, +0.97 +- 1.19) and half a point on the MLP: '
        'docs/decisions/hylo-compressed-pull.md, '
        'hylo_compressed_pull.json',
    'dist_sync_2bit': 'does not train the MNIST CNN (ends near 58%; other thresholds did '
                      'not fix it): docs/RESULTS.md ("Time to accuracy"), '
                      'accuracy_2bit_thresholds.json',
    'dist_sync_thc': _DEFAULTS_4W + '; ' + _LONG_4W + '; 8 workers short: MLP shown '
                     'within 0.5 (schemes_8w_short_thc_powersgd_lgreco_dad.json)',
    'dist_sync_fp16': _DEFAULTS_4W + ' (no error feedback: '
                      'docs/decisions/fp16-error-feedback.md); with error feedback, '
                      + _LONG_4W + '; 8 workers short: MLP equal to dist_sync '
                      '(schemes_8w_short_topk_fp16_adacomp.json)',
    'dist_sync_powersgd': _DEFAULTS_4W + ' (its bytes rule: '
                          'docs/decisions/powersgd-bytes-rule.md); with the former size '
                          'rule, ' + _LONG_4W,
    'dist_sync_lgreco': _DEFAULTS_4W + '; ' + _LONG_4W + '; within a point at 8 workers '
                        'on cnn512 (schemes_8w_short_thc_powersgd_lgreco_dad.json)',
    'dist_sync_adacomp': _DEFAULTS_4W + '; ' + _LONG_4W,
    'dist_sync_dad': _DEFAULTS_4W + '; ' + _LONG_4W + ' (its Dense layers are modelled '
                     'here as its fallback, Hylo: dAD\'s size depends on the batch)',
    'dist_sync_topk': _DEFAULTS_4W + '; at the former ratio 0.01: ' + _LONG_4W +
                      ', and 14.4 points below on cnn512 at 8 workers, short '
                      '(schemes_8w_short_topk_fp16_adacomp.json)',
    'dist_sync_lgreco_hylo': _DEFAULTS_4W + '; 9 points below on cnn512 at 8 workers '
                             'before Hylo\'s 8-worker fixes, not measured since: '
                             'lgreco_hylo_8w_short.json',
}
EVIDENCE['dist_sync_lgreco_hylo:aggregation=server'] = (
    'within noise of dist_sync at 4 workers, short, 3 seeds, before the defaults run: '
    'lgreco_hylo_4w_short.json')
NO_EVIDENCE = 'no evidence'
# shown (a one-sided bound) within 0.5 points of dist_sync on every cell measured
SHOWN_WITHIN_HALF_POINT = ('dist_sync', 'dist_sync_none', 'dist_sync_hylo')


class UsageError(ValueError):
    """A bad argument: the message says which and why."""


def read_shapes(path):
    """{name: shape} of a JSON file, checked."""
    try:
        with open(path) as f:
            shapes = json.load(f)
    except OSError as e:
        raise UsageError('--shapes %s: cannot read it (%s)' % (path, e.strerror))
    except ValueError as e:
        raise UsageError('--shapes %s: not JSON (%s)' % (path, e))
    if not isinstance(shapes, dict) or not shapes:
        raise UsageError('--shapes %s: expected a JSON object {parameter name: shape}, '
                         'with at least one parameter' % path)
    out = {}
    for name, shape in shapes.items():
        if not isinstance(shape, list) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise UsageError('--shapes %s: parameter %r: a shape is a non-empty list of '
                             'positive integers, got %r' % (path, name, shape))
        out[name] = tuple(shape)
    return out


def model_shapes(name, input_size=None):
    """{parameter name: shape} of a gluoncv model-zoo model's trainable parameters, in
    the order Gluon's Trainer pushes them; no weights are downloaded."""
    import mxnet as mx
    from gluoncv import model_zoo
    if name.lower() not in model_zoo.get_model_list():
        raise UsageError('--model %r: not a gluoncv model-zoo name (see '
                         'gluoncv.model_zoo.get_model_list())' % name)
    net = model_zoo.get_model(name, pretrained=False)
    net.initialize()
    if input_size is None:
        input_size = 32 if name.lower().startswith('cifar') else \
            299 if 'inception' in name.lower() else 224
    net(mx.nd.zeros((1, 3, input_size, input_size)))
    return {p.name: p.shape for p in net.collect_params().values() if p.grad_req != 'null'}


def predict(shapes, workers, servers, link, compute_seconds, overlap=0.0, speeds=None):
    """[(label, cost.StepCost)] for dist_sync and every scheme and mode."""
    from . import cost
    from .registry import SCHEMES
    from .schemes import NoCompression
    rows = [('dist_sync', cost.scheme_step(NoCompression(), shapes, workers, servers, link,
                                           compute_seconds, speeds, overlap,
                                           mxnet_dist_sync=True))]
    for label, name, params in cost.variants(SCHEMES):
        rows.append((label, cost.scheme_step(SCHEMES[name](**params), shapes, workers,
                                             servers, link, compute_seconds, speeds,
                                             overlap)))
    return rows


def fastest(rows, among=None):
    """The (label, StepCost) of the least predicted step time (dist_sync on a tie),
    among the labels ``among`` if given."""
    timed = [r for r in rows if r[1].step_seconds is not None
             and (among is None or r[0] in among)]
    return min(timed, key=lambda r: (r[1].step_seconds, r[0] != 'dist_sync'))


def report(rows, speeds_source):
    base = dict(rows)['dist_sync'].step_seconds
    lines = ['%-56s %10s %10s %9s %9s %9s %9s %9s %8s' % (
        'kvstore', 'push MB', 'pull MB', 'wire ms', 'codec ms', 'server ms', 'bytes ms',
        'step ms', 'speed-up')]
    for label, c in rows:
        ms = (lambda s: '-' if s is None else '%.2f' % (1e3 * s))
        lines.append('%-56s %10.3f %10.3f %9.2f %9s %9s %9.2f %9s %8s' % (
            label, c.bytes_push / 1e6, c.bytes_pull / 1e6, 1e3 * c.wire_seconds,
            ms(c.codec_seconds), ms(c.server_seconds), 1e3 * c.transport_seconds,
            ms(c.step_seconds),
            '-' if c.step_seconds is None else '%.2fx' % (base / c.step_seconds)))
    missing = [label for label, c in rows if c.step_seconds is None]
    lines.append('')
    lines.append('bytes per worker per step (MB = 10^6 B); bytes ms: the CPU the busier node '
                 'spends moving them; speed-up = dist_sync step / step; codec speeds: %s'
                 % speeds_source)
    if missing:
        lines.append('codec speed not measured (step not predicted; run with --calibrate): '
                     + ', '.join(missing))
    label, best = fastest(rows)
    lines.append('fastest: %s, %.2f ms a step (%.2fx dist_sync)' % (
        label, 1e3 * best.step_seconds, base / best.step_seconds))
    lines.append('accuracy evidence for %s: %s' % (label, EVIDENCE.get(label, NO_EVIDENCE)))
    if label not in SHOWN_WITHIN_HALF_POINT:
        label, best = fastest(rows, SHOWN_WITHIN_HALF_POINT)
        lines.append('fastest of those shown within 0.5 points of dist_sync: %s, %.2f ms '
                     '(%.2fx)' % (label, 1e3 * best.step_seconds, base / best.step_seconds))
    lines.append('')
    lines.append('accuracy evidence (docs/RESULTS.md; files in bench/results/):')
    for label, _ in rows:
        lines.append('  %s: %s' % (label, EVIDENCE.get(label, NO_EVIDENCE)))
    return '\n'.join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog='python -m kvstore_ext.advise',
        description='Predict the bytes and step time of dist_sync and of every kvstore_ext '
                    'scheme and mode on a model and link, name the fastest, and print '
                    'the accuracy evidence the repository has for each.',
        epilog='Model and assumptions: docs/COST_MODEL.md.')
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--model', help='gluoncv model-zoo name, e.g. resnet50_v1')
    source.add_argument('--shapes', help='JSON file {parameter name: shape}')
    parser.add_argument('--input-size', type=int, default=None,
                        help='--model: image side (default 224; 32 for cifar_*, 299 for '
                             'inception)')
    parser.add_argument('--workers', type=int, default=4, help='workers (default 4)')
    parser.add_argument('--servers', type=int, default=1, help='servers (default 1)')
    parser.add_argument('--link', required=True,
                        help="every node's link rate, e.g. 10Gbit, 100Mbit")
    parser.add_argument('--latency', default='50us',
                        help='one-way latency between nodes (default 50us)')
    parser.add_argument('--compute-ms', type=float, required=True,
                        help='forward + backward + optimizer time of a step, ms')
    parser.add_argument('--overlap', type=float, default=0.0,
                        help='fraction of the compute time that communication may hide '
                             'behind (default 0: none)')
    parser.add_argument('--calibrate', action='store_true',
                        help="time every codec on this machine (one-process store, the "
                             "model's shapes) instead of the shipped kernel timings and "
                             "codec class table")
    parser.add_argument('--repeats', type=int, default=3, help='--calibrate: steps timed')
    parser.add_argument('--json', help='also write the predictions here')
    args = parser.parse_args(argv)
    for flag, value, low in (('--workers', args.workers, 1), ('--servers', args.servers, 1),
                             ('--repeats', args.repeats, 1)):
        if value < low:
            parser.error('%s must be >= %d, got %d' % (flag, low, value))
    if not args.compute_ms >= 0:
        parser.error('--compute-ms must be >= 0, got %r' % args.compute_ms)
    if not 0 <= args.overlap <= 1:
        parser.error('--overlap must be within [0, 1], got %r' % args.overlap)
    if args.input_size is not None and args.input_size < 1:
        parser.error('--input-size must be >= 1, got %d' % args.input_size)
    from . import cost
    try:
        args.rate = cost.parse_rate(args.link)
        args.latency_s = cost.parse_duration(args.latency)
    except ValueError as e:
        parser.error(str(e))
    return parser, args


def main(argv=None):
    parser, args = parse_args(sys.argv[1:] if argv is None else argv)
    from . import cost
    try:
        shapes = read_shapes(args.shapes) if args.shapes else \
            model_shapes(args.model, args.input_size)
    except UsageError as e:
        parser.error(str(e))
    link = cost.Link(args.rate, args.latency_s)
    speeds = cost.KernelSpeeds()
    if args.calibrate:
        from .cost_calibrate import calibrate
        from .registry import SCHEMES
        speeds = calibrate(cost.variants(SCHEMES), shapes, repeats=args.repeats)
    rows = predict(shapes, args.workers, args.servers, link, args.compute_ms / 1e3,
                   args.overlap, speeds)
    elements = sum(int(np.prod(s)) for s in shapes.values())
    print('%s: %d tensors, %d parameters; %d workers, %d servers, link %s, latency %s, '
          'compute %.2f ms, overlap %g' % (args.model or args.shapes, len(shapes), elements,
                                           args.workers, args.servers, args.link,
                                           args.latency, args.compute_ms, args.overlap))
    print(report(rows, speeds.source))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'config': {k: v for k, v in vars(args).items()},
                       'rows': [dict(kvstore=label, **{k: v for k, v in vars(c).items()
                                                       if k not in ('tensors', 'codecs')})
                                for label, c in rows]}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
