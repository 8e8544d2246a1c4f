"""THC: randomized Hadamard transform, shared scale, stochastic 4-bit levels summed by the server.

Li, Ben Basat, Vargaftik, Lao, Xu, Mitzenmacher, Yu, "THC: Accelerating Distributed Deep
Learning Using Tensor Homomorphic Compression", NSDI 2024, arXiv 2302.08545 (abstract in
``shared/papers/thc.md``). Sum mode: the server adds compressed values and the pull
stays compressed. Per tensor (and per chunk of a large one), after the worker has summed
its devices:

1. **Size threshold.** Tensors with fewer than ``size_threshold`` elements (32768, as the
   other schemes, so that every scheme compresses the same tensors) and non-float32
   tensors go float32, uncompressed.
2. **Error feedback.** ``x = grad + residual``.
3. **Shared scale.** Each worker contributes ``||x||_2`` in its own slot of a small
   summed key (a first round), so every worker sees every norm; all use ``M = max``.
4. **Rotation.** A randomized Hadamard transform (signs from ``seed`` and the step
   count, the same on every worker; power-of-two blocks of at most ``block`` elements,
   padding below 256 elements), scaled by ``sqrt(d) / M``; clamped to ``+-clamp`` (T);
   what the clamp removes stays in the residual.
5. **Quantisation.** Stochastic rounding to ``levels`` (q) uniform levels on [-T, T]
   (unbiased), each worker with its own dither stream (``seed``, step, rank); the level
   indices are packed as base ``n (q - 1) + 1`` digits into float32 words, which the
   stock server adds exactly (every partial sum below 2**24).
6. **Decoding.** Workers pull the summed words, unpack the summed levels and undo scale
   and rotation. The residual becomes ``x`` minus the decoding of the worker's own
   codes: what its contribution lost to the clamp and the rounding.

Bytes (both directions): 32 / D bits an element, D = the digits a float32 word holds
(q = 16: 8 bits for 2 to 4 workers, 10.7 for 5 to 16); plus ``num_workers`` words of the
norm round per chunk.
"""
import numpy as np

from .base import Scheme
from ..codecs.thc import ThcCodec
from ..params import Param


class Thc(Scheme):
    name = 'thc'
    PARAMS = {
        'size_threshold': Param('int', 32768, 'tensors with fewer elements go uncompressed',
                                low=0),
        'levels': Param('int', 16, 'q: quantisation levels (16 = 4 bits)', low=2, high=1024),
        'clamp': Param('float', 2.5, 'T: rotated, scaled coordinates (about N(0, 1)) are '
                       'clamped to [-T, T]', low=0, low_open=True, high=100),
        'seed': Param('int', 0, 'seed of the shared Hadamard signs and of the workers\' '
                      'dither (with the step count and the rank)', low=0, high=2 ** 31 - 1),
        'block': Param('int', 65536, 'largest Hadamard block (a power of two)', low=256,
                       high=1 << 20),
    }

    def check(self, params):
        block = params['block']
        if block & (block - 1):
            raise ValueError('block must be a power of two, got %d' % block)

    def codec_for(self, shape, dtype, step=0):
        size = int(np.prod(shape)) if len(shape) else 1
        if np.dtype(dtype) != np.float32 or size < self.params['size_threshold']:
            return self.uncompressed(shape, dtype)
        p = self.params
        return ThcCodec(shape, p['levels'], p['clamp'], p['seed'], p['block'])
