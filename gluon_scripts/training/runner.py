"""The whole run of a training script after argument parsing, in the order that keeps
a distributed job sane: every user mistake is found before the process talks to the
parameter server; then kvstore, data, network, trainer, resume, the loop, checkpoints
and the summary."""
import numpy as np

from . import errors
from .checkpoints import Checkpoints, restore, resume_epoch
from .cli import check_args
from .errors import UsageError
from .kvstore_setup import check_kvstore_flags, contexts, create_kvstore, import_mxnet
from .loop import train
from .optim import make_trainer
from .report import setup_logging, summarize


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
        errors.fail(str(e))
    log = setup_logging(kv.rank)
    try:
        mx.random.seed(args.seed, ctx='all')
        np.random.seed(args.seed)
        worker_batch = args.batch_size * len(ctxs)
        data = make_data(kv, worker_batch)
        net = make_net(ctxs)
        if hasattr(kv, 'attach'):
            # a scheme that compresses from what the layers compute hooks into them
            # before the first forward pass (dist_sync_dad); the others ignore it
            kv.attach(net)
        if args.mode == 'hybrid':
            net.hybridize(static_alloc=True, static_shape=True)
        trainer = make_trainer(net, kv, args, data.batches_per_epoch)
        if hasattr(kv, 'follow'):
            # the optimizer runs here, not in the kvstore: hand the scheme its momentum
            # and learning rate (kvstore_ext/handover.py; the Trainer would be found
            # without the call, the call says it)
            kv.follow(trainer)
        ckpt = Checkpoints(args.save_dir, name, kv.rank) if args.save_dir else None
        start, history = 0, []
        if ckpt:
            start = resume_epoch(args, kv, ckpt)
            if start:
                history = restore(args, net, trainer, kv, ckpt, start, ctxs, log)
    except UsageError as e:
        errors.fail(str(e))
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
