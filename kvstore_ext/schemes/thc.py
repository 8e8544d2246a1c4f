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
5. **Quantisation.** Stochastic rounding between the two entries of a table around each
   coordinate (unbiased), each worker with its own dither stream (``seed``, step, rank).
   ``table='uniform'``: ``levels`` (q) uniform levels on [-T, T]; ``table='thc'``: THC's
   non-uniform table, 16 entries on a grid of 30 integers, denser near 0 (its authors'
   code). What a worker sends is the entry's grid integer (0 to g, g = q - 1 uniform,
   30 for THC's table), since those add; they are packed as base ``n g + 1`` digits
   into float32 words, which the stock server adds exactly (every partial sum below
   2**24).
6. **Decoding.** Workers pull the summed words, unpack the summed levels and undo scale
   and rotation. The residual becomes ``x`` minus the decoding of the worker's own
   codes: what its contribution lost to the clamp and the rounding.

Bytes (both directions): 32 / D bits an element, D = the digits a float32 word holds
(uniform, q = 16: 8 bits for 2 to 4 workers, 10.7 for 5 to 16; THC's table: 8 bits for
2 workers, 10.7 for 3 to 8, 16 for 9 to 16); plus ``num_workers`` words of the norm
round per chunk.
"""

from .base import Scheme, SIZE_THRESHOLD
from ..codecs.thc import TABLE_IDS, ThcCodec, check_table
from ..params import Param

# T by table when ``clamp`` is not given: 2.5 for the uniform table (docs/schemes/thc.md: the
# error a coordinate is within 4% of its minimum there, with margin for blocks above
# unit variance); THC's table was designed with Phi^-1(1 - 1/64) = 2.1539 (its authors'
# p = 1/32 of the coordinates clamped).
DEFAULT_CLAMP = {'uniform': 2.5, 'thc': 2.1539}


class Thc(Scheme):
    name = 'thc'
    PARAMS = {
        'levels': Param('int', 16, 'q: quantisation levels (16 = 4 bits); more levels, '
                        'less rounding error, more bits on the wire (the packing\'s base '
                        "grows with workers x levels); 16 for table='thc'", low=2,
                        high=1024, rank='tune'),
        'clamp': Param('float', None, 'T: rotated, scaled coordinates (about N(0, 1)) are '
                       "clamped to [-T, T]; unset: 2.5 for table='uniform', 2.1539 for "
                       "table='thc' (chosen by error a coordinate, not tuned on accuracy)",
                       low=0, low_open=True, high=100, optional=True, rank='leave'),
        'table': Param('str', 'uniform', "quantisation table: 'uniform' (q levels evenly "
                       "on [-T, T]) or 'thc' (THC's non-uniform table: 16 entries on a grid "
                       'of 30, sent as grid integers: no accuracy gain measured, 33% more '
                       'bytes at 4 workers)', choices=tuple(TABLE_IDS), rank='expert'),
        'size_threshold': SIZE_THRESHOLD,
        'seed': Param('int', 0, 'seed of the shared Hadamard signs and of the workers\' '
                      'dither (with the step count and the rank)', low=0, high=2 ** 31 - 1,
                      rank='leave'),
        'block': Param('int', 65536, 'largest Hadamard block (a power of two): 256 KiB of '
                       'float32 runs in L2; larger blocks spread outliers wider', low=256,
                       high=1 << 20, rank='expert'),
    }

    def check(self, params):
        block = params['block']
        if block & (block - 1):
            raise ValueError('block must be a power of two, got %d' % block)
        check_table(params['levels'], params['table'])

    def clamp(self):
        """T: the given clamp, else the table's default."""
        given = self.params['clamp']
        return DEFAULT_CLAMP[self.params['table']] if given is None else given

    def codec_for(self, shape, dtype, step=0):
        if self.exempt(shape, dtype):
            return self.uncompressed(shape, dtype)
        p = self.params
        return ThcCodec(shape, p['levels'], self.clamp(), p['seed'], p['block'], p['table'])
