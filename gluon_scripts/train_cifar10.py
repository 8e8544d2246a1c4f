"""Train a gluoncv CIFAR model (cifar_resnet20_v1, cifar_wideresnet16_10, ...) on CIFAR-10
or CIFAR-100 with any kvstore, e.g. Hylo's compressed dist_sync.

    python -m kvstore_ext.launch -n 4 -s 2 python gluon_scripts/train_cifar10.py \\
        --kvstore dist_sync_hylo --model cifar_resnet20_v1 --data-dir ~/data/cifar10

Data (--data-dir; no download is attempted). CIFAR-10 in either version:
  binary (what MXNet's gluon.data.vision.CIFAR10 reads, from cifar-10-binary.tar.gz):
      DIR/data_batch_1.bin ... DIR/data_batch_5.bin and DIR/test_batch.bin
      (or the same files in DIR/cifar-10-batches-bin/, as the archive unpacks)
  python (cifar-10-python.tar.gz):
      DIR/data_batch_1 ... DIR/data_batch_5 and DIR/test_batch (or in DIR/cifar-10-batches-py/)
With --dataset cifar100: DIR/train.bin and DIR/test.bin (cifar-100-binary.tar.gz, also in
DIR/cifar-100-binary/) or DIR/train and DIR/test (cifar-100-python/); fine labels.

Training: every epoch the 50,000 images are permuted (seeded by --seed and the epoch)
and dealt out to the workers; random crop with 4 pixels of padding, horizontal flip,
per-channel normalisation, as gluoncv's train_cifar10.py.
"""
import os
import pickle
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import cli, data, deps, errors, kvstore_setup, runner  # noqa: E402

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.2023, 0.1994, 0.2010], np.float32).reshape(1, 3, 1, 1)

# dataset -> (title, classes, [(version, subfolder, train files, test files)])
LAYOUTS = {
    'cifar10': ('CIFAR-10', 10, [
        ('binary', 'cifar-10-batches-bin', ['data_batch_%d.bin' % i for i in range(1, 6)],
         ['test_batch.bin']),
        ('python', 'cifar-10-batches-py', ['data_batch_%d' % i for i in range(1, 6)],
         ['test_batch'])]),
    'cifar100': ('CIFAR-100', 100, [
        ('binary', 'cifar-100-binary', ['train.bin'], ['test.bin']),
        ('python', 'cifar-100-python', ['train'], ['test'])]),
}
TRAIN_SIZE, TEST_SIZE = 50000, 10000


def default_data_dir(dataset):
    """MXNet's own dataset folder ($MXNET_HOME/datasets/cifar10, as gluon's CIFAR10)."""
    return os.path.join(os.environ.get('MXNET_HOME', '~/.mxnet'), 'datasets', dataset)


def find_files(data_dir, dataset):
    """(version, train paths, test paths) of the first complete layout in data_dir."""
    title, _, layouts = LAYOUTS[dataset]
    root = os.path.expanduser(data_dir)
    for version, sub, train, test in layouts:
        for folder in (root, os.path.join(root, sub)):
            paths = [os.path.join(folder, f) for f in train + test]
            if all(os.path.isfile(p) for p in paths):
                return version, paths[:len(train)], paths[len(train):]
    binary, python = layouts[0], layouts[1]
    raise errors.UsageError(
        '--data-dir %s: no %s data there; put the binary version (%s, %s; what MXNet\'s '
        'gluon.data.vision reads; also accepted in %s/) or the python version (%s, %s; also '
        'in %s/) in that folder. Nothing is downloaded.'
        % (data_dir, title, _names(binary[2]), ', '.join(binary[3]), binary[1],
           _names(python[2]), ', '.join(python[3]), python[1]))


def _names(files):
    return files[0] if len(files) == 1 else '%s ... %s' % (files[0], files[-1])


def read_binary(path, dataset):
    """(uint8 N x 3 x 32 x 32, int32 labels) of one binary batch file."""
    label_bytes = 1 if dataset == 'cifar10' else 2          # cifar100: coarse, fine
    raw = np.fromfile(path, dtype=np.uint8)
    width = 3072 + label_bytes
    if raw.size == 0 or raw.size % width:
        raise errors.UsageError('%s: not a %s binary batch file (%d bytes, not a multiple of '
                                'the %d-byte record)' % (path, LAYOUTS[dataset][0], raw.size,
                                                         width))
    raw = raw.reshape(-1, width)
    return raw[:, label_bytes:].reshape(-1, 3, 32, 32), raw[:, label_bytes - 1].astype(np.int32)


def read_python(path, dataset):
    with open(path, 'rb') as f:
        try:
            batch = pickle.load(f, encoding='bytes')
        except Exception as e:     # a truncated or foreign file: say which
            raise errors.UsageError('%s: not a %s python batch file (%s)'
                                    % (path, LAYOUTS[dataset][0], e))
    labels = batch[b'labels' if dataset == 'cifar10' else b'fine_labels']
    data = np.asarray(batch[b'data'], dtype=np.uint8)
    return data.reshape(-1, 3, 32, 32), np.asarray(labels, dtype=np.int32)


def load(data_dir, dataset):
    version, train, test = find_files(data_dir, dataset)
    read = read_binary if version == 'binary' else read_python
    parts = [[read(p, dataset) for p in paths] for paths in (train, test)]
    return [np.concatenate([p[i] for p in part]) for part in parts for i in (0, 1)]


def normalize(x):
    return (x.astype(np.float32) / 255.0 - MEAN) / STD


def augment(x, rng, pad=4):
    """Random 32x32 crop of the zero-padded image, random horizontal flip, normalise."""
    n, _, h, w = x.shape
    padded = np.zeros((n, 3, h + 2 * pad, w + 2 * pad), np.uint8)
    padded[:, :, pad:pad + h, pad:pad + w] = x
    dy, dx = rng.integers(0, 2 * pad + 1, n), rng.integers(0, 2 * pad + 1, n)
    flip = rng.random(n) < 0.5
    out = np.empty_like(x)
    for i in range(n):
        crop = padded[i, :, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
        out[i] = crop[:, :, ::-1] if flip[i] else crop
    return normalize(out)


def parse_args():
    p = cli.base_parser(*__doc__.split('\n\n', 1),
                        num_epochs=200, batch_size=128, lr=0.1, lr_mode='step',
                        lr_steps='100,150', optimizer='nag', wd=1e-4)
    g = p.script_group
    g.add_argument('--model', default='cifar_resnet20_v1',
                   help='a gluoncv CIFAR model (cifar_resnet20_v1, cifar_resnet56_v1, '
                        'cifar_resnet110_v2, cifar_wideresnet16_10, cifar_resnext29_16x64d, ...)')
    g.add_argument('--dataset', default='cifar10', choices=sorted(LAYOUTS),
                   help='cifar100: the 100 fine labels')
    g.add_argument('--data-dir', default=None,
                   help='folder with the dataset files (see below); default: '
                        '~/.mxnet/datasets/<dataset>, where MXNet keeps it')
    g.add_argument('--drop-rate', type=float, default=0.0, help='dropout of wide resnets')
    return p.parse_args()


def main():
    args = parse_args()
    args.data_dir = args.data_dir or default_data_dir(args.dataset)
    title, classes, _ = LAYOUTS[args.dataset]

    def check_data():
        find_files(args.data_dir, args.dataset)

    def make_data(kv, worker_batch):
        if args.synthetic:
            return data.SyntheticData(args, (3, 32, 32), classes, TRAIN_SIZE, TEST_SIZE,
                                      kv.rank, kv.num_workers, worker_batch)
        x_train, y_train, x_test, y_test = load(args.data_dir, args.dataset)
        return data.ArrayData(args, x_train, y_train, x_test, y_test, kv.rank,
                              kv.num_workers, worker_batch, augment=augment,
                              prepare=normalize)

    def make_net(ctxs):
        import mxnet as mx
        net = get_net(args.model, classes, args.drop_rate)
        net.initialize(mx.init.Xavier(), ctx=ctxs)
        return net

    get_net(args.model, classes, args.drop_rate, check_only=True)
    runner.run(args, '%s-%s' % (args.dataset, args.model), check_data, make_data, make_net,
               classes=classes, extra_summary={'model': args.model, 'dataset': args.dataset})


def get_net(model, classes, drop_rate, check_only=False):
    kvstore_setup.import_mxnet()
    zoo = deps.require_or_exit('gluoncv.model_zoo', "--model (gluoncv's CIFAR models)")
    get_model, get_model_list = zoo.get_model, zoo.get_model_list
    if model not in get_model_list():
        errors.fail('unknown --model %r; CIFAR models: %s' % (
            model, ', '.join(m for m in get_model_list() if m.startswith('cifar_'))))
    if check_only:
        return None
    kwargs = {'classes': classes}
    if model.startswith('cifar_wideresnet'):
        kwargs['drop_rate'] = drop_rate
    return get_model(model, **kwargs)


if __name__ == '__main__':
    main()
