"""Checkpoints and ``--resume``: the files of one worker's state after an epoch
(parameters, trainer states, kvstore residuals, history), the resume epoch every worker
agrees on (rank 0's, broadcast), and the restore in the order that makes a resumed run
continue exactly."""
import glob
import json
import os
import re

from .errors import UsageError

RESUME_KEY = 1 << 30        # kvstore key of the resume-epoch broadcast (never a parameter's)


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
