"""What every training script shares: the flags, devices and the kvstore, data order,
the training loop with its logs (samples/s, loss, accuracy, bytes per step),
checkpoints with ``--resume``, and the final JSON summary.

A script supplies its network and a data source (an object with
``batches_per_epoch``, ``train_batches(epoch)`` and ``eval_batches()``) and calls
``run``; everything else happens here, identically for every script.

Reproducibility: the data order, the augmentation and MXNet's random generator are
seeded from ``--seed``, the epoch and the rank at the start of every epoch, and a
checkpoint holds the parameters, the trainer's states (momentum, update count, so the
learning-rate schedule continues) and the kvstore's error-feedback residuals, so a
resumed run sees the batches and the state the uninterrupted run would have seen.
"""
import argparse
import glob
import json
import logging
import os
import re
import sys
import time

import numpy as np

# kvstore types MXNet creates natively (mx.kv.create of an unknown name silently
# makes a 'local' store, so names are checked here)
MXNET_KVSTORES = ('local', 'device', 'nccl', 'dist_sync', 'dist_async', 'dist_device_sync',
                  'dist_sync_device', 'dist_async_device', 'dist_device_async')
RESUME_KEY = 1 << 30        # kvstore key of the resume-epoch broadcast (never a parameter's)


class UsageError(Exception):
    """A mistake of the user's (flags, paths): reported in one line, exit code 2."""


_DIST_STARTED = []     # set once this process is a worker of a running ps-lite job


def fail(message, code=2):
    """A clean error for the user (no traceback) and exit code 2."""
    sys.stderr.write('error: %s\n' % message)
    _exit(code)


def _exit(code):
    """Exit; once a distributed kvstore runs, at once: after a normal interpreter exit
    ps-lite's shutdown waits for the other workers, who wait for this one's next
    push, and the job would hang instead of failing."""
    sys.stdout.flush()
    sys.stderr.flush()
    if _DIST_STARTED:
        os._exit(code)
    sys.exit(code)


def _exit_on_uncaught_exception():
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        _exit(1)
    sys.excepthook = hook


# -- flags ------------------------------------------------------------------------------
def base_parser(description, epilog=None, **defaults):
    """The flags every script has; ``defaults`` overrides per script (e.g. lr=0.1).
    ``parser.script_group`` is where a script adds its own (model, data) flags."""
    p = argparse.ArgumentParser(description=description, epilog=epilog,
                                formatter_class=_HelpFormatter)
    p.script_group = p.add_argument_group('model and data')
    g = p.add_argument_group('distributed')
    g.add_argument('--kvstore', default='dist_sync_hylo',
                   help="kvstore type: one registered by kvstore_ext (dist_sync_hylo, "
                        "dist_sync_none, dist_sync_2bit, ...) or MXNet's own (dist_sync, "
                        "dist_async, local, device). dist types need a launcher: "
                        "python -m kvstore_ext.launch -n WORKERS -s SERVERS python SCRIPT ...")
    g.add_argument('--compression-params', default={}, type=_json_dict,
                   help='JSON dict of the scheme\'s parameters, e.g. '
                        '\'{"size_threshold": 32768, "aggregation": "homomorphic"}\'')
    g = p.add_argument_group('training')
    g.add_argument('--num-epochs', type=int, default=3, help='epochs to train (in all, with '
                   '--resume)')
    g.add_argument('--batch-size', type=int, default=64,
                   help='per device; a worker trains on batch-size x devices samples a step')
    g.add_argument('--optimizer', default='sgd', help="any MXNet optimizer ('sgd', 'nag', ...)")
    g.add_argument('--lr', type=float, default=0.05,
                   help='learning rate (for the global batch: the kvstore sums all workers\' '
                        'gradients and the step divides by the global batch)')
    g.add_argument('--lr-mode', default='cosine', choices=('cosine', 'step', 'constant'),
                   help='learning-rate schedule over the whole run')
    g.add_argument('--lr-steps', '--lr-decay-epoch', dest='lr_steps', default='',
                   help="step mode: epochs after which the lr is multiplied by --lr-factor, "
                        "e.g. '30,60,80'")
    g.add_argument('--lr-factor', '--lr-decay', dest='lr_factor', type=float, default=0.1,
                   help='step mode: lr multiplier at each step')
    g.add_argument('--warmup-epochs', type=float, default=0.0,
                   help='linear warm-up of the lr over this many epochs')
    g.add_argument('--warmup-lr', type=float, default=0.0, help='lr at the start of warm-up')
    g.add_argument('--momentum', type=float, default=0.9, help='of sgd and nag')
    g.add_argument('--wd', type=float, default=1e-4, help='weight decay')
    g.add_argument('--mode', default='hybrid', choices=('hybrid', 'imperative'),
                   help='hybrid: hybridize the network (static graph)')
    g.add_argument('--seed', type=int, default=42,
                   help='seeds initialisation, data order and augmentation (with the epoch)')
    g = p.add_argument_group('devices (per worker)')
    g.add_argument('--gpus', default='', help="GPU ids, e.g. '0,1' (none: CPU)")
    g.add_argument('--num-cpu-contexts', type=int, default=1,
                   help='without --gpus: train on this many CPU contexts (mx.cpu(0), '
                        'mx.cpu(1), ...), the multi-device path of a GPU worker')
    g = p.add_argument_group('data')
    g.add_argument('--synthetic', action='store_true',
                   help='random data of the real shapes (for benchmarks); no files are read')
    g.add_argument('--num-batches', type=int, default=0,
                   help='if > 0, at most this many batches per epoch in training and in '
                        'evaluation (benchmarks, smoke tests)')
    g = p.add_argument_group('checkpoints')
    g.add_argument('--save-dir', default='',
                   help='write a checkpoint here every --save-frequency epochs: parameters, '
                        'trainer states and the kvstore\'s residuals, one set of files per '
                        'worker (empty: no checkpoints)')
    g.add_argument('--save-frequency', type=int, default=1, help='epochs between checkpoints')
    g.add_argument('--resume', nargs='?', const='latest', default=None, metavar='EPOCH',
                   help='continue from the checkpoint in --save-dir written after EPOCH '
                        'epochs (default: the latest); the run then trains to --num-epochs')
    g = p.add_argument_group('output')
    g.add_argument('--log-interval', type=int, default=20,
                   help='batches between log lines (0: only per epoch)')
    g.add_argument('--summary-json', default=None,
                   help='write a final JSON summary here; {rank} is replaced by the rank')
    p.set_defaults(**defaults)
    return p


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    """Defaults shown, except empty ones; the description and epilog as written."""

    def _get_help_string(self, action):
        if action.default in (None, '', {}, False):
            return action.help
        return super()._get_help_string(action)


def _json_dict(text):
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError('not JSON (%s): %s' % (e, text))
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('a JSON object is needed, got %s' % text)
    return value


# -- start-up ---------------------------------------------------------------------------
def import_mxnet():
    """Import MXNet first: in a server or scheduler process started with the script
    (MXNet's tools/launch.py does that) ``import mxnet`` runs the server loop and exits,
    before any worker-only check."""
    import mxnet as mx
    return mx


def check_kvstore_flags(args):
    """--kvstore and --compression-params make sense together, before anything starts."""
    import kvstore_ext
    ours = kvstore_ext.kvstore_types()
    name = args.kvstore.lower()
    params = dict(args.compression_params)
    from mxnet.kvstore import KVStoreBase
    if name not in ours and name not in MXNET_KVSTORES and name not in KVStoreBase.kv_registry:
        raise UsageError('unknown --kvstore %r; kvstore_ext types: %s; MXNet\'s: %s'
                         % (args.kvstore, ', '.join(ours), ', '.join(MXNET_KVSTORES)))
    if name in ours:
        ctype = params.pop('type', None)
        if ctype is not None and 'dist_sync_' + str(ctype) != name:
            raise UsageError(
                '--compression-params "type": %r selects MXNet\'s built-in compression; with '
                'kvstore_ext the scheme is the kvstore type (--kvstore dist_sync_%s)'
                % (ctype, ctype))
    elif params:
        ctype = params.get('type')
        hint = ''
        if ctype == '2bit':
            rest = {k: v for k, v in params.items() if k != 'type'}
            hint = (" Use the same scheme as a kvstore_ext type, which works with pushpull: "
                    "--kvstore dist_sync_2bit --compression-params '%s'" % json.dumps(rest))
        raise UsageError(
            "MXNet's built-in gradient compression (%s) cannot be used from a Gluon Trainer: "
            "MXNet's kvstore refuses pushpull when compression is set.%s"
            % (json.dumps(params), hint))
    if name.startswith('dist') and name not in ours and 'DMLC_ROLE' not in os.environ:
        raise UsageError('--kvstore %s needs a launcher that starts scheduler and servers, '
                         'e.g. python -m kvstore_ext.launch -n 2 -s 1 python %s ...'
                         % (args.kvstore, os.path.basename(sys.argv[0])))
    return name, params


def contexts(args):
    """The worker's devices: --gpus, or --num-cpu-contexts CPU contexts."""
    import mxnet as mx
    if args.gpus.strip():
        try:
            ids = [int(i) for i in args.gpus.split(',') if i.strip()]
        except ValueError:
            raise UsageError("--gpus takes GPU ids like '0,1', got %r" % args.gpus)
        available = mx.context.num_gpus()
        missing = [i for i in ids if i >= available]
        if missing:
            raise UsageError('--gpus %s: this machine has %d GPU(s) visible to MXNet'
                             % (args.gpus, available))
        return [mx.gpu(i) for i in ids]
    if args.num_cpu_contexts < 1:
        raise UsageError('--num-cpu-contexts must be >= 1')
    return [mx.cpu(i) for i in range(args.num_cpu_contexts)]


def check_args(args):
    for flag in ('num_epochs', 'batch_size', 'save_frequency'):
        if getattr(args, flag) < 1:
            raise UsageError('--%s must be >= 1' % flag.replace('_', '-'))
    if args.resume is not None and not args.save_dir:
        raise UsageError('--resume needs --save-dir (where the checkpoints are)')
    if args.resume not in (None, 'latest'):
        try:
            int(args.resume)
        except ValueError:
            raise UsageError('--resume takes an epoch number, got %r' % args.resume)
    if args.lr_mode == 'step':
        _lr_step_epochs(args)


def create_kvstore(name, compression_params):
    """The kvstore (kvstore_ext types are registered on import); compression set."""
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(name)
    if kv.type.startswith('dist') and kv.num_workers > 1:
        _DIST_STARTED.append(True)
        _exit_on_uncaught_exception()
    if compression_params:
        try:
            kv.set_gradient_compression(compression_params)
        except (ValueError, TypeError) as e:
            raise UsageError('--compression-params: %s' % e)
    return kv


def setup_logging(rank):
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format='%(asctime)s [rank ' + str(rank) + '] %(message)s')
    return logging.getLogger('train')


# -- learning rate ----------------------------------------------------------------------
def _lr_step_epochs(args):
    try:
        steps = [float(e) for e in args.lr_steps.split(',') if e.strip()]
    except ValueError:
        raise UsageError("--lr-steps takes epochs like '30,60,80', got %r" % args.lr_steps)
    if any(b <= a for a, b in zip(steps, steps[1:])) or any(s <= 0 for s in steps):
        raise UsageError('--lr-steps must be increasing positive epochs, got %r'
                         % args.lr_steps)
    return steps


def lr_scheduler(args, batches_per_epoch):
    """The --lr-mode schedule in optimizer updates (one update per training step)."""
    import mxnet as mx
    total = max(1, int(args.num_epochs * batches_per_epoch))
    warmup = min(int(args.warmup_epochs * batches_per_epoch), total - 1)
    common = dict(base_lr=args.lr, warmup_steps=max(0, warmup), warmup_begin_lr=args.warmup_lr)
    if args.lr_mode == 'cosine':
        return mx.lr_scheduler.CosineScheduler(max_update=total, final_lr=0, **common)
    if args.lr_mode == 'step' and args.lr_steps:
        steps = sorted({max(1, int(e * batches_per_epoch)) for e in _lr_step_epochs(args)})
        return mx.lr_scheduler.MultiFactorScheduler(step=steps, factor=args.lr_factor, **common)
    return mx.lr_scheduler.FactorScheduler(step=total + 1, factor=1.0, **common)


def make_trainer(net, kv, args, batches_per_epoch):
    from mxnet import gluon
    params = {'learning_rate': args.lr, 'wd': args.wd,
              'lr_scheduler': lr_scheduler(args, batches_per_epoch)}
    if args.optimizer in ('sgd', 'nag'):
        params['momentum'] = args.momentum
    # update_on_kvstore=False: the optimizer runs on the workers on the summed
    # gradient, for every kvstore alike (kvstore_ext types only sum)
    return gluon.Trainer(net.collect_params(), args.optimizer, params, kvstore=kv,
                         update_on_kvstore=False)


# -- data -------------------------------------------------------------------------------
def rng(args, epoch, rank, stream=0):
    """The generator of one (epoch, rank, stream): the same in a resumed run."""
    return np.random.default_rng([args.seed, epoch, rank, stream])


def seed_epoch(args, epoch, rank):
    """Seed MXNet (dropout, MXNet-side augmentation) and NumPy for this epoch."""
    import mxnet as mx
    s = (args.seed * 1000003 + epoch * 101 + rank) % (2 ** 31)
    mx.random.seed(s, ctx='all')
    np.random.seed(s)


class ArrayData:
    """Batches of in-memory NumPy arrays, sharded over workers.

    Every epoch the whole training set is permuted with a generator seeded by (seed,
    epoch) (identical on every worker), worker ``rank`` takes every ``num_workers``-th
    sample of it, and every worker gets the same number of full batches (dist_sync
    needs the same number of steps from everyone). ``augment(x, rng)`` turns a uint8 or
    float batch into the float32 input; ``prepare(x)`` does the same for evaluation.
    """

    def __init__(self, args, x_train, y_train, x_test, y_test, rank, num_workers,
                 worker_batch, augment=None, prepare=None, eval_batch=None):
        self.args, self.rank, self.num_workers = args, rank, num_workers
        self.x_train, self.y_train, self.x_test, self.y_test = x_train, y_train, x_test, y_test
        self.batch = worker_batch
        self.eval_batch = eval_batch or max(worker_batch, 256)
        self.augment = augment or (lambda x, g: prepare(x) if prepare else x)
        self.prepare = prepare or (lambda x: x)
        per_worker = len(y_train) // num_workers
        self.batches_per_epoch = limit_batches(per_worker // worker_batch, args.num_batches)
        if self.batches_per_epoch < 1:
            raise UsageError('%d training samples are too few for %d worker(s) with %d '
                             'samples a step each' % (len(y_train), num_workers, worker_batch))

    def train_batches(self, epoch):
        import mxnet as mx
        order = rng(self.args, epoch, 0).permutation(len(self.y_train))
        mine = order[self.rank::self.num_workers][:self.batches_per_epoch * self.batch]
        g = rng(self.args, epoch, self.rank, 1)
        for i in range(self.batches_per_epoch):
            idx = np.sort(mine[i * self.batch:(i + 1) * self.batch])    # sorted: faster reads
            idx = idx[g.permutation(len(idx))]
            yield (mx.nd.array(self.augment(self.x_train[idx], g)),
                   mx.nd.array(self.y_train[idx], dtype='float32'))

    def eval_batches(self):
        import mxnet as mx
        n = len(self.y_test)
        count = limit_batches(-(-n // self.eval_batch), self.args.num_batches)
        for i in range(count):
            s = slice(i * self.eval_batch, (i + 1) * self.eval_batch)
            yield (mx.nd.array(self.prepare(self.x_test[s])),
                   mx.nd.array(self.y_test[s], dtype='float32'))


class SyntheticData:
    """Random data of the real shapes, for benchmarks: ``pool`` batches generated once
    (per rank) and cycled, so that generating data costs nothing in the measurement."""

    def __init__(self, args, shape, classes, train_size, test_size, rank, num_workers,
                 worker_batch, pool=4):
        self.args, self.batch = args, worker_batch
        g = rng(args, 0, rank, 7)
        self.pool = [(g.standard_normal((worker_batch,) + tuple(shape), dtype=np.float32),
                      g.integers(0, classes, worker_batch).astype(np.float32))
                     for _ in range(pool)]
        self.batches_per_epoch = limit_batches(train_size // num_workers // worker_batch,
                                        args.num_batches)
        self.eval_count = limit_batches(-(-test_size // worker_batch), args.num_batches)
        if self.batches_per_epoch < 1:
            raise UsageError('--batch-size too large for the synthetic data set')

    def _cycle(self, count):
        import mxnet as mx
        arrays = [(mx.nd.array(x), mx.nd.array(y)) for x, y in self.pool]
        for i in range(count):
            yield arrays[i % len(arrays)]

    def train_batches(self, epoch):
        return self._cycle(self.batches_per_epoch)

    def eval_batches(self):
        return self._cycle(self.eval_count)


def limit_batches(count, num_batches):
    """``count`` batches, or at most --num-batches of them."""
    return min(count, num_batches) if num_batches and num_batches > 0 else count


def check_files(paths, what):
    """UsageError naming the first missing path (``paths``: [(flag, path)])."""
    for flag, path in paths:
        if not path or not os.path.isfile(os.path.expanduser(path)):
            raise UsageError('%s: no such file: %s (%s)' % (flag, path, what))


# -- traffic ----------------------------------------------------------------------------
class Traffic:
    """Bytes this worker pushes and pulls: the kvstore's own counters (kvstore_ext
    types), else, for MXNet's dist kvstores, the float32 gradients it sends each step
    (every trainable parameter, pushed and pulled whole)."""

    def __init__(self, kv, net):
        self.kv, self.net = kv, net
        self.counted = hasattr(kv, 'comm_stats')
        self.dist = kv.type.startswith('dist')
        self.steps = 0

    @property
    def raw_per_step(self):
        """float32 bytes of all trainable parameters; read when asked, not at start:
        Gluon's deferred initialisation gives shapes only at the first forward."""
        return 4 * sum(int(np.prod(p.shape)) for p in
                       self.net.collect_params().values() if p.grad_req != 'null')

    def snapshot(self):
        if self.counted:
            s = self.kv.comm_stats()
            return {k: s[k] for k in ('raw_bytes', 'push_bytes', 'pull_bytes')}
        wire = self.raw_per_step * self.steps if self.dist else 0
        return {'raw_bytes': self.raw_per_step * self.steps, 'push_bytes': wire,
                'pull_bytes': wire}

    @staticmethod
    def per_step(before, after, steps):
        steps = max(steps, 1)
        return {k: (after[k] - before[k]) / steps for k in after}

    @staticmethod
    def text(rates):
        return 'pushed %s/step, pulled %s/step' % (_size(rates['push_bytes']),
                                                   _size(rates['pull_bytes']))


def _size(n):
    for unit in ('B', 'KB', 'MB'):
        if abs(n) < 1024:
            return '%.1f %s' % (n, unit)
        n /= 1024.0
    return '%.1f GB' % n


class Progress:
    """A one-line progress bar on a terminal; silent when the output is a file."""

    def __init__(self, total, enabled=True):
        self.total, self.enabled = total, enabled and sys.stdout.isatty()
        self.shown = False

    def update(self, done, text=''):
        if self.enabled:
            width = 30
            filled = int(width * done / max(self.total, 1))
            sys.stdout.write('\r[%s%s] %d/%d %s\033[K' % ('#' * filled, '.' * (width - filled),
                                                         done, self.total, text))
            sys.stdout.flush()
            self.shown = True

    def clear(self):
        """Before a log line: erase the bar (it is redrawn at the next update)."""
        if self.shown:
            sys.stdout.write('\r\033[K')
            sys.stdout.flush()
            self.shown = False

    def close(self):
        self.clear()


# -- checkpoints ------------------------------------------------------------------------
class Checkpoints:
    """``DIR/NAME-EEEE-rankR.{params,states,kvx,json}``: the state after EEEE epochs of
    worker R (parameters, trainer states, kvstore residuals; the JSON, written last,
    marks the set complete and holds the history so far). Per worker, so that it works
    whether or not DIR is shared between hosts."""

    def __init__(self, save_dir, name, rank):
        self.dir, self.name, self.rank = os.path.expanduser(save_dir), name, rank

    def path(self, epochs, ext):
        return os.path.join(self.dir, '%s-%04d-rank%d.%s' % (self.name, epochs, self.rank, ext))

    def save(self, epochs, net, trainer, kv, history):
        os.makedirs(self.dir, exist_ok=True)
        net.save_parameters(self.path(epochs, 'params'))
        trainer.save_states(self.path(epochs, 'states'))
        if hasattr(kv, 'save_compression_state'):
            kv.save_compression_state(self.path(epochs, 'kvx'))
        meta = self.path(epochs, 'json')
        with open(meta + '.tmp', 'w') as f:
            json.dump({'epochs': epochs, 'rank': self.rank, 'kvstore': kv.type,
                       'history': history}, f)
        os.replace(meta + '.tmp', meta)

    def latest(self):
        pattern = re.compile(re.escape(self.name) + r'-(\d{4,})-rank%d\.json$' % self.rank)
        found = [int(m.group(1)) for m in (pattern.search(p) for p in
                 glob.glob(os.path.join(glob.escape(self.dir), '*.json'))) if m]
        return max(found) if found else -1

    def load_meta(self, epochs):
        with open(self.path(epochs, 'json')) as f:
            return json.load(f)


def resume_epoch(args, kv, ckpt):
    """The number of epochs already done (0 without --resume). Rank 0 decides (its latest
    complete checkpoint, or --resume EPOCH) and broadcasts, so that every worker resumes
    from the same epoch."""
    if args.resume is None:
        return 0
    import mxnet as mx
    mine = ckpt.latest() if args.resume == 'latest' else int(args.resume)
    value = mx.nd.array([mine], dtype='float32')
    out = mx.nd.zeros((1,), dtype='float32')
    kv.broadcast(RESUME_KEY, value, out=out)
    epochs = int(out.asscalar())
    if epochs < 0:
        raise UsageError('--resume: no checkpoint %s-*-rank0.json in %s'
                         % (ckpt.name, ckpt.dir))
    if epochs == 0:
        return 0
    if not os.path.isfile(ckpt.path(epochs, 'json')):
        raise UsageError('--resume: %s is missing (checkpoints are per rank; ps-lite assigns '
                         'ranks at start-up, so on several hosts use a --save-dir they share)'
                         % ckpt.path(epochs, 'json'))
    return epochs


def restore(args, net, trainer, kv, ckpt, epochs, ctxs, log):
    """Load the checkpoint written after ``epochs`` epochs; returns its history.
    Parameters, then trainer states, then residuals (before the first pushpull)."""
    net.load_parameters(ckpt.path(epochs, 'params'), ctx=ctxs)
    trainer.load_states(ckpt.path(epochs, 'states'))
    # loading the states initialised the kvstore, which broadcast rank 0's parameters,
    # auxiliary ones included: load again for this worker's own BatchNorm statistics
    # (the trained parameters are the same on every worker)
    net.load_parameters(ckpt.path(epochs, 'params'), ctx=ctxs)
    kvx = ckpt.path(epochs, 'kvx')
    if hasattr(kv, 'load_compression_state'):
        if not os.path.isfile(kvx):
            raise UsageError('--resume: %s is missing (was the checkpoint written with '
                             '--kvstore %s?)' % (kvx, args.kvstore))
        before = dict(kv.scheme.params) if hasattr(kv, 'scheme') else None
        kv.load_compression_state(kvx)
        after = dict(kv.scheme.params) if hasattr(kv, 'scheme') else None
        if before is not None and before != after:
            log.warning('compression parameters come from the checkpoint: %s (the command '
                        'line asked for %s)', after, before)
    meta = ckpt.load_meta(epochs)
    log.info('resumed from %s after %d epochs (update %d)', ckpt.path(epochs, '*'), epochs,
             trainer.optimizer.num_update)
    return meta['history']


# -- training ---------------------------------------------------------------------------
def evaluate(net, batches, ctxs, top5=False):
    """(top-1, top-5 or None) accuracy of ``net`` on (data, label) NDArray batches."""
    import mxnet as mx
    from mxnet import gluon
    acc, acc5 = mx.metric.Accuracy(), mx.metric.TopKAccuracy(5) if top5 else None
    for data, label in batches:
        use = ctxs[:max(1, min(len(ctxs), data.shape[0]))]
        datas = gluon.utils.split_and_load(data, use, even_split=False)
        labels = gluon.utils.split_and_load(label, use, even_split=False)
        outs = [net(x) for x in datas]
        acc.update(labels, outs)
        if acc5:
            acc5.update(labels, outs)
    return acc.get()[1], (acc5.get()[1] if acc5 else None)


def sync_aux_params(net):
    """Average the auxiliary parameters (BatchNorm running statistics, not trained by
    the optimizer) over this worker's devices and give every device the average, as
    MXNet's Module does after every epoch. Evaluation then does not depend on the
    device a sample lands on, and a checkpoint (which saves the average) restores
    exactly the state the run continues with."""
    import mxnet as mx
    for p in net.collect_params().values():
        if p.grad_req == 'null' and p._data is not None and len(p.list_ctx()) > 1:
            arrays = p.list_data()
            p.set_data(mx.nd.add_n(*[a.as_in_context(mx.cpu()) for a in arrays]) / len(arrays))


def _diverged(log, progress, epoch, batch, trainer, what):
    progress.clear()
    log.error('epoch %d batch %d: %s: training diverged at lr %g; lower --lr or lengthen '
              '--warmup-epochs', epoch, batch + 1, what, trainer.learning_rate)
    _exit(1)


def train(net, trainer, kv, data, args, log, ctxs, start_epoch=0, history=None,
          classes=None, label_smoothing=0.0, on_epoch_end=None):
    """The loop: forward/backward on each device, ``trainer.step``, logs; evaluation
    and ``on_epoch_end(epochs_done, history)`` after every epoch. Returns the history."""
    import mxnet as mx
    from mxnet import autograd, gluon
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=not label_smoothing)
    history = list(history or [])
    traffic = Traffic(kv, net)
    t_start = time.time()
    top5 = bool(classes and classes > 5)
    for epoch in range(start_epoch, args.num_epochs):
        seed_epoch(args, epoch, kv.rank)
        metric, losses = mx.metric.Accuracy(), []
        progress = Progress(data.batches_per_epoch)
        t_epoch = t_interval = time.time()
        seen = seen_interval = 0
        at_epoch = at_interval = traffic.snapshot()
        for i, (x, y) in enumerate(data.train_batches(epoch)):
            datas = gluon.utils.split_and_load(x, ctxs, even_split=False)
            labels = gluon.utils.split_and_load(y, ctxs, even_split=False)
            targets = labels
            if label_smoothing:
                on = 1 - label_smoothing + label_smoothing / classes
                targets = [l.one_hot(classes, on_value=on, off_value=label_smoothing / classes)
                           for l in labels]
            with autograd.record():
                outs = [net(d) for d in datas]
                batch_losses = [loss_fn(o, t) for o, t in zip(outs, targets)]
            for l in batch_losses:
                l.backward()
            # the kvstore sums over workers: normalise by the global batch
            try:
                trainer.step(x.shape[0] * kv.num_workers)
            except FloatingPointError as e:       # kvstore_ext's NonFiniteGradientError
                _diverged(log, progress, epoch, i, trainer, e)
            traffic.steps += 1
            metric.update(labels, outs)
            losses.append(sum(l.sum().asscalar() for l in batch_losses) / x.shape[0])
            if not np.isfinite(losses[-1]):
                _diverged(log, progress, epoch, i, trainer, 'loss %s' % losses[-1])
            seen += x.shape[0]
            seen_interval += x.shape[0]
            progress.update(i + 1, 'loss %.3f' % losses[-1])
            if args.log_interval and (i + 1) % args.log_interval == 0:
                now = traffic.snapshot()
                progress.clear()
                log.info('epoch %d batch %d/%d: %.1f samples/s, loss %.4f, train acc %.4f, '
                         'lr %.5g, %s', epoch, i + 1, data.batches_per_epoch,
                         seen_interval / (time.time() - t_interval),
                         np.mean(losses[-args.log_interval:]), metric.get()[1],
                         trainer.learning_rate,
                         Traffic.text(Traffic.per_step(at_interval, now, args.log_interval)))
                at_interval, t_interval, seen_interval = now, time.time(), 0
        progress.close()
        sync_aux_params(net)
        steps = len(losses)
        train_time = time.time() - t_epoch
        rates = Traffic.per_step(at_epoch, traffic.snapshot(), steps)
        t_eval = time.time()
        top1, top5_acc = evaluate(net, data.eval_batches(), ctxs, top5)
        eval_time = time.time() - t_eval
        record = {'epoch': epoch, 'train_loss': float(np.mean(losses)),
                  'train_acc': metric.get()[1], 'test_acc': top1,
                  'samples_per_sec': seen / train_time, 'steps': steps,
                  'lr': trainer.learning_rate, 'train_time': train_time,
                  'eval_time': eval_time, 'epoch_time': time.time() - t_epoch,
                  'wall_time': time.time() - t_start,
                  'bytes_per_step': {'push': rates['push_bytes'], 'pull': rates['pull_bytes'],
                                     'raw': rates['raw_bytes']}}
        if top5_acc is not None:
            record['test_top5'] = top5_acc
        history.append(record)
        log.info('epoch %d done in %.1fs: %.1f samples/s (x%d workers), loss %.4f, train acc '
                 '%.4f, test acc %.4f%s, %s (float32: %s)', epoch, record['epoch_time'],
                 record['samples_per_sec'], kv.num_workers, record['train_loss'],
                 record['train_acc'], top1,
                 (', top-5 %.4f' % top5_acc) if top5_acc is not None else '',
                 Traffic.text(rates), _size(rates['raw_bytes']))
        if on_epoch_end:
            on_epoch_end(epoch + 1, history)
    return history


def summarize(args, kv, history, log, extra=None):
    """Final report: accuracy, time, bytes saved against float32; JSON if asked."""
    stats = kv.comm_stats() if hasattr(kv, 'comm_stats') else None
    summary = {'kvstore': args.kvstore, 'compression_params': args.compression_params,
               'rank': kv.rank, 'num_workers': kv.num_workers, 'epochs': history,
               'final_test_acc': history[-1]['test_acc'] if history else None,
               'total_time': float(sum(e['epoch_time'] for e in history)),
               'comm_stats': stats}
    if history:
        summary['samples_per_sec'] = float(np.mean([e['samples_per_sec'] for e in history]))
        summary['bytes_per_step'] = {
            k: float(np.mean([e['bytes_per_step'][k] for e in history]))
            for k in ('push', 'pull', 'raw')}
        summary['bytes_counted'] = stats is not None
    if stats and stats['raw_bytes']:
        summary['push_saved'] = 1 - stats['push_bytes'] / stats['raw_bytes']
        summary['pull_saved'] = 1 - stats['pull_bytes'] / stats['raw_bytes']
        log.info('bytes pushed %.2f MB vs %.2f MB as float32 (%.1fx less, %.1f%% saved); '
                 'pulled %.2f MB', stats['push_bytes'] / 1e6, stats['raw_bytes'] / 1e6,
                 stats['raw_bytes'] / max(stats['push_bytes'], 1), 100 * summary['push_saved'],
                 stats['pull_bytes'] / 1e6)
    if hasattr(kv, 'codec_plan'):
        plan = {str(k): v for k, v in kv.codec_plan().items() if v is not None}
        summary['codec_plan'] = plan
        kinds = {}
        for v in plan.values():
            kind = 'top-k filters' if v.startswith('top') else v.split(',')[0].split()[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        log.info('codecs (tensors): %s', ', '.join('%s %d' % kv_ for kv_ in sorted(kinds.items())))
    if history:
        log.info('final test accuracy %.4f after %d epochs (%.1fs training and evaluation)',
                 summary['final_test_acc'], len(history), summary['total_time'])
    summary.update(extra or {})
    if args.summary_json:
        path = args.summary_json.replace('{rank}', str(kv.rank))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(summary, f, indent=1, default=str)
    return summary


# -- the whole run ----------------------------------------------------------------------
def run(args, name, check_data, make_data, make_net, classes=None, label_smoothing=0.0,
        extra_summary=None):
    """Everything after argument parsing, for every script:

    ``check_data()`` (raises UsageError for a missing dataset) runs before any process
    talks to the parameter server; ``make_data(kv, worker_batch)`` returns the data
    source, ``make_net(ctxs)`` the initialised network.
    """
    mx = import_mxnet()
    try:
        check_args(args)
        kv_name, params = check_kvstore_flags(args)
        if not args.synthetic:
            check_data()
        ctxs = contexts(args)
        kv = create_kvstore(kv_name, params)
    except UsageError as e:
        fail(str(e))
    log = setup_logging(kv.rank)
    try:
        mx.random.seed(args.seed, ctx='all')
        np.random.seed(args.seed)
        worker_batch = args.batch_size * len(ctxs)
        data = make_data(kv, worker_batch)
        net = make_net(ctxs)
        if args.mode == 'hybrid':
            net.hybridize(static_alloc=True, static_shape=True)
        trainer = make_trainer(net, kv, args, data.batches_per_epoch)
        ckpt = Checkpoints(args.save_dir, name, kv.rank) if args.save_dir else None
        start, history = 0, []
        if ckpt:
            start = resume_epoch(args, kv, ckpt)
            if start:
                history = restore(args, net, trainer, kv, ckpt, start, ctxs, log)
    except UsageError as e:
        fail(str(e))
    log.info('%s: kvstore %s (%d workers, rank %d), %s, %d batches of %d a worker per epoch, '
             'epochs %d..%d', name, kv.type, kv.num_workers, kv.rank,
             ', '.join(str(c) for c in ctxs), data.batches_per_epoch, worker_batch, start,
             args.num_epochs - 1)

    def on_epoch_end(done, hist):
        if ckpt and (done % args.save_frequency == 0 or done == args.num_epochs):
            ckpt.save(done, net, trainer, kv, hist)
            log.info('checkpoint %s', ckpt.path(done, '*'))

    history = train(net, trainer, kv, data, args, log, ctxs, start, history, classes,
                    label_smoothing, on_epoch_end)
    extra = {'name': name, 'contexts': [str(c) for c in ctxs], 'batch_size': worker_batch,
             'batches_per_epoch': data.batches_per_epoch, 'resumed_from_epoch': start,
             'synthetic': args.synthetic}
    extra.update(extra_summary or {})
    return summarize(args, kv, history, log, extra)
