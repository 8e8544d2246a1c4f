"""Error-feedback memory: one float32 residual per kvstore key, on this worker.

Keyed by the kvstore key, never by call order (GRACE and PyTorch both had bugs from
order-keyed state). Residuals are training state: ``save``/``load`` round-trip them
exactly, so a resumed compressed run continues as if it had not stopped. So are the
agreements carried from one step to the next (agreement.py), kept here too, by key
and chunk.
"""
import numpy as np


def file_key(key):
    """A kvstore key as a string that keeps its type (int or str) through a file."""
    return ('i:%d' % key) if isinstance(key, int) else ('s:' + key)


def parse_file_key(name):
    """Inverse of file_key."""
    kind, _, rest = name.partition(':')
    return int(rest) if kind == 'i' else rest


_AGREED = 'agreed/'


class ResidualMemory:
    def __init__(self):
        self._residuals = {}
        self._restored = {}
        self._agreements = {}          # (key, chunk index) -> agreement.Agreement
        self._restored_agreed = {}     # (key, chunk index) -> NDArray

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

    def agreement(self, key, index, codec):
        """The agreement of chunk ``index`` of ``key`` (with what ``load`` restored)."""
        from .agreement import Agreement
        restored = self._restored_agreed.pop((key, index), None)
        if restored is not None and restored.shape != (codec.agreement_words,):
            raise ValueError('restored agreement of key %r chunk %d has shape %s, expected '
                             '(%d,)' % (key, index, restored.shape, codec.agreement_words))
        agreement = Agreement(codec, restored)
        self._agreements[(key, index)] = agreement
        return agreement

    def state(self):
        """{name: NDArray} of every residual and carried agreement, including restored
        ones not yet used."""
        out = {file_key(k): v for k, v in self._restored.items()}
        out.update({file_key(k): v for k, v in self._residuals.items()})
        agreed = dict(self._restored_agreed)
        agreed.update({ki: a.saved() for ki, a in self._agreements.items()})
        out.update({'%s%s/%d' % (_AGREED, file_key(k), i): v
                    for (k, i), v in agreed.items() if v is not None})
        return out

    def restore(self, arrays):
        """Take what ``state()`` gave; each part is used when its key first appears."""
        self._residuals.clear()
        self._agreements.clear()
        self._restored, self._restored_agreed = {}, {}
        for name, arr in arrays.items():
            if name.startswith(_AGREED):
                key, _, index = name[len(_AGREED):].rpartition('/')
                self._restored_agreed[(parse_file_key(key), int(index))] = arr
            else:
                self._restored[parse_file_key(name)] = arr
