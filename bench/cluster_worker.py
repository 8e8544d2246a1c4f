"""The training workload bench/cluster.py runs on every worker of the emulated cluster.

A fixed model on synthetic data, trained with Gluon's Trainer on ``--kvstore``:

1. one distributed step initialises the keys and lines the workers up;
2. ``--warmup`` rounds, not timed;
3. ``--steps`` timed rounds. A round is one distributed step (forward, backward,
   ``trainer.step`` through the kvstore) and then one compute-only step (the same
   with a second Trainer that has no kvstore): the step with communication
   removed. Every distributed step is a synchronisation point, so all workers
   run their compute-only steps at the same moment and share the CPU as in the
   distributed steps; interleaving the two makes both see the same background
   load (the machine's 2 cores are shared with whatever else runs).

Around the timed rounds the worker reads its own interface byte counters
(``/proc/net/dev``: this namespace's interfaces) and, for kvstore_ext types,
``kv.comm_stats()``; with policy='auto' the result also holds ``kv.policy_decisions()``
(the agreed link rate and the choice per key).

Every step ends with ``mx.nd.waitall()``, so a step's time is the whole step.
Results go to ``OUT_DIR/worker-<DMLC_WORKER_ID>.json``.

Models (synthetic 3x32x32 images, 10 classes), sized so a step computes in well
under a second on one core:

* ``vgg``: FC-heavy; two small convs, then Dense 4096->512->512->10: 2.38 M
  parameters (9.5 MB of float32 gradient), 88% in the first Dense, 99% in tensors
  above Hylo's default size_threshold (32768).
* ``resnet``: conv-heavy; a stride-2 stem (as ImageNet ResNets downsample early),
  then three residual stages (32/64/128 channels, one
  basic block each): 0.31 M parameters (1.2 MB), 99% in convolutions, 84% in the
  three conv tensors above the size_threshold.
* any gluoncv model-zoo name (``resnet50_v1``: 25.6 M parameters, ``vgg16``: 138 M),
  built with random weights on synthetic 3x224x224 images: the sizes users train,
  at a batch these cores can compute (bench/real_models.py).
"""
import argparse
import json
import os
import sys
import time
import traceback

import numpy as np


NATIVE_KVSTORES = ('dist_sync', 'dist_async', 'dist_sync_device', 'dist_device_sync',
                   'dist')


def build_model(name):
    from mxnet.gluon import nn

    if name == 'vgg':
        net = nn.HybridSequential()
        net.add(nn.Conv2D(32, 3, padding=1, activation='relu'), nn.MaxPool2D(2),
                nn.Conv2D(64, 3, padding=1, activation='relu'), nn.MaxPool2D(2),
                nn.Flatten(), nn.Dense(512, activation='relu'),
                nn.Dense(512, activation='relu'), nn.Dense(10))
        return net
    if name == 'resnet':
        class Block(nn.HybridBlock):
            """Basic residual block (two 3x3 convs), 1x1 projection when shapes change."""

            def __init__(self, channels, stride, project):
                super().__init__()
                self.body = nn.HybridSequential()
                self.body.add(nn.Conv2D(channels, 3, stride, 1, use_bias=False),
                              nn.BatchNorm(), nn.Activation('relu'),
                              nn.Conv2D(channels, 3, 1, 1, use_bias=False), nn.BatchNorm())
                self.project = None
                if project:
                    self.project = nn.HybridSequential()
                    self.project.add(nn.Conv2D(channels, 1, stride, use_bias=False),
                                     nn.BatchNorm())

            def hybrid_forward(self, F, x):
                shortcut = x if self.project is None else self.project(x)
                return F.relu(self.body(x) + shortcut)

        net = nn.HybridSequential()
        net.add(nn.Conv2D(32, 3, 2, 1, use_bias=False), nn.BatchNorm(), nn.Activation('relu'))
        net.add(Block(32, 1, False), Block(64, 2, True), Block(128, 2, True))
        net.add(nn.GlobalAvgPool2D(), nn.Dense(10))
        return net
    from gluoncv import model_zoo
    if name.lower() in model_zoo.get_model_list():
        return model_zoo.get_model(name, pretrained=False)
    raise ValueError('unknown model %r (vgg, resnet or a gluoncv model-zoo name)' % name)


def image_size(name):
    """Side of the synthetic images: 32 for the small models, 224 for the model zoo's
    ImageNet nets (their Dense layers' shapes depend on it: VGG-16's first is
    25088 x 4096 only at 224)."""
    return 32 if name in ('vgg', 'resnet') else 224


def net_counters():
    """(rx_bytes, tx_bytes) summed over this network namespace's interfaces but lo."""
    rx = tx = 0
    with open('/proc/net/dev') as f:
        for line in f.readlines()[2:]:
            name, _, fields = line.partition(':')
            if name.strip() != 'lo':
                values = fields.split()
                rx, tx = rx + int(values[0]), tx + int(values[8])
    return rx, tx


def comm_bytes(kv):
    """push_bytes + pull_bytes so far, or None for MXNet's own kvstores."""
    if not hasattr(kv, 'comm_stats'):
        return None
    stats = kv.comm_stats()
    return {'push_bytes': stats['push_bytes'], 'pull_bytes': stats['pull_bytes']}


class ServerSideTrainer:
    """For MXNet's built-in compression (``{'type': '2bit', 'threshold': ...}``).

    It refuses ``pushpull``, which Gluon's Trainer always uses, so this does what
    MXNet's Module API does: the optimizer runs on the servers, every key is
    initialised in one ``kv.init``, and a step pushes each gradient and pulls each
    weight. ``step(batch_size)`` as Gluon's Trainer.
    """

    def __init__(self, net, kv, compression_params, optimizer, batch_size):
        import mxnet as mx
        self.kv = kv
        self.params = [p for p in net.collect_params().values() if p.grad_req != 'null']
        name, options = optimizer
        kv.set_gradient_compression(compression_params)
        kv.set_optimizer(mx.optimizer.create(name, rescale_grad=1.0 / batch_size, **options))
        self.initialised = False

    def step(self, batch_size):
        if not self.initialised:      # after the first forward: shapes are known then
            self.kv.init(list(range(len(self.params))), [p.data() for p in self.params])
            self.initialised = True
        for i, p in enumerate(self.params):
            self.kv.push(i, p.grad(), priority=-i)
            self.kv.pull(i, p.data(), priority=-i)


def timed_steps(net, trainer, data, label, loss_fn, steps):
    """(wall seconds, CPU seconds of this process) of each of ``steps`` training steps
    (forward, backward, trainer.step). CPU well below wall: waiting (for the network,
    or for a core other processes hold)."""
    import mxnet as mx
    from mxnet import autograd
    wall, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(data.shape[0])
        mx.nd.waitall()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='vgg',
                        help='vgg, resnet, or a gluoncv model-zoo name (e.g. resnet50_v1)')
    parser.add_argument('--kvstore', default='dist_sync')
    parser.add_argument('--compression-params', default='{}', type=json.loads,
                        help='JSON dict given to the Trainer as compression_params')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--steps', type=int, default=20, help='timed rounds')
    parser.add_argument('--warmup', type=int, default=3, help='untimed rounds')
    parser.add_argument('--out-dir', required=True)
    parser.add_argument('--crash-worker', type=int,
                        help='for tests: this DMLC_WORKER_ID exits 1 after the warm-up')
    args = parser.parse_args()

    import mxnet as mx
    from mxnet import gluon
    if args.kvstore not in NATIVE_KVSTORES:
        import kvstore_ext  # noqa: F401  (registers dist_sync_<scheme>)
        import kvstore_ext.dad

    launch_id = int(os.environ.get('DMLC_WORKER_ID', '0'))
    mx.random.seed(42)
    np.random.seed(42)
    net = build_model(args.model)
    if args.kvstore == 'dist_sync_dad':     # dAD sends the Dense layers' captured rows
        kvstore_ext.dad.attach(net)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    side = image_size(args.model)
    data = mx.nd.random.uniform(shape=(args.batch_size, 3, side, side))
    label = mx.nd.array(np.arange(args.batch_size) % 10)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    optimizer = ('sgd', {'learning_rate': 0.01, 'momentum': 0.9})

    kv = mx.kv.create(args.kvstore)
    if args.kvstore in NATIVE_KVSTORES and 'type' in args.compression_params:
        trainer = ServerSideTrainer(net, kv, args.compression_params, optimizer,
                                    args.batch_size)
    else:
        trainer = gluon.Trainer(net.collect_params(), *optimizer, kvstore=kv,
                                compression_params=args.compression_params or None,
                                update_on_kvstore=False)
    local = gluon.Trainer(net.collect_params(), *optimizer, kvstore=None)

    def rounds(count):
        """{'step_s', 'step_cpu_s', 'compute_step_s', 'compute_cpu_s'}: a list each."""
        times = {'step_s': [], 'step_cpu_s': [], 'compute_step_s': [], 'compute_cpu_s': []}
        for _ in range(count):
            wall, cpu = timed_steps(net, trainer, data, label, loss_fn, 1)
            times['step_s'] += wall
            times['step_cpu_s'] += cpu
            wall, cpu = timed_steps(net, local, data, label, loss_fn, 1)
            times['compute_step_s'] += wall
            times['compute_cpu_s'] += cpu
            if args.kvstore == 'dist_sync_dad':     # no kvstore took these rows
                for layer in kvstore_ext.dad.layers():
                    layer.take()
        return times

    timed_steps(net, trainer, data, label, loss_fn, 1)
    rounds(args.warmup)
    if args.crash_worker == launch_id:
        raise RuntimeError('worker %d crashing on purpose' % launch_id)
    net_before, comm_before = net_counters(), comm_bytes(kv)
    times = rounds(args.steps)
    net_after, comm_after = net_counters(), comm_bytes(kv)

    params = [p for p in net.collect_params().values() if p.grad_req != 'null']
    result = {
        'launch_id': launch_id, 'rank': kv.rank, 'num_workers': kv.num_workers,
        'model': args.model, 'kvstore': args.kvstore,
        'compression_params': args.compression_params, 'batch_size': args.batch_size,
        'parameters': int(sum(p.data().size for p in params)),
        'gradient_bytes': int(sum(p.data().size * np.dtype(p.dtype).itemsize
                                  for p in params)),
        **times,
        'link_rx_bytes': net_after[0] - net_before[0],
        'link_tx_bytes': net_after[1] - net_before[1],
        'comm_stats': None if comm_before is None else {
            k: comm_after[k] - comm_before[k] for k in comm_before},
        # policy='auto': the link rate its plans use and its choice per key
        'policy': kv.policy_decisions() if hasattr(kv, 'policy_decisions') else None,
    }
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, 'worker-%d.json' % launch_id)
    with open(path + '.tmp', 'w') as f:
        json.dump(result, f)
    os.replace(path + '.tmp', path)
    print('worker %d (rank %d): step %.3f s, compute %.3f s' % (
        launch_id, kv.rank, float(np.median(times['step_s'])),
        float(np.median(times['compute_step_s']))), flush=True)


def run():
    """main(), but a failure ends the process at once with exit code 1: a normal
    exit would wait in ps-lite's shutdown barrier for nodes that never come, and the
    job would hang instead of failing."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


if __name__ == '__main__':
    run()
