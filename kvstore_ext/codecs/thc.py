"""THC (Tensor Homomorphic Compression) in sum mode: quantised codes the stock server
adds, so both directions stay compressed and the servers run no decoder.

Why a shared scale and a shared rotation: integer codes add up to the code of the sum
only if every worker maps its values to levels the same way. So all workers rotate with
the same randomized Hadamard transform (signs from a seed and the step count, the same
everywhere) and scale by the same ``sqrt(d) / M``, M the largest worker norm, which a
tiny first round gives everyone. Why a rotation at all: it spreads a tensor's energy
evenly over the coordinates (about N(0, ||x||^2 / M^2) each), so a fixed clamp ``T`` and
a few levels fit every tensor, and an outlier costs no more than any other value.

One step of a chunk (numbered as in ``ThcCodec.step``; kernels: cpp/codecs/thc.h, spec:
python/kvx_ref/thc.py):

1. ``x = grad + residual``; this worker's ``||x||_2`` in its slot of a ``num_workers``
   array (``kvx_thc_norm``; NaN there if x is not finite: a void step, below);
2. ``Sum('norm')``: every worker's norm, so all take the same ``M = max``;
3. ``kvx_thc_encode``: rotate, scale by ``sqrt(d) / M``, clamp to ``+-T``, round
   stochastically between the two entries of the table around each coordinate
   (unbiased; the uniform table's ``q`` levels, or THC's 16 entries on a grid of 30),
   pack the entries' values as base ``n g + 1`` digits in float32 words (``g`` the
   table's grid, ``q - 1`` for the uniform table; exact sums: every partial sum stays
   below 2**24); the residual keeps ``x`` minus the decoding of this worker's own digits
   (what the clamp and the rounding lost);
4. ``Sum('payload')``: the stock server adds the words;
5. ``kvx_thc_decode_sum``: unpack the summed codes, undo scale and rotation.

The step count (state ``'step'``, checkpointed) seeds the signs and each worker's
dither, so a run is reproducible and a resumed run continues bit for bit.

A void step, decided on the engine: nothing in the step reads a result on the host, so
the worker pushes this key without waiting for its gradient and goes on to the next
(waiting on each key's statuses serialised the step: ``deferred_checks``). A NaN or Inf
in a worker's ``x`` puts NaN in its norm slot, so every worker's summed norms hold a
NaN; an encoder that sees one sends NaN words and keeps its residual, and the decoder
returns NaN everywhere (status ``VOID``): the caller skips the step, as with
``dist_sync``. The worker whose gradient it was finds out from its norm's status, which
the store reads at the key's next step (void_steps.resolve) and logs. The step count
advances on every worker alike.
"""
import math

import numpy as np

from .base import Codec, check_decoded, check_encoded
from ..ops import op, shape_attr
from ..rounds import Sum
from ..wire import digits_per_float32

MIN_BLOCK = 256            # cpp/codecs/thc.h kThcMinBlock
MAX_STEP = 1 << 24         # the step count travels as an exact float32
# Quantisation tables: name -> the ops' `table` id (cpp/codecs/thc.h).
TABLE_IDS = {'uniform': 0, 'thc': 1}
THC_TABLE_LEVELS, THC_TABLE_GRID = 16, 30     # THC's table: 16 entries on a grid of 30


def blocks(n, block):
    """Hadamard block sizes of n elements (cpp/codecs/thc.h): ``block`` while that many
    are left, then the largest power of two that fits, down to 256; a tail below 256
    takes the next power of two (the only padding)."""
    sizes, rest = [], int(n)
    while rest > 0:
        if rest >= block:
            size = block
        elif rest >= MIN_BLOCK:
            size = 1 << (rest.bit_length() - 1)
        else:
            size = 1 << (rest - 1).bit_length()
        sizes.append(size)
        rest -= min(size, rest)
    return sizes


def grid(levels, table='uniform'):
    """g, the largest digit a worker sends: q - 1 for the uniform table, 30 for THC's
    (its entries' values, not their indices, are what the server adds)."""
    check_table(levels, table)
    return levels - 1 if table == 'uniform' else THC_TABLE_GRID


def check_table(levels, table):
    if table not in TABLE_IDS:
        raise ValueError('table must be one of %s, got %r'
                         % (', '.join(map(repr, TABLE_IDS)), table))
    if table == 'thc' and levels != THC_TABLE_LEVELS:
        raise ValueError("table='thc' has %d entries: levels must be %d, got %r"
                         % (THC_TABLE_LEVELS, THC_TABLE_LEVELS, levels))


def sum_words(n, block, levels, num_workers, table='uniform'):
    """float32 words of one worker's payload (and of the sum) for n elements."""
    g = grid(levels, table)
    digits = digits_per_float32(num_workers * g + 1)
    if digits < 1:
        raise ValueError('THC with the %s table of %d levels cannot pack the sum of %d '
                         'workers into float32 (needs %d * %d + 1 <= 2**24)'
                         % (table, levels, num_workers, num_workers, g))
    return -(-sum(blocks(n, block)) // digits)


class ThcCodec(Codec):
    name = 'thc'
    deferred_checks = True   # nothing waits on the host: a NaN voids the step on the
    voids_in_engine = True   # engine, the store reads this worker's status later

    def __init__(self, shape, levels=16, clamp=2.5, seed=0, block=65536, table='uniform'):
        super().__init__(shape)
        if not 2 <= int(levels) <= 1 << 16:
            raise ValueError('levels must be in [2, 65536], got %r' % (levels,))
        check_table(int(levels), table)
        if not (math.isfinite(clamp) and 0 < clamp <= 1e4):
            raise ValueError('clamp must be in (0, 1e4], got %r' % (clamp,))
        if not (block >= MIN_BLOCK and block & (block - 1) == 0 and block <= 1 << 24):
            raise ValueError('block must be a power of two in [256, 2**24], got %r' % (block,))
        self.levels, self.clamp = int(levels), float(clamp)
        self.seed, self.block, self.table = int(seed), int(block), table

    def chunk(self, start, stop):
        """Each chunk has its own norm round, blocks and M."""
        return type(self)((stop - start,), self.levels, self.clamp, self.seed, self.block,
                          self.table)

    def state_shapes(self):
        return {'step': (1,)}

    def _attrs(self, step):
        return dict(levels=self.levels, clamp=self.clamp, seed=self.seed, block=self.block,
                    step=step, table=TABLE_IDS[self.table])

    def step(self, grad, state, num_workers, rank):
        # Nothing here waits for a result on the host (the step count is kept on the
        # host beside its array): the whole step is queued on MXNet's engine, so the
        # worker goes on to the next key while this one's rounds travel.
        # A NaN/Inf voids the step in the engine (module docstring, "A void step").
        residual = state.residual
        # 1. x = grad + residual; this worker's norm in its slot (NaN if x is not finite)
        slots, status = op('kvx_thc_norm')(grad, residual, rank=rank, num_workers=num_workers)
        check_encoded(status)
        # 2. every worker's norm: all use the same M = max (inside the ops)
        # (the pull buffer: the engine orders the next step's pull after this step's
        # reads of it)
        norms = yield Sum('norm', slots)
        step = self._step_count(state)
        # 3. rotate, scale, clamp, round to the table, pack; the residual keeps what this
        #    worker lost (kept, and NaN words sent, if the step is void)
        words, status = op('kvx_thc_encode')(grad, residual, norms, rank=rank,
                                             **self._attrs(step))
        check_encoded(status)
        self._count_step(state, step)
        state.last['step'] = step
        # 4. the stock server adds the words
        summed = yield Sum('payload', words)
        # 5. the sum over workers (NaN everywhere if the step is void)
        out, status = op('kvx_thc_decode_sum')(summed, norms, shape=shape_attr(self.shape),
                                               **self._attrs(step))
        check_decoded(status, 'summed THC payload')
        return out

    @staticmethod
    def _step_count(state):
        """The step count: one past the step this codec ran last, if the array is the
        one it wrote then (nothing read back), else read from the array (restored or
        adopted state)."""
        counter = state.get('step')
        if counter is None:
            return 0
        if state.last.get('counter') is counter:
            return (state.last['step'] + 1) % MAX_STEP
        return int(counter.asscalar())

    @staticmethod
    def _count_step(state, step):
        """Store step + 1 by an engine op: creating the array from the host waited for
        the engine's queue (about 3 ms a chunk while encoders ran)."""
        from mxnet import ndarray
        state['step'] = ndarray.full((1,), (step + 1) % MAX_STEP, dtype=np.float32)
        state.last['counter'] = state.get('step')

    def sum_words(self, num_workers):
        return sum_words(self.size, self.block, self.levels, num_workers, self.table)

    def wire_words(self, num_workers):
        words = self.sum_words(num_workers)
        return [('norm', 'sum', num_workers, num_workers), ('payload', 'sum', words, words)]

    def describe(self):
        levels = ('%d uniform levels' % self.levels if self.table == 'uniform' else
                  "%d levels of THC's non-uniform table (grid %d)" % (self.levels,
                                                                     THC_TABLE_GRID))
        return 'thc, %s, clamp %g, Hadamard blocks of <= %d' % (levels, self.clamp, self.block)
