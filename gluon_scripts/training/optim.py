"""The Gluon trainer of a script: optimizer, weight decay, momentum, and the
``--lr-mode`` learning-rate schedule (cosine, step, constant; linear warm-up)."""
from .errors import UsageError


def lr_step_epochs(args):
    """The --lr-steps epochs, checked: increasing and positive."""
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
        steps = sorted({max(1, int(e * batches_per_epoch)) for e in lr_step_epochs(args)})
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
