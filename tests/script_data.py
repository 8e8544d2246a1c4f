"""Tiny datasets in the real on-disk formats the training scripts read.

* CIFAR-10, binary version (what ``mxnet.gluon.data.vision.CIFAR10`` reads and what
  ``cifar-10-binary.tar.gz`` unpacks to): ``data_batch_1.bin`` ... ``data_batch_5.bin``
  and ``test_batch.bin``, each a sequence of 3073-byte records: 1 label byte, then
  1024 red, 1024 green and 1024 blue bytes (32 x 32, row-major).
* CIFAR-100, binary version: ``train.bin`` and ``test.bin``, 3074-byte records: coarse
  label byte, fine label byte, then the 3072 pixel bytes.
* CIFAR-10 / CIFAR-100, python version (``cifar-10-batches-py``, ``cifar-100-python``):
  pickled dicts with ``b'data'`` (N x 3072 uint8) and ``b'labels'`` /
  ``b'fine_labels'``.
* ImageNet, RecordIO: an indexed ``.rec``/``.idx`` pair of JPEG images written with
  ``mx.recordio.MXIndexedRecordIO`` and ``mx.recordio.pack_img`` (what
  ``tools/im2rec.py`` produces and ``mx.io.ImageRecordIter`` reads).

Images are class-dependent colours plus noise, so a few steps of training can move
the accuracy, but nothing here is meant to be learned well.
"""
import os
import pickle

import numpy as np

CIFAR10_TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
CIFAR10_TEST_FILE = 'test_batch.bin'


def _images(rng, labels, size=32, classes=10):
    """uint8 (N, 3, size, size): a colour per class plus noise."""
    n = len(labels)
    base = (np.arange(classes)[:, None] * np.array([37, 91, 151]) % 256).astype(np.float32)
    img = base[labels][:, :, None, None] + rng.normal(0, 40, (n, 3, size, size))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_cifar10_binary(root, per_batch=16, test=32, seed=0):
    """The six CIFAR-10 binary batch files in ``root``; returns (train count, test count)."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, n in [(f, per_batch) for f in CIFAR10_TRAIN_FILES] + [(CIFAR10_TEST_FILE, test)]:
        labels = rng.integers(0, 10, n)
        records = np.concatenate([labels[:, None].astype(np.uint8),
                                  _images(rng, labels).reshape(n, -1)], axis=1)
        with open(os.path.join(root, name), 'wb') as f:
            f.write(records.tobytes())
    return 5 * per_batch, test


def write_cifar100_binary(root, train=64, test=32, seed=0):
    """CIFAR-100 binary ``train.bin`` / ``test.bin`` in ``root``."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, n in (('train.bin', train), ('test.bin', test)):
        fine = rng.integers(0, 100, n)
        records = np.concatenate([(fine // 5)[:, None].astype(np.uint8),
                                  fine[:, None].astype(np.uint8),
                                  _images(rng, fine, classes=100).reshape(n, -1)], axis=1)
        with open(os.path.join(root, name), 'wb') as f:
            f.write(records.tobytes())
    return train, test


def write_cifar10_python(root, per_batch=16, test=32, seed=0):
    """The python-version pickles (``data_batch_1`` ... ``test_batch``) in ``root``."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = ['data_batch_%d' % i for i in range(1, 6)] + ['test_batch']
    for name in names:
        n = test if name == 'test_batch' else per_batch
        labels = rng.integers(0, 10, n)
        batch = {b'batch_label': name.encode(), b'labels': [int(v) for v in labels],
                 b'data': _images(rng, labels).reshape(n, -1),
                 b'filenames': [b'img%d.png' % i for i in range(n)]}
        with open(os.path.join(root, name), 'wb') as f:
            pickle.dump(batch, f)
    return 5 * per_batch, test


def write_imagenet_rec(prefix, count=48, classes=10, size=40, seed=0, quality=90):
    """``prefix.rec`` + ``prefix.idx``: ``count`` JPEGs of ``size`` x ``size`` with
    labels in [0, classes). Returns the two paths."""
    import mxnet as mx
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, count)
    images = _images(rng, labels, size=size, classes=classes).transpose(0, 2, 3, 1)  # HWC
    rec, idx = prefix + '.rec', prefix + '.idx'
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, 'w')
    for i, (img, label) in enumerate(zip(images, labels)):
        header = mx.recordio.IRHeader(0, float(label), i, 0)
        # pack_img encodes with OpenCV, which expects BGR; the colours do not matter here
        writer.write_idx(i, mx.recordio.pack_img(header, np.ascontiguousarray(img),
                                                 quality=quality, img_fmt='.jpg'))
    writer.close()
    return rec, idx
