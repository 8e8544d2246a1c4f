"""MXNet's built-in 2-bit scheme (fixed threshold, error feedback) as a plugin scheme.

Same maths as ``set_gradient_compression({'type': '2bit', 'threshold': t})``: values
at or beyond +-t send +-t, the rest stays in the residual; every float32 tensor is
compressed, whatever its size. Unlike MXNet's, it works with Gluon's ``pushpull``.
``threshold`` is the key MXNet's ``fit.py --gc-threshold`` sets: used as MXNet uses it
(the other schemes ignore it with a warning: kvstore_ext/mxnet_keys.py).
"""
import numpy as np

from .base import Scheme
from ..codecs import TernaryCodec
from ..params import Param


class TwoBit(Scheme):
    name = '2bit'
    PARAMS = {
        'threshold': Param('float', 0.5, 'fixed quantisation threshold t, in the gradient\'s '
                           'units: values at or beyond +-t send +-t; MXNet\'s meaning of '
                           '--gc-threshold: set it near the gradients\' magnitude', low=0,
                           low_open=True, rank='tune'),
    }

    def codec_for(self, shape, dtype, step=0):
        if np.dtype(dtype) != np.float32:
            return self.uncompressed(shape, dtype)
        return TernaryCodec(shape, threshold=self.params['threshold'])
