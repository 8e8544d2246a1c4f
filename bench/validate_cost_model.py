"""The cost model against the emulated cluster: predicted and measured step time.

Why: docs/COST_MODEL.md predicts a step's time from the model's shapes, the workers,
the servers, the link and the codecs' speeds; a user (``kvstore_ext.advise``) and
Hylo's ``policy='auto'`` act on those predictions. They are worth what they predict on
a network, so this runs every scheme on bench/cluster.py's emulated cluster (one
network namespace per node, tc-shaped links; needs root, docs/CLUSTER.md) and puts
the model's prediction next to each measurement.

For each worker count (its own list of schemes), link rate, model and scheme it runs
one cluster.py job (``cluster.run_one``: median step time, median compute-only time,
bytes on the links) and predicts that job's step with ``cost.step_cost``, from

* the model's parameter shapes (bench/cluster_worker.py's model), the workers, the
  servers and the scheme's plan (``cost.plan``, as the store plans);
* the link: the tc rate; for an unshaped link (rate ``none``) the rate a single TCP
  stream reaches between a worker's and a server's namespace (``probe_link``, run
  before the jobs of that rate); the one-way latency: half the probe's median
  round trip;
* the compute time: the job's own MEASURED compute-only step, an input of the model;
* the codecs' speeds: ``--speeds`` (a ``cost_calibrate`` run on this machine, made by
  ``--calibrate`` before the sweep), falling back to the shipped kernel table.

Nothing is fitted to the step times. ``policy='auto'`` with a measured rate
(link_rate=0) is predicted with the link's rate given, the rate it should measure; its
row's ``policy`` holds the rate it did agree on (with each worker's fit) and its choice
per key (``cluster.policy_of``).

    sudo .venv/bin/python bench/validate_cost_model.py --calibrate   # once, seconds
    sudo .venv/bin/python bench/validate_cost_model.py --stop-at 10:45

Rows are written to ``--json`` after every job, so a stopped sweep keeps what it has;
``--stop-at HH:MM`` (UTC) starts no job after that time; ``--append`` adds to the file's
rows (the sweep in parts, e.g. the slowest rates last). ``--predict-only`` re-predicts
an existing file's rows (another speeds file, say) without running anything.
bench/plot_cost_model.py makes the table and plots.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import cluster  # noqa: E402
import netns  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, 'results', 'cost_model_validation.json')
DEFAULT_SPEEDS = os.path.join(HERE, 'results', 'cost_model_calibration.json')
DEFAULT_RATES = '50mbit,200mbit,1gbit,none'
AUTO_MEASURED = 'dist_sync_hylo:policy=auto'
# every registered scheme with its defaults, Hylo's server mode and MXNet's float32
ALL_SCHEMES = ['dist_sync', 'dist_sync_none', 'dist_sync_hylo',
               'dist_sync_hylo:aggregation=server', 'dist_sync_2bit', 'dist_sync_fp16',
               'dist_sync_thc', 'dist_sync_powersgd', 'dist_sync_adacomp',
               'dist_sync_topk', 'dist_sync_lgreco', 'dist_sync_lgreco_hylo',
               'dist_sync_dad', AUTO_MEASURED, 'AUTO_GIVEN']
FEW_SCHEMES = ['dist_sync', 'dist_sync_hylo', AUTO_MEASURED, 'AUTO_GIVEN']
# (workers, schemes) in the order they run: all schemes at 2 workers first
DEFAULT_PLAN = [(2, ALL_SCHEMES), (4, FEW_SCHEMES), (8, FEW_SCHEMES)]
PROBE_SECONDS = 2.0
PROBE_PORT = 5399

# ------------------------------------------------------------------ predictions


def model_shapes(model):
    """{name: shape} of cluster_worker's ``model``, trainable parameters in the order
    Gluon's Trainer pushes them."""
    import mxnet as mx
    import cluster_worker
    net = cluster_worker.build_model(model)
    net.initialize()
    side = cluster_worker.image_size(model)
    net(mx.nd.zeros((1, 3, side, side)))
    return {p.name: tuple(p.shape) for p in net.collect_params().values()
            if p.grad_req != 'null'}


def scheme_of(kvstore, params):
    """The kvstore_ext Scheme a job ran; MXNet's dist_sync as float32 keys (NoCompression)."""
    from kvstore_ext.registry import SCHEMES
    from kvstore_ext.schemes import NoCompression
    if kvstore == 'dist_sync':
        if params:
            raise ValueError('dist_sync with compression_params %r: not modelled' % params)
        return NoCompression()
    name = kvstore[len('dist_sync_'):]
    if not kvstore.startswith('dist_sync_') or name not in SCHEMES:
        raise ValueError('kvstore %r: not a registered scheme' % kvstore)
    return SCHEMES[name](**params)


def predict(shapes, kvstore, params, workers, servers, rate_bits, latency_s,
            compute_s, speeds=None, host_cores=None):
    """The cost model's step of one job: a dict of seconds and bytes per worker.

    ``rate_bits``: the link's rate (bits/s); ``compute_s``: the job's measured
    compute-only step; ``host_cores``: the cores every node of the emulated cluster
    shares (None: each node its own, as on a real cluster). policy='auto' with
    link_rate=0 is predicted as if it had measured ``rate_bits``."""
    from kvstore_ext import cost
    params = dict(params)
    if params.get('policy') == 'auto' and not params.get('link_rate'):
        params['link_rate'] = rate_bits
    step = cost.scheme_step(scheme_of(kvstore, params), shapes, workers, servers,
                            cost.Link(rate_bits / 8.0, latency_s), compute_s, speeds,
                            mxnet_dist_sync=kvstore == 'dist_sync', host_cores=host_cores)
    compressed = sum(1 for c in step.codecs.values() if not c.passthrough)
    serial = None
    if servers == 1 and step.step_seconds is not None:
        # not the model: the same step if the server's link carried all pushes, then
        # all pulls (in + out): the bound the keys' pipeline (pipeline.py) reaches for
        # one key; without the host term
        serial = compute_s + step.codec_seconds + step.server_seconds + \
            step.transport_seconds + workers * (step.bytes_push + step.bytes_pull) / (
                rate_bits / 8.0) + 2 * latency_s * step.rounds
    return {'step_s': step.step_seconds, 'serial_server_step_s': serial,
            'wire_s': step.wire_seconds, 'pipeline_s': step.pipeline_seconds,
            'busiest_link_s': max(step.worker_link_seconds, step.server_link_seconds),
            'transport_s': step.transport_seconds, 'host_s': step.host_seconds,
            'codec_s': step.codec_seconds, 'server_s': step.server_seconds,
            'compute_s': compute_s, 'bytes_push': step.bytes_push,
            'bytes_pull': step.bytes_pull, 'rounds': step.rounds,
            'compressed_tensors': compressed, 'unmeasured': step.unmeasured}


def save_speeds(speeds, path, calibrations=()):
    """A cost_calibrate result as JSON: {codec signature: [worker s, server s per slot]},
    and ``calibrations``: what each calibration that made it timed, and the machine's
    load average meanwhile (a loaded machine reads slower codecs)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    saved = {'source': speeds.source,
             'measured': {k: list(v) for k, v in sorted(speeds.measured.items())}}
    if calibrations:
        saved['calibrations'] = list(calibrations)
    with open(path, 'w') as f:
        json.dump(saved, f, indent=1)


def calibrate_into(path, variants, shapes, repeats, again=()):
    """MeasuredSpeeds of the speeds file ``path`` after timing (cost_calibrate) the codecs
    that ``variants`` plan for ``shapes`` and the file lacks, and adding them to it (every
    codec if there is no file): a second command, or a plan that grew, reuses what is
    measured. ``again``: codec class names whose entries are timed anew (their code
    changed). Each calibration that times something is recorded in the file with the
    load average before and after it."""
    from kvstore_ext.cost_calibrate import calibrate
    saved = {'source': None, 'measured': {}, 'calibrations': []}
    if os.path.exists(path):
        with open(path) as f:
            saved.update(json.load(f))
    stale = [k for k in saved['measured'] if k.split('(')[0] in again]
    for k in stale:
        del saved['measured'][k]
    before, started = os.getloadavg(), time.monotonic()
    new = calibrate(variants, shapes, repeats=repeats, known=saved['measured'])
    if new.measured or not os.path.exists(path):
        after = os.getloadavg()
        record = {'codecs': sorted(new.measured), 'repeats': repeats,
                  'seconds': round(time.monotonic() - started, 1),
                  'loadavg_before': [round(x, 2) for x in before],
                  'loadavg_after': [round(x, 2) for x in after],
                  'cpu_count': os.cpu_count()}
        how = 'one worker, best of %d, load average %.1f then %.1f' % (
            repeats, before[0], after[0])
        source = 'calibrated on this machine (%s)' % how
        if saved['measured']:
            again_n = len(set(new.measured) & set(stale))
            added_n = len(new.measured) - again_n
            what = '; '.join(
                ([('%d codecs of %s timed again' % (again_n, ', '.join(again)))]
                 if again_n else []) +
                (['%d codecs added later' % added_n] if added_n else []))
            source = '%s; %s (%s)' % (saved['source'], what, how)
        merged = dict({k: tuple(v) for k, v in saved['measured'].items()}, **new.measured)
        from kvstore_ext import cost
        save_speeds(cost.MeasuredSpeeds(merged, source=source), path,
                    saved['calibrations'] + [record])
        print('calibrated %d codecs in %.0f s (load average %.1f, then %.1f): %s' % (
            len(new.measured), record['seconds'], before[0], after[0], path),
            file=sys.stderr, flush=True)
    return load_speeds(path)


def load_speeds(path):
    """MeasuredSpeeds of a save_speeds file, the shipped table for what it lacks; or
    the shipped table alone if ``path`` is None."""
    from kvstore_ext import cost
    if path is None:
        return cost.KernelSpeeds()
    with open(path) as f:
        saved = json.load(f)
    return cost.MeasuredSpeeds({k: tuple(v) for k, v in saved['measured'].items()},
                               fallback=cost.KernelSpeeds(), source=saved['source'])


def transport_of(speeds):
    """The transport CPU constants ``speeds`` carry (cost.TransportCPU), with their
    source, as stored beside the predictions."""
    from kvstore_ext import cost
    transport = speeds.transport
    return dict({k: getattr(transport, k) for k in cost.TransportCPU.FIELDS},
                source=transport.source)


def link_rate_of(link):
    """Bits/s the model is given for a link record: the tc rate, or the probe's if
    unshaped."""
    if link['rate_bps'] != float('inf'):
        return link['rate_bps']
    return link['probe']['rate_bps']


def predict_row(row, shapes, speeds, host_cores=None):
    """``row`` with 'predicted' set (or 'predict_error'), from its link and compute."""
    row.pop('predict_error', None)
    try:
        row['predicted'] = predict(
            shapes, row['kvstore'], row['compression_params'], row['workers'],
            row['servers'], link_rate_of(row['link']), row['link']['latency_s'],
            row['compute_s'], speeds, host_cores)
    except (ValueError, TypeError, KeyError) as e:
        row['predicted'] = None
        row['predict_error'] = '%s: %s' % (type(e).__name__, e)
    return row


# ------------------------------------------------------------------ the link probe

PROBE_SERVER = r'''
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(60)
c, _ = s.accept(); c.settimeout(60)
for _ in range(int(sys.argv[3])):
    c.sendall(c.recv(1))
n = 0; start = None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    if start is None:
        start = time.perf_counter()
    n += len(b)
print(json.dumps({'bytes': n, 'seconds': time.perf_counter() - start}))
'''

PROBE_CLIENT = r'''
import json, socket, sys, time
deadline = time.time() + 30
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.1)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(b'x'); c.recv(1); rtts.append(time.perf_counter() - t)
block = b'\0' * (1 << 20); end = time.perf_counter() + float(sys.argv[4])
while time.perf_counter() < end:
    c.sendall(block)
c.close()
print(json.dumps({'rtts': rtts}))
'''


def probe_link(sender_ns, receiver_ns, receiver_ip, seconds=PROBE_SECONDS, pings=20):
    """{'rate_bps', 'rtt_s'}: one TCP stream's rate from ``sender_ns`` to the receiver
    (bytes over the time between its first byte and the end) and the median round
    trip of one byte, each way through the links as the nodes see them."""
    argv = ['ip', 'netns', 'exec']
    server = subprocess.Popen(argv + [receiver_ns, sys.executable, '-c', PROBE_SERVER,
                                      receiver_ip, str(PROBE_PORT), str(pings)],
                              stdout=subprocess.PIPE, text=True)
    try:
        client = subprocess.run(argv + [sender_ns, sys.executable, '-c', PROBE_CLIENT,
                                        receiver_ip, str(PROBE_PORT), str(pings),
                                        str(seconds)],
                                capture_output=True, text=True, timeout=120)
        out, _ = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if client.returncode or server.returncode:
        raise RuntimeError('link probe failed: %s' % client.stderr.strip()[-300:])
    got, sent = json.loads(out), json.loads(client.stdout)
    return {'rate_bps': 8 * got['bytes'] / got['seconds'],
            'rtt_s': statistics.median(sent['rtts'])}


# ------------------------------------------------------------------ running

def schemes_at(schemes, rate_bits):
    """cluster.py scheme triples; 'AUTO_GIVEN' becomes policy=auto with ``rate_bits``."""
    out = []
    for s in schemes:
        if s == 'AUTO_GIVEN':
            s = 'dist_sync_hylo:policy=auto,link_rate=%d' % round(rate_bits)
        out.append(cluster.parse_scheme(s))
    return out


def past(stop_at):
    """True once the UTC clock reads ``stop_at`` ('HH:MM') or later (None: never)."""
    if not stop_at:
        return False
    now = datetime.datetime.utcnow()
    return now.strftime('%H:%M') >= stop_at


def job_args(args, workers):
    """What cluster.run_one and cluster.job_specs read."""
    return argparse.Namespace(workers=workers, servers=args.servers, threads=1,
                              timeout=args.timeout, verbose=False,
                              batch_size=args.batch_size, steps=args.steps,
                              warmup=args.warmup, crash_worker=None)


def write(result, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def cell(row):
    """What a row measured: the same cell in two rows is the same job run twice."""
    return (row.get('workers'), row.get('servers'), row.get('model'), row.get('rate'),
            row.get('scheme'))


def replace_cell(result, row):
    """Move the rows of ``row``'s cell out of ``result['runs']`` into
    ``result['replaced_runs']`` (kept: what the code before measured)."""
    old = [r for r in result['runs'] if cell(r) == cell(row)]
    result['runs'] = [r for r in result['runs'] if cell(r) != cell(row)]
    result.setdefault('replaced_runs', []).extend(old)


def sweep(args, result, speeds, shapes, plugin):
    for workers, schemes in args.plan:
        if past(args.stop_at):
            return
        work = tempfile.mkdtemp(prefix='kvx-validate-')
        net = netns.Cluster(workers, args.servers, args.prefix, args.subnet)
        net.create()
        try:
            worker0 = [h for h in net.hosts if h.role == 'worker'][0]
            server0 = [h for h in net.hosts if h.role == 'server'][0]
            for rate in args.rates:
                if past(args.stop_at):
                    return
                bps = netns.parse_rate(rate)
                net.shape(bps, 0.0)
                probe = probe_link(worker0.netns, server0.netns, server0.ip)
                link = {'rate': netns.format_rate(bps), 'rate_bps': bps, 'probe': probe,
                        'latency_s': probe['rtt_s'] / 2}
                result['links'].append(dict(link, workers=workers))
                print('%d workers, %s: probe %.0f Mbit/s, rtt %.0f us' % (
                    workers, link['rate'], probe['rate_bps'] / 1e6, 1e6 * probe['rtt_s']),
                    file=sys.stderr, flush=True)
                for model in args.models:
                    for scheme in schemes_at(schemes, link_rate_of(link)):
                        if past(args.stop_at):
                            return
                        label, kvstore, _ = scheme
                        if kvstore != 'dist_sync' and kvstore not in plugin:
                            continue
                        job_dir = tempfile.mkdtemp(prefix='job-', dir=work)
                        print('  %s %s ...' % (model, label), file=sys.stderr, flush=True)
                        row = cluster.run_one(net, job_args(args, workers), model, scheme,
                                              job_dir)
                        row.pop('workers', None)        # each worker's raw steps
                        row.update(workers=workers, servers=args.servers,
                                   rate=link['rate'], rate_bps=bps, link=link)
                        if row.get('error'):
                            print('    %s\n%s' % (row['error'], row.get('log_tail', '')),
                                  file=sys.stderr, flush=True)
                        else:
                            predict_row(row, shapes[model], speeds, args.host_cores)
                            p = (row['predicted'] or {}).get('step_s')
                            rate = (row.get('policy') or {}).get('rate_bits')
                            print('    measured %.0f ms, predicted %s ms (compute %.0f)%s' % (
                                1e3 * row['step_s'], '-' if p is None else '%.0f' % (1e3 * p),
                                1e3 * row['compute_s'], '' if rate is None else
                                ', auto at %.0f Mbit/s' % (rate / 1e6)),
                                file=sys.stderr, flush=True)
                        if args.replace:
                            replace_cell(result, row)
                        result['runs'].append(row)
                        write(result, args.json)
        finally:
            net.destroy()
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rates', default=DEFAULT_RATES,
                        help='tc rates, comma-separated; none: unshaped (%(default)s)')
    parser.add_argument('--workers', default='2,4,8',
                        help='worker counts: all schemes at the first, dist_sync, hylo '
                             'and its policy=auto at the others (%(default)s)')
    parser.add_argument('--schemes', nargs='+',
                        help='instead of the plan: these schemes at every worker count '
                             '(AUTO_GIVEN: policy=auto with the link rate)')
    parser.add_argument('-s', '--servers', type=int, default=1)
    parser.add_argument('--models', default='vgg,resnet')
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--timeout', type=float, default=240, help='seconds per job')
    parser.add_argument('--stop-at', help='HH:MM UTC: start no job from then on')
    parser.add_argument('--speeds', default=DEFAULT_SPEEDS,
                        help='codec speeds from --calibrate (%(default)s); "shipped": the '
                             'shipped kernel table alone')
    parser.add_argument('--calibrate', action='store_true',
                        help='time the codecs the schemes plan for the models on this '
                             'machine (cost_calibrate) that --speeds lacks, add them to it, '
                             'then stop (every codec if the file does not exist)')
    parser.add_argument('--host-cores', type=int, default=os.cpu_count(),
                        help='cores every node of the emulated cluster shares: the '
                             'model\'s host term (default: this machine\'s, %(default)s); '
                             '0: none, each node its own cores')
    parser.add_argument('--predict-only', action='store_true',
                        help='re-predict the rows of --json, run nothing')
    parser.add_argument('--json', default=DEFAULT_OUT)
    parser.add_argument('--append', action='store_true',
                        help='add the rows to those already in --json (its config stays; '
                             'this run\'s goes to more_config)')
    parser.add_argument('--replace', action='store_true',
                        help='as --append, but a new row takes the place of the rows of '
                             'its cell (workers, servers, model, rate, scheme), which move '
                             'to replaced_runs: a cell re-measured after its code changed')
    parser.add_argument('--recalibrate', default='',
                        help='with --calibrate: codec classes (comma-separated, e.g. '
                             'PowerSGDCodec,Float16Codec) to time again although --speeds '
                             'has them (their code changed)')
    parser.add_argument('--prefix', default='kvxv', help='namespace prefix')
    parser.add_argument('--subnet', default='10.213.0.0/24')
    args = parser.parse_args(argv)
    args.rates = [r for r in args.rates.split(',') if r]
    args.append = args.append or args.replace
    args.recalibrate = [c for c in args.recalibrate.split(',') if c]
    if args.recalibrate and not args.calibrate:
        parser.error('--recalibrate goes with --calibrate')
    args.models = [m for m in args.models.split(',') if m]
    counts = [int(w) for w in args.workers.split(',') if w]
    if args.schemes:
        args.plan = [(w, args.schemes) for w in counts]
    else:
        args.plan = [(w, ALL_SCHEMES if i == 0 else FEW_SCHEMES)
                     for i, w in enumerate(counts)]
    try:
        for r in args.rates:
            netns.parse_rate(r)
    except ValueError as e:
        parser.error(str(e))
    if args.speeds == 'shipped':
        if args.calibrate:
            parser.error('--calibrate writes --speeds: give a file, not "shipped"')
        args.speeds = None
    if args.host_cores is not None and args.host_cores < 0:
        parser.error('--host-cores must be >= 0, got %d' % args.host_cores)
    args.host_cores = args.host_cores or None
    return args


def main(argv=None):
    args = parse_args(argv)
    shapes = {m: model_shapes(m) for m in args.models}
    if args.calibrate:
        from kvstore_ext import cost
        from kvstore_ext.registry import SCHEMES
        merged = {'%s/%s' % (m, k): s for m in args.models for k, s in shapes[m].items()}
        calibrate_into(args.speeds, cost.variants(SCHEMES), merged, repeats=5,
                       again=args.recalibrate)
        return 0
    speeds = load_speeds(args.speeds)
    if args.predict_only:
        with open(args.json) as f:
            result = json.load(f)
        for row in result['runs']:
            if not row.get('error'):
                predict_row(row, shapes[row['model']], speeds, args.host_cores)
        result['speeds'] = speeds.source
        result['transport'] = transport_of(speeds)
        result['host_cores'] = args.host_cores
        # relative to the repository, for plot_cost_model.py's lines (None: shipped)
        result['speeds_file'] = args.speeds and os.path.relpath(
            os.path.abspath(args.speeds), os.path.dirname(HERE))
        write(result, args.json)
        return 0
    reason = netns.available()
    if reason:
        sys.exit(reason)
    plugin = cluster.plugin_kvstores(sys.executable)
    if not isinstance(plugin, set):
        sys.exit('kvstore_ext does not import: %s' % plugin)
    config = {k: v for k, v in vars(args).items()}
    result = {'config': config, 'speeds': speeds.source, 'links': [], 'runs': [],
              'transport': transport_of(speeds), 'host_cores': args.host_cores}
    if args.append and os.path.exists(args.json):   # another part of one sweep
        with open(args.json) as f:
            result = json.load(f)
        result.setdefault('more_config', []).append(config)
    previous = cluster.catch_stop_signals()
    code = 0
    try:
        sweep(args, result, speeds, shapes, plugin)
    except (KeyboardInterrupt, cluster.Interrupted) as e:
        result['interrupted'] = str(e) or 'SIGINT'
        code = 130
    finally:
        cluster.clean_up_uninterrupted(
            previous, lambda: netns.remove_namespaces(args.prefix))
        write(result, args.json)
    return code


if __name__ == '__main__':
    sys.exit(main())
