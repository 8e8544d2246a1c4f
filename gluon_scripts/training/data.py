"""Where batches come from: a data source is an object with ``batches_per_epoch``,
``train_batches(epoch)`` and ``eval_batches()``. In-memory arrays (sharded over the
workers, reshuffled every epoch from ``--seed``) and synthetic data are here; a script
with another format (RecordIO) brings its own class of the same shape.

Every worker takes the same number of batches an epoch (dist_sync needs the same
number of steps from everyone), and the order depends only on (seed, epoch, rank), so a
resumed run sees the batches the uninterrupted run would have seen."""
import os

import numpy as np

from .errors import UsageError


def rng(args, epoch, rank, stream=0):
    """The generator of one (epoch, rank, stream): the same in a resumed run."""
    return np.random.default_rng([args.seed, epoch, rank, stream])


def seed_epoch(args, epoch, rank):
    """Seed MXNet (dropout, MXNet-side augmentation) and NumPy for this epoch."""
    import mxnet as mx
    s = (args.seed * 1000003 + epoch * 101 + rank) % (2 ** 31)
    mx.random.seed(s, ctx='all')
    np.random.seed(s)


class ArrayData:
    """Batches of in-memory NumPy arrays, sharded over workers.

    Every epoch the whole training set is permuted with a generator seeded by (seed,
    epoch) (identical on every worker), worker ``rank`` takes every ``num_workers``-th
    sample of it, and every worker gets the same number of full batches (dist_sync
    needs the same number of steps from everyone). ``augment(x, rng)`` turns a uint8 or
    float batch into the float32 input; ``prepare(x)`` does the same for evaluation.
    """

    def __init__(self, args, x_train, y_train, x_test, y_test, rank, num_workers,
                 worker_batch, augment=None, prepare=None, eval_batch=None):
        self.args, self.rank, self.num_workers = args, rank, num_workers
        self.x_train, self.y_train, self.x_test, self.y_test = x_train, y_train, x_test, y_test
        self.batch = worker_batch
        self.eval_batch = eval_batch or max(worker_batch, 256)
        self.augment = augment or (lambda x, g: prepare(x) if prepare else x)
        self.prepare = prepare or (lambda x: x)
        per_worker = len(y_train) // num_workers
        self.batches_per_epoch = limit_batches(per_worker // worker_batch, args.num_batches)
        if self.batches_per_epoch < 1:
            raise UsageError('%d training samples are too few for %d worker(s) with %d '
                             'samples a step each' % (len(y_train), num_workers, worker_batch))

    def train_batches(self, epoch):
        import mxnet as mx
        order = rng(self.args, epoch, 0).permutation(len(self.y_train))
        mine = order[self.rank::self.num_workers][:self.batches_per_epoch * self.batch]
        g = rng(self.args, epoch, self.rank, 1)
        for i in range(self.batches_per_epoch):
            idx = np.sort(mine[i * self.batch:(i + 1) * self.batch])    # sorted: faster reads
            idx = idx[g.permutation(len(idx))]
            yield (mx.nd.array(self.augment(self.x_train[idx], g)),
                   mx.nd.array(self.y_train[idx], dtype='float32'))

    def eval_batches(self):
        import mxnet as mx
        n = len(self.y_test)
        count = limit_batches(-(-n // self.eval_batch), self.args.num_batches)
        for i in range(count):
            s = slice(i * self.eval_batch, (i + 1) * self.eval_batch)
            yield (mx.nd.array(self.prepare(self.x_test[s])),
                   mx.nd.array(self.y_test[s], dtype='float32'))


class SyntheticData:
    """Random data of the real shapes, for benchmarks: ``pool`` batches generated once
    (per rank) and cycled, so that generating data costs nothing in the measurement."""

    def __init__(self, args, shape, classes, train_size, test_size, rank, num_workers,
                 worker_batch, pool=4):
        self.args, self.batch = args, worker_batch
        g = rng(args, 0, rank, 7)
        self.pool = [(g.standard_normal((worker_batch,) + tuple(shape), dtype=np.float32),
                      g.integers(0, classes, worker_batch).astype(np.float32))
                     for _ in range(pool)]
        self.batches_per_epoch = limit_batches(train_size // num_workers // worker_batch,
                                        args.num_batches)
        self.eval_count = limit_batches(-(-test_size // worker_batch), args.num_batches)
        if self.batches_per_epoch < 1:
            raise UsageError('--batch-size too large for the synthetic data set')

    def _cycle(self, count):
        import mxnet as mx
        arrays = [(mx.nd.array(x), mx.nd.array(y)) for x, y in self.pool]
        for i in range(count):
            yield arrays[i % len(arrays)]

    def train_batches(self, epoch):
        return self._cycle(self.batches_per_epoch)

    def eval_batches(self):
        return self._cycle(self.eval_count)


def limit_batches(count, num_batches):
    """``count`` batches, or at most --num-batches of them."""
    return min(count, num_batches) if num_batches and num_batches > 0 else count


def check_files(paths, what):
    """UsageError naming the first missing path (``paths``: [(flag, path)])."""
    for flag, path in paths:
        if not path or not os.path.isfile(os.path.expanduser(path)):
            raise UsageError('%s: no such file: %s (%s)' % (flag, path, what))
