"""ResNet-50 and VGG-16 on the emulated cluster, and what the cost model makes of them at
the scale users train them.

The small models of bench/cluster.py say how the schemes behave; users ask about the
models they train. This benchmark has two parts:

``measure``
    bench/cluster.py's jobs for gluoncv's ``resnet50_v1`` (25.6 M parameters) and
    ``vgg16`` (138 M), random weights, synthetic 224x224 images, a batch of 1 a worker
    (what 2 shared cores compute in a second or two), 2 workers and 1 server, each node
    in its own network namespace behind a link shaped to each rate: bytes per step and
    step time per scheme, next to what kvstore_ext/cost.py predicts for that run from
    the run's own measured compute time.

``extrapolate``
    the cost model alone (``python -m kvstore_ext.advise``'s ``predict``), for 16 to
    1,024 workers (as many servers as workers, the usual co-located placement) and
    1 to 100 Gbit/s, for a compute time per step the user gives (``--compute-ms``;
    nothing on these cores measures a GPU's): per cell, the fastest scheme and its
    speed-up over dist_sync, and the speed-up of Hylo's default. Every node has its own
    cores there, so the model's host term (every node's CPU over one host's cores)
    is left out; the transport CPU per node stays (docs/COST_MODEL.md).

Codec speeds are measured on this machine on the models' own shapes (cost_calibrate),
as ``advise --calibrate`` does, once: into ``--speeds`` (real_models_calibration.json,
with the load average meanwhile), which every command reuses, timing only the codecs
it lacks (delete it to time them all again). A GPU encoder would be faster, so these
favour dist_sync. The measured rows (2 workers, 1 server, a scheduler on this
machine's cores) are predicted with the host term at ``--host-cores``, as
bench/validate_cost_model.py predicts its jobs.

    sudo python bench/real_models.py measure        # real_models_cluster.json
    python bench/real_models.py predict             # its predictions again, no jobs
    python bench/real_models.py extrapolate         # real_models_scale.json

(all written into bench/results/ unless ``--json`` or ``--speeds`` says otherwise)

Measures step times: run ``measure`` on a quiet machine.
"""
import argparse
import json
import logging
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

MODELS = ['resnet50_v1', 'vgg16']
RATES = '1gbit,4gbit'
SCHEMES = ['dist_sync', 'dist_sync_hylo', 'dist_sync_hylo:aggregation=server',
           'dist_sync_powersgd', 'dist_sync_fp16', 'dist_sync_thc']
WORKERS = [16, 64, 256, 1024]
LINKS = ['1Gbit', '10Gbit', '100Gbit']
COMPUTE_MS = {'resnet50_v1': 100.0, 'vgg16': 200.0}   # a GPU's step at batch 32, roughly
SPEEDS = os.path.join(HERE, 'results', 'real_models_calibration.json')
REPEATS = 2       # calibration: best of 2 steps a codec (ResNet-50 and VGG-16 are big)


def shapes_of(model):
    from kvstore_ext import advise
    return advise.model_shapes(model)


def predict_run(row, shapes, speeds, host_cores=None):
    """The cost model's step of one measured cluster row (validate_cost_model.predict),
    from the row's own compute time; ``host_cores``: the cores all its nodes shared (the
    host term); its 'step_s' is None when a codec's speed is unknown."""
    import validate_cost_model
    return validate_cost_model.predict(
        shapes, row['kvstore'], row['compression_params'], row['num_workers'],
        row['num_servers'], row['rate_bps'], 0.0, row['compute_s'], speeds, host_cores)


def speeds_for(path, models):
    """The codec speeds of ``models``' shapes: the speeds file ``path``, with what it
    lacks calibrated and added first (validate_cost_model.calibrate_into)."""
    import validate_cost_model
    from kvstore_ext import cost
    from kvstore_ext.registry import SCHEMES as REGISTERED
    shapes = {'%s/%s' % (m, k): s for m in models for k, s in shapes_of(m).items()}
    return validate_cost_model.calibrate_into(path, cost.variants(REGISTERED), shapes,
                                              REPEATS)


def speeds_record(path, speeds):
    """What a results file says of its codec speeds: the file, its source and its
    calibrations' load averages."""
    with open(path) as f:
        calibrations = json.load(f).get('calibrations', [])
    return {'file': os.path.relpath(os.path.abspath(path), os.path.dirname(HERE)),
            'source': speeds.source,
            'loadavg': [(c['loadavg_before'][0], c['loadavg_after'][0])
                        for c in calibrations]}


def add_predictions(out, models, speeds_path, host_cores):
    """Each measured row's prediction, codec speeds calibrated on the models' shapes
    (once: ``speeds_path``), the host term at ``host_cores`` (None: none)."""
    speeds = speeds_for(speeds_path, models)
    for model in models:
        shapes = shapes_of(model)
        for row in out['runs']:
            if row.get('model') == model and not row.get('error'):
                row['predicted'] = predict_run(row, shapes, speeds, host_cores)
    out['speeds'] = speeds_record(speeds_path, speeds)
    out['host_cores'] = host_cores


def predict(args):
    """Predictions again for a measured file (the jobs are not re-run)."""
    with open(args.json) as f:
        out = json.load(f)
    add_predictions(out, sorted({r['model'] for r in out['runs'] if r.get('model')}),
                    args.speeds, args.host_cores)
    _write(args.json, out)
    return 0


def measure(args):
    import cluster
    out = {'config': {k: v for k, v in vars(args).items() if k != 'func'}, 'runs': []}
    code = 0
    for rate in args.rates.split(','):
        with tempfile.TemporaryDirectory(prefix='kvx-real-') as tmp:
            part = os.path.join(tmp, 'cluster.json')
            code = max(code, cluster.main(
                ['-n', '2', '-s', '1', '--rate', rate, '--models'] + args.models +
                ['--schemes'] + args.schemes +
                ['--steps', str(args.steps), '--warmup', str(args.warmup),
                 '--batch-size', '1', '--timeout', str(args.timeout), '--json', part,
                 '--prefix', args.prefix, '--subnet', args.subnet]))
            runs = json.load(open(part))['runs'] if os.path.exists(part) else []
        for row in runs:
            row['num_workers'], row['num_servers'] = 2, 1
        out['runs'] += runs
        _write(args.json, out)                   # after every rate: a partial run stays
    add_predictions(out, args.models, args.speeds, args.host_cores)
    _write(args.json, out)
    return code


def extrapolate(args):
    from kvstore_ext import advise, cost
    compute = dict(COMPUTE_MS)
    for item in args.compute_ms or []:
        model, _, ms = item.partition('=')
        compute[model] = float(ms)
    speeds = speeds_for(args.speeds, args.models)
    out = {'config': {'workers': args.workers, 'links': args.links, 'compute_ms': compute,
                      'servers': 'as many as workers', 'latency': '50us',
                      'overlap': 0.0, 'codec speeds': 'calibrated on this machine',
                      'host term': 'none: every node its own cores'},
           'speeds': speeds_record(args.speeds, speeds), 'cells': []}
    for model in args.models:
        shapes = shapes_of(model)
        for workers in args.workers:
            for link_text in args.links:
                link = cost.Link(cost.parse_rate(link_text), 50e-6)
                rows = advise.predict(shapes, workers, workers, link,
                                      compute[model] / 1e3, 0.0, speeds)
                base = dict(rows)['dist_sync'].step_seconds
                label, best = advise.fastest(rows)
                steps = {lab: c.step_seconds for lab, c in rows}
                out['cells'].append({
                    'model': model, 'workers': workers, 'link': link_text,
                    'compute_ms': compute[model], 'dist_sync_ms': 1e3 * base,
                    'fastest': label, 'fastest_ms': 1e3 * best.step_seconds,
                    'fastest_speedup': base / best.step_seconds,
                    'hylo_speedup': base / steps['dist_sync_hylo'],
                    'step_ms': {lab: None if s is None else 1e3 * s
                                for lab, s in steps.items()}})
                print('%-12s %5d workers %7s: dist_sync %.0f ms, fastest %s %.2fx, '
                      'hylo %.2fx' % (model, workers, link_text, 1e3 * base, label,
                                      base / best.step_seconds,
                                      base / steps['dist_sync_hylo']), flush=True)
    _write(args.json, out)
    return 0


def _write(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
        json.dump(data, f, indent=1)
    os.replace(path + '.tmp', path)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True)
    m = sub.add_parser('measure', help='2 workers on the emulated cluster (needs root)')
    m.add_argument('--models', nargs='+', default=MODELS)
    m.add_argument('--rates', default=RATES, help='tc units, comma-separated (%(default)s)')
    m.add_argument('--schemes', nargs='+', default=SCHEMES)
    m.add_argument('--steps', type=int, default=3)
    m.add_argument('--warmup', type=int, default=1)
    m.add_argument('--timeout', type=float, default=900, help='seconds per job')
    m.add_argument('--prefix', default='kvxreal',
                   help='namespace prefix (another than a concurrent cluster.py run\'s)')
    m.add_argument('--subnet', default='10.213.0.0/24')
    m.add_argument('--json', default=os.path.join(HERE, 'results',
                                                  'real_models_cluster.json'))
    m.set_defaults(func=measure)
    p = sub.add_parser('predict', help='the predictions again for a measured file')
    p.add_argument('--json', default=os.path.join(HERE, 'results',
                                                  'real_models_cluster.json'))
    p.set_defaults(func=predict)
    for command in (m, p):
        command.add_argument('--host-cores', type=int, default=os.cpu_count(),
                             help='cores every node of the measured jobs shared: the '
                                  'model\'s host term (default: this machine\'s, '
                                  '%(default)s); 0: none')
    e = sub.add_parser('extrapolate', help='the cost model at 16-1,024 workers')
    e.add_argument('--models', nargs='+', default=MODELS)
    e.add_argument('--workers', nargs='+', type=int, default=WORKERS)
    e.add_argument('--links', nargs='+', default=LINKS)
    e.add_argument('--compute-ms', nargs='+', metavar='MODEL=MS',
                   help='compute time of a step per model (default %s)' % COMPUTE_MS)
    e.add_argument('--json', default=os.path.join(HERE, 'results', 'real_models_scale.json'))
    e.set_defaults(func=extrapolate)
    for command in (m, p, e):
        command.add_argument('--speeds', default=SPEEDS,
                             help='codec speeds file: made once, then reused and '
                                  'completed (%(default)s)')
    args = parser.parse_args(argv)
    if getattr(args, 'host_cores', None) is not None:
        if args.host_cores < 0:
            parser.error('--host-cores must be >= 0, got %d' % args.host_cores)
        args.host_cores = args.host_cores or None
    return args


def main(argv=None):
    args = parse_args(argv)
    # The one-process stores that calibrate the codecs have no optimizer: their warning
    # that momentum correction stays off is true and beside the point here.
    # The level is put back: tests run main in their own process.
    log = logging.getLogger('kvstore_ext')
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return args.func(args)
    finally:
        log.setLevel(level)


if __name__ == '__main__':
    sys.exit(main())
