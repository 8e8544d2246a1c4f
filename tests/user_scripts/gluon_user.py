"""A user's own Gluon script, of the shape MXNet's examples have: the kvstore type is a
command-line string handed to ``gluon.Trainer``, and nothing here imports kvstore_ext.
With kvstore_ext installed, ``--kvstore dist_sync_hylo`` must still compress
(kvstore_ext_autoload.py), and the job must end when the script does.

Synthetic data, a small conv net and a few steps: it runs in seconds on a CPU.
"""
import argparse

import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

parser = argparse.ArgumentParser(description='a Gluon script with --kvstore')
parser.add_argument('--kvstore', default='device')
parser.add_argument('--steps', type=int, default=8)
parser.add_argument('--batch-size', type=int, default=16)
args = parser.parse_args()

mx.random.seed(1)
net = nn.HybridSequential()
net.add(nn.Conv2D(16, 3, activation='relu'), nn.MaxPool2D(), nn.Conv2D(32, 3, activation='relu'),
        nn.Flatten(), nn.Dense(64, activation='relu'), nn.Dense(10))
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05, 'momentum': 0.9},
                        kvstore=args.kvstore)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
data = nd.random.uniform(shape=(args.batch_size, 1, 16, 16))
label = nd.array([i % 10 for i in range(args.batch_size)])
for step in range(args.steps):
    with autograd.record():
        loss = loss_fn(net(data), label)
    loss.backward()
    trainer.step(args.batch_size)
print('kvstore %s (%s), rank %d of %d: loss %.4f after %d steps' % (
    trainer._kvstore.type, type(trainer._kvstore).__module__, trainer._kvstore.rank,
    trainer._kvstore.num_workers, loss.mean().asscalar(), args.steps), flush=True)
