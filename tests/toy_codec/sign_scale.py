"""'sign + scale': a worker sends the sign of every element of ``acc = grad + residual``
and one scale, the mean |acc|; the servers decode ``scale * sign`` per worker and sum.
The residual keeps ``acc - scale * sign(acc)``.

Payload: the common header (codec id SIGN_SCALE, n, a = the scale, b = 0, body n),
then n words of -1, 0 or +1. Encoded and decoded in NumPy (``server_decode``), so the
plugin's C++ table does not know it and the servers decode it in Python
(kvstore_ext/py_decode.py).
"""
import numpy as np

import kvstore_ext
from kvstore_ext.codecs import GatherCodec
from kvstore_ext.errors import NonFiniteGradientError
from kvstore_ext.params import Param
from kvstore_ext.schemes.base import Scheme
from kvstore_ext.wire import HEADER_MAGIC, HEADER_VERSION, HEADER_WORDS

SIGN_SCALE = 101            # an id no built-in codec has


def header(n, scale):
    return np.array([HEADER_MAGIC, SIGN_SCALE, HEADER_VERSION, n % (1 << 24), n >> 24,
                     scale, 0, n], dtype=np.float32)


class SignScaleCodec(GatherCodec):
    name = 'sign_scale'
    codec_id = SIGN_SCALE

    @staticmethod
    def payload_words_of(n, a, b):
        return HEADER_WORDS + n

    @staticmethod
    def server_decode(payload, n):
        """(scale * signs, status 0), or (zeros, 5: size mismatch) if malformed."""
        if payload.size != HEADER_WORDS + n or payload[1] != SIGN_SCALE:
            return np.zeros(n, np.float32), 5
        return np.float32(payload[5]) * payload[HEADER_WORDS:], 0

    def chunk(self, start, stop):
        return SignScaleCodec((stop - start,))

    def payload_words(self):
        return self.payload_words_of(self.size, 0, 0)

    def encode(self, grad, residual):
        from mxnet import ndarray
        acc = grad.asnumpy().reshape(-1) + residual.asnumpy().reshape(-1)
        if not np.isfinite(acc).all():
            raise NonFiniteGradientError('gradient: non-finite values; nothing was sent '
                                         'and the residual is unchanged')
        scale = np.float32(np.abs(acc).mean(dtype=np.float32))
        signs = np.sign(acc).astype(np.float32)
        residual[:] = ndarray.array((acc - scale * signs).reshape(residual.shape),
                                    dtype=np.float32)
        return ndarray.array(np.concatenate([header(acc.size, scale), signs]),
                             dtype=np.float32)


class SignScale(Scheme):
    """Sign + scale: every float32 tensor of at least size_threshold elements."""
    name = 'sign_scale'
    PARAMS = {'size_threshold': Param('int', 1, 'smaller tensors go float32', low=0)}

    def codec_for(self, shape, dtype, step=0):
        if np.dtype(dtype) != np.float32 or int(np.prod(shape)) < self.params['size_threshold']:
            return self.uncompressed(shape, dtype)
        return SignScaleCodec(shape)


kvstore_ext.register_scheme(SignScale)
