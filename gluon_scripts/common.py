"""What every training script shares: the flags, the kvstore, the training loop's
logging (samples/s, loss, accuracy, bytes per step) and the final JSON summary."""
import argparse
import json
import logging
import math
import os
import sys
import time

import numpy as np


def base_parser(description):
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--kvstore', default='dist_sync_hylo',
                   help="kvstore type: one registered by kvstore_ext "
                        "(dist_sync_hylo, dist_sync_none, dist_sync_2bit, ...) or MXNet's own "
                        "(dist_sync, local, device, ...)")
    p.add_argument('--compression-params', default='{}', type=json.loads,
                   help='JSON dict for the scheme, e.g. \'{"size_threshold": 32768}\'')
    p.add_argument('--num-epochs', type=int, default=3)
    p.add_argument('--batch-size', type=int, default=64, help='per worker')
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--lr-mode', default='cosine', choices=('cosine', 'step', 'constant'),
                   help='learning-rate schedule over the whole run')
    p.add_argument('--lr-steps', default='', help="step mode: epochs at which the lr is "
                   "multiplied by --lr-factor, e.g. '30,60,80'")
    p.add_argument('--lr-factor', type=float, default=0.1)
    p.add_argument('--warmup-epochs', type=float, default=0.0,
                   help='linear warm-up of the lr from 0 over this many epochs')
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--wd', type=float, default=1e-4)
    p.add_argument('--log-interval', type=int, default=20, help='batches between logs')
    p.add_argument('--seed', type=int, default=42)
    p.add_argument('--synthetic', action='store_true',
                   help='random data of the real shapes (for benchmarks)')
    p.add_argument('--summary-json', default=None, help='write a final JSON summary here')
    return p


def setup_logging(rank):
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format='%(asctime)s [rank ' + str(rank) + '] %(message)s')
    return logging.getLogger('train')


def create_kvstore(name, compression_params):
    """The kvstore (kvstore_ext types are registered on import); compression set."""
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(name)
    if compression_params:
        kv.set_gradient_compression(compression_params)
    return kv


def lr_scheduler(args, batches_per_epoch):
    """The --lr-mode schedule in optimizer updates (one update per training step)."""
    import mxnet as mx
    total = max(1, int(args.num_epochs * batches_per_epoch))
    warmup = int(args.warmup_epochs * batches_per_epoch)
    if args.lr_mode == 'cosine':
        return mx.lr_scheduler.CosineScheduler(max_update=total, base_lr=args.lr, final_lr=0,
                                               warmup_steps=warmup)
    if args.lr_mode == 'step' and args.lr_steps:
        steps = [int(float(e) * batches_per_epoch) for e in args.lr_steps.split(',')]
        return mx.lr_scheduler.MultiFactorScheduler(step=[max(1, s) for s in steps],
                                                    factor=args.lr_factor, base_lr=args.lr,
                                                    warmup_steps=warmup)
    return mx.lr_scheduler.FactorScheduler(step=total + 1, factor=1.0, base_lr=args.lr,
                                           warmup_steps=warmup)


def traffic(kv):
    """This worker's byte counts, or None for MXNet's own kvstores (no counters)."""
    return kv.comm_stats() if hasattr(kv, 'comm_stats') else None


class Progress:
    """A one-line progress bar on a terminal; silent when the output is a file."""

    def __init__(self, total, enabled):
        self.total, self.enabled = total, enabled and sys.stdout.isatty()

    def update(self, done, text=''):
        if self.enabled:
            width = 30
            filled = int(width * done / max(self.total, 1))
            sys.stdout.write('\r[%s%s] %d/%d %s' % ('#' * filled, '.' * (width - filled),
                                                     done, self.total, text))
            sys.stdout.flush()

    def close(self):
        if self.enabled:
            sys.stdout.write('\n')


def evaluate(net, batches, ctx):
    """Top-1 accuracy of ``net`` on (data, label) NDArray batches."""
    import mxnet as mx
    metric = mx.metric.Accuracy()
    for data, label in batches:
        metric.update([label.as_in_context(ctx)], [net(data.as_in_context(ctx))])
    return metric.get()[1]


def train(net, trainer, kv, train_batches, eval_fn, args, log, ctxs, batches_per_epoch,
          start_epoch=0, on_epoch_end=None):
    """The loop: forward/backward on each device, ``trainer.step``, logs and summary."""
    import mxnet as mx
    from mxnet import autograd, gluon
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    history, t_start = [], time.time()
    last_traffic = traffic(kv)
    for epoch in range(start_epoch, args.num_epochs):
        metric, t_epoch, losses = mx.metric.Accuracy(), time.time(), []
        progress = Progress(batches_per_epoch, True)
        t_interval, seen = time.time(), 0
        for i, (data, label) in enumerate(train_batches()):
            datas = gluon.utils.split_and_load(data, ctxs, even_split=False)
            labels = gluon.utils.split_and_load(label, ctxs, even_split=False)
            with autograd.record():
                outs = [net(x) for x in datas]
                batch_losses = [loss_fn(o, y) for o, y in zip(outs, labels)]
            for l in batch_losses:
                l.backward()
            # the kvstore sums over workers: normalise by the global batch
            trainer.step(data.shape[0] * kv.num_workers)
            metric.update(labels, outs)
            losses.append(sum(l.mean().asscalar() for l in batch_losses) / len(batch_losses))
            seen += data.shape[0]
            progress.update(i + 1, 'loss %.3f' % losses[-1])
            if args.log_interval and (i + 1) % args.log_interval == 0:
                now = traffic(kv)
                per_step = _per_step(last_traffic, now, args.log_interval)
                log.info('epoch %d batch %d: %.1f samples/s, loss %.4f, train acc %.4f%s',
                         epoch, i + 1, seen / (time.time() - t_interval), np.mean(losses[-args.log_interval:]),
                         metric.get()[1], per_step)
                last_traffic, t_interval, seen = now, time.time(), 0
        progress.close()
        accuracy = eval_fn()
        elapsed = time.time() - t_epoch
        history.append({'epoch': epoch, 'train_loss': float(np.mean(losses)),
                        'train_acc': metric.get()[1], 'test_acc': accuracy,
                        'epoch_time': elapsed, 'wall_time': time.time() - t_start})
        log.info('epoch %d done in %.1fs: loss %.4f, train acc %.4f, test acc %.4f',
                 epoch, elapsed, history[-1]['train_loss'], history[-1]['train_acc'], accuracy)
        if on_epoch_end:
            on_epoch_end(epoch)
    return history


def _per_step(before, after, steps):
    if not before or not after:
        return ''
    return ', pushed %.1f KB/step, pulled %.1f KB/step' % (
        (after['push_bytes'] - before['push_bytes']) / steps / 1024,
        (after['pull_bytes'] - before['pull_bytes']) / steps / 1024)


def summarize(args, kv, history, log, extra=None):
    """Final report: accuracy, time, bytes saved against float32; JSON if asked."""
    stats = traffic(kv)
    summary = {'kvstore': args.kvstore, 'compression_params': args.compression_params,
               'rank': kv.rank, 'num_workers': kv.num_workers, 'epochs': history,
               'final_test_acc': history[-1]['test_acc'] if history else None,
               'total_time': history[-1]['wall_time'] if history else 0.0,
               'comm_stats': stats}
    if stats and stats['raw_bytes']:
        summary['push_saved'] = 1 - stats['push_bytes'] / stats['raw_bytes']
        summary['pull_saved'] = 1 - stats['pull_bytes'] / stats['raw_bytes']
        log.info('bytes pushed %.2f MB vs %.2f MB as float32 (%.1fx less, %.1f%% saved); '
                 'pulled %.2f MB', stats['push_bytes'] / 1e6, stats['raw_bytes'] / 1e6,
                 stats['raw_bytes'] / max(stats['push_bytes'], 1), 100 * summary['push_saved'],
                 stats['pull_bytes'] / 1e6)
    if history:
        log.info('final test accuracy %.4f after %d epochs in %.1fs', summary['final_test_acc'],
                 len(history), summary['total_time'])
    summary.update(extra or {})
    if args.summary_json:
        path = args.summary_json.replace('{rank}', str(kv.rank))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(summary, f, indent=1)
    return summary


def fail(message):
    """A clean error for the user (no traceback) and exit code 2."""
    sys.stderr.write('error: %s\n' % message)
    sys.exit(2)


def batches_in(n, batch_size):
    return int(math.ceil(n / float(batch_size)))
