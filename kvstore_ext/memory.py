"""Error-feedback memory: one float32 residual per kvstore key, on this worker.

Keyed by the kvstore key, never by call order (GRACE and PyTorch both had bugs from
order-keyed state). Residuals are training state: ``save``/``load`` round-trip them
exactly, so a resumed compressed run continues as if it had not stopped.
"""
import numpy as np


def file_key(key):
    """A kvstore key as a string that keeps its type (int or str) through a file."""
    return ('i:%d' % key) if isinstance(key, int) else ('s:' + key)


def parse_file_key(name):
    """Inverse of file_key."""
    kind, _, rest = name.partition(':')
    return int(rest) if kind == 'i' else rest


class ResidualMemory:
    def __init__(self):
        self._residuals = {}
        self._restored = {}

    def get(self, key, shape):
        """The residual of ``key`` (zeros at first, or what ``load`` restored)."""
        res = self._residuals.get(key)
        if res is None:
            from mxnet import ndarray
            restored = self._restored.pop(key, None)
            if restored is not None and restored.shape != tuple(shape):
                raise ValueError('restored residual of key %r has shape %s, the tensor %s'
                                 % (key, restored.shape, tuple(shape)))
            res = restored if restored is not None else ndarray.zeros(shape, dtype=np.float32)
            self._residuals[key] = res
        return res

    def keys(self):
        return list(self._residuals)

    def state(self):
        """{file key: NDArray} of every residual, including restored ones not yet used."""
        out = {file_key(k): v for k, v in self._restored.items()}
        out.update({file_key(k): v for k, v in self._residuals.items()})
        return out

    def restore(self, arrays):
        """Take residuals from ``state()``'s output; used when their keys first appear."""
        self._residuals.clear()
        self._restored = {parse_file_key(name): arr for name, arr in arrays.items()}
