"""The training loop: forward and backward on each device, the workers' gradients
summed by the kvstore and the update (a void step is skipped), periodic log lines,
evaluation and the epoch's record after every epoch; a diverged run stops with
advice."""
import time

import numpy as np

from . import errors
from .data import seed_epoch
from .traffic import Traffic, format_size
from .report import Progress


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


VOID_STEPS_IN_A_ROW = 5     # then the run has diverged, not met a bad batch


def _broadcast_before_first_push(trainer):
    """Gluon's Trainer broadcasts rank 0's initial weights lazily, inside the first
    ``allreduce_grads``, through the same kvstore keys as the gradients. With MXNet's
    own dist_sync a worker's first gradient push can then reach the servers before its
    broadcast pull: once every worker has pushed, that pull returns the first round's
    gradient sum instead of the weights, and the worker's replica drifts away for good
    (docs/decisions/dist-sync-broadcast-first.md). Broadcasting first and waiting for it closes that
    window. (kvstore_ext's stores broadcast through keys of their own.)"""
    import mxnet as mx
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
        mx.nd.waitall()


def _sum_and_update(trainer, params, batch_size):
    """``trainer.step`` in its two halves, so that a void step is skipped: if a worker's
    gradient was non-finite, every worker's sum holds NaN or Inf (kvstore_ext voids the
    step; dist_sync adds the NaN in), every worker sees it and none updates, so the
    replicas stay equal. Returns True if the update was applied."""
    _broadcast_before_first_push(trainer)
    trainer.allreduce_grads()
    total = sum(p.list_grad()[0].sum() for p in params if p.grad_req != 'null')
    if not np.isfinite(total.asscalar()):
        return False
    trainer.update(batch_size)
    return True


def _inject_nan(params):
    """Fault injection (--nan-at-step): a NaN in this worker's first gradient."""
    grad = next(p for p in params if p.grad_req != 'null').list_grad()[0]
    grad.reshape((-1,))[0:1] = np.nan


def _diverged(log, progress, epoch, batch, trainer, what):
    progress.clear()
    log.error('epoch %d batch %d: %s: training diverged at lr %g; lower --lr or lengthen '
              '--warmup-epochs', epoch, batch + 1, what, trainer.learning_rate)
    errors.exit_script(1)


def train(net, trainer, kv, data, args, log, ctxs, start_epoch=0, history=None,
          classes=None, label_smoothing=0.0, on_epoch_end=None):
    """The loop: forward/backward on each device, ``trainer.step``, logs; evaluation
    and ``on_epoch_end(epochs_done, history)`` after every epoch. Returns the history."""
    import mxnet as mx
    from mxnet import autograd, gluon
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=not label_smoothing)
    history = list(history or [])
    traffic = Traffic(kv, net)
    params = list(net.collect_params().values())
    void_steps, void_in_a_row = [], 0
    t_start = time.time()
    top5 = bool(classes and classes > 5)
    for epoch in range(start_epoch, args.num_epochs):
        seed_epoch(args, epoch, kv.rank)
        metric, losses = mx.metric.Accuracy(), []
        progress = Progress(data.batches_per_epoch)
        t_epoch = t_interval = time.time()
        cpu_epoch = time.process_time()     # this process, every thread: the engine's too
        seen = seen_interval = 0
        at_epoch = at_interval = traffic.snapshot()
        first_step = traffic.steps
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
            if traffic.steps == args.nan_at_step and kv.rank == 0:
                _inject_nan(params)
            # the kvstore sums over workers: normalise by the global batch
            applied = _sum_and_update(trainer, params, x.shape[0] * kv.num_workers)
            traffic.steps += 1
            void_in_a_row = 0 if applied else void_in_a_row + 1
            if not applied:
                void_steps.append(traffic.steps - 1)
                progress.clear()
                log.warning('epoch %d batch %d: void step (a worker\'s gradient was not '
                            'finite): no worker updated', epoch, i + 1)
                if void_in_a_row >= VOID_STEPS_IN_A_ROW:
                    _diverged(log, progress, epoch, i, trainer,
                              '%d void steps in a row' % void_in_a_row)
                continue
            metric.update(labels, outs)
            losses.append(sum(l.sum().asscalar() for l in batch_losses) / x.shape[0])
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
        steps = traffic.steps - first_step
        train_time = time.time() - t_epoch
        train_cpu = time.process_time() - cpu_epoch
        rates = Traffic.per_step(at_epoch, traffic.snapshot(), steps)
        t_eval = time.time()
        top1, top5_acc = evaluate(net, data.eval_batches(), ctxs, top5)
        eval_time = time.time() - t_eval
        record = {'epoch': epoch, 'train_loss': float(np.mean(losses)),
                  'train_acc': metric.get()[1], 'test_acc': top1,
                  'samples_per_sec': seen / train_time, 'steps': steps,
                  'lr': trainer.learning_rate, 'train_time': train_time,
                  'train_cpu': train_cpu,
                  'eval_time': eval_time, 'epoch_time': time.time() - t_epoch,
                  'void_steps': [s for s in void_steps if s >= first_step],
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
                 Traffic.text(rates), format_size(rates['raw_bytes']))
        if on_epoch_end:
            on_epoch_end(epoch + 1, history)
    return history
