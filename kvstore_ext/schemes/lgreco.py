"""L-GreCo over PowerSGD: each layer's rank chosen so that the total size is minimal
while the total compression error stays within that of the uniform default rank.

Markov, Ramezanikebrya, Alistarh, "L-GreCo: Layerwise-adaptive gradient compression
for efficient data-parallel deep learning" (MLSys 2024, arXiv 2210.17357). L-GreCo is
a policy, not a codec: the codec is PowerSGD's (codecs/powersgd.py), with a rank per
tensor. The policy, per ``adjust_freq`` steps:

1. **Measure** (rank 0 only). Over the last ``window`` steps before a re-plan, rank 0
   adds up each layer's error-compensated gradient ``acc = grad + residual`` (what
   PowerSGD compresses; the store hands it over: ``Scheme.observe``). At the re-plan
   it measures, for every candidate rank ``c`` of every layer, ``error(l, c)``: the
   Frobenius norm of what a rank-``c`` approximation of that sum loses, chunk by chunk
   as the codec cuts it (the best rank-``c`` approximation, from the singular values:
   what PowerSGD's warm-started power iteration converges to), and ``size(l, c)``:
   the floats a step sends, ``c * (rows + cols)`` a chunk.
2. **Choose** (knapsack.py): budget = sum over layers of ``error(l, default rank)``;
   errors in 10,000 buckets of budget / 10,000; a dynamic programme picks the ranks
   of smallest total size within the budget (the default always fits).
3. **Share**: rank 0's choice (one rank per layer, layers in the order of their
   kvstore keys) reaches every worker through the transport: a Sum round in which
   only rank 0 contributes non-zero values (``Scheme.settle``), so every worker
   compresses every layer with the same rank (PowerSGD's rounds are additive).
4. **Switch**: every worker re-plans its keys at the same step (``replans_at``). The
   residual is kept (it is the tensor's); a chunk whose rank changed has a Q of
   another shape, which the store drops (memory.py), so the next step starts from the
   seeded Gaussian Q of the new rank, as at a first step, on every worker alike.

**Candidates**: ranks from half to twice the default ``rank``
(``{r/2, 3r/4, r, 3r/2, 2r}`` rounded, at least 1: ``{2, 3, 4, 6, 8}`` around 4). A candidate whose factors would not be at least 2x smaller than
the tensor in every chunk is left out for that layer; a layer PowerSGD leaves
uncompressed at the default rank (1-D, small, not 2x smaller) stays uncompressed.

**adjust_freq** default 32 steps: the store counts steps, not epochs; 32 is about one
epoch of the bundled MNIST runs at 4 workers (31 steps; bench/promise.py), L-GreCo's
"once per epoch".
The first ``adjust_freq`` steps use the default rank. ``window`` (10, as the paper)
must not exceed ``adjust_freq``.

Checkpoints keep the ranks in force (``state``), not a measurement in progress: after
a resume the next re-plan measures only the steps of its window taken since.
"""
import logging

import numpy as np

from .powersgd import PowerSGD
from .. import chunking, knapsack
from ..codecs.powersgd import PowerSGDCodec
from ..memory import file_key, parse_file_key
from ..params import Param

FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
log = logging.getLogger('kvstore_ext')


def candidate_ranks(rank):
    """Sorted candidate ranks, from half to twice ``rank`` (at least 1)."""
    return sorted({max(1, int(round(rank * f))) for f in FACTORS})


def rank_errors(matrix, codecs):
    """Frobenius norm of what the best rank-c approximation loses, for each codec of
    ``codecs`` (one per candidate rank, same tensor), chunk by chunk as each cuts it
    (all are cut alike: the cut depends on the shape only)."""
    squared = np.zeros(len(codecs))
    for chunk in codecs[0][1]:
        part = matrix[chunk.start:chunk.stop]
        singular = np.linalg.svd(part, compute_uv=False)
        tail = np.concatenate([np.cumsum((singular ** 2)[::-1])[::-1], [0.0]])
        for i, (codec, _) in enumerate(codecs):
            squared[i] += tail[min(codec.rank, singular.size)]
    return np.sqrt(squared)


class LGreCo(PowerSGD):
    name = 'lgreco'
    PARAMS = dict(PowerSGD.PARAMS, **{
        'rank': Param('int', 4, 'default rank: the error budget is its total error, and '
                      'the candidates go from half to twice it', low=1),
        'adjust_freq': Param('int', 32, 're-choose the ranks every this many steps', low=1),
        'window': Param('int', 10, 'steps of compensated gradients measured before each '
                        're-choice', low=1),
        'buckets': Param('int', knapsack.BUCKETS, 'the error budget is cut into this many '
                         'buckets (knapsack)', low=1),
    })

    def check(self, params):
        if params['window'] > params['adjust_freq']:
            raise ValueError('window (%d) must not exceed adjust_freq (%d)'
                             % (params['window'], params['adjust_freq']))
        self.candidates = candidate_ranks(params['rank'])
        self._layers = {}       # key -> shape: keys PowerSGD compresses at the default
        self._choice = {}       # key -> rank chosen at the last settle
        self._sums = {}         # key -> float64 matrix: rank 0's measurement
        self.history = []       # (step, {key: rank}) of every settle (inspection)

    # -- which steps ------------------------------------------------------------------
    def replans_at(self, step):
        p = self.params
        return super().replans_at(step) or (step > 0 and step % p['adjust_freq'] == 0)

    def observes(self, key, step, rank):
        """Rank 0, the ``window`` steps before each multiple of ``adjust_freq``."""
        p = self.params
        return (rank == 0 and key in self._layers and step >= p['warmup_steps']
                and p['adjust_freq'] - step % p['adjust_freq'] <= p['window'])

    # -- the codec of a key -----------------------------------------------------------
    def codec_for_key(self, key, shape, dtype, step=0):
        default = self.codec_for(shape, dtype, step=max(step, self.params['warmup_steps']))
        if not isinstance(default, PowerSGDCodec):
            return self.codec_for(shape, dtype, step)
        self._layers[key] = tuple(shape)
        if step < self.params['warmup_steps']:
            return self.uncompressed(shape, dtype)
        rank = self._choice.get(key, self.params['rank'])
        return PowerSGDCodec(shape, rank, self.params['seed'])

    def options(self, shape):
        """[(codec, chunks)] of the candidate ranks that compress ``shape`` at least 2x in
        every chunk."""
        out = []
        for r in self.candidates:
            codec = PowerSGDCodec(shape, r, self.params['seed'])
            chunks = chunking.split(codec, self.params['chunk_size'])
            if all(c.codec.compressible() for c in chunks):
                out.append((codec, chunks))
        return out

    # -- measurement, choice, sharing -------------------------------------------------
    def observe(self, key, acc, step):
        rows = self._layers[key][0]
        matrix = acc.asnumpy().astype(np.float64).reshape((rows, -1))
        if not np.isfinite(matrix).all():       # a void step: not a gradient to measure
            return
        if key in self._sums:
            self._sums[key] += matrix
        else:
            self._sums[key] = matrix

    def measure(self):
        """(keys, errors, sizes, default indices, options) of rank 0's measurement, or
        None if some layer was not measured."""
        keys = self.ordered_layers()
        if not keys or any(k not in self._sums for k in keys):
            return None
        errors, sizes, defaults, options = [], [], [], []
        for key in keys:
            opts = self.options(self._layers[key])
            ranks = [codec.rank for codec, _ in opts]
            errors.append(rank_errors(self._sums[key], opts))
            sizes.append(np.array([sum(c.codec.rank * (c.codec.rows + c.codec.cols)
                                       for c in chunks) for _, chunks in opts], float))
            defaults.append(ranks.index(self.params['rank']))
            options.append(ranks)
        return keys, errors, sizes, defaults, options

    def choose(self):
        """{key: rank} from rank 0's measurement (the current ranks if incomplete)."""
        measured = self.measure()
        if measured is None:
            return {k: self._choice.get(k, self.params['rank']) for k in self.ordered_layers()}
        keys, errors, sizes, defaults, options = measured
        picked = knapsack.choose(errors, sizes, defaults, self.params['buckets'])
        return {k: options[i][c] for i, (k, c) in enumerate(zip(keys, picked))}

    def ordered_layers(self):
        return sorted(self._layers, key=file_key)

    def settle(self, step, rank, share):
        if step % self.params['adjust_freq']:
            return                                   # the end of a warm-up only
        from mxnet import ndarray
        keys = self.ordered_layers()
        mine = np.zeros(max(len(keys), 1), np.float32)
        if rank == 0:
            chosen = self.choose()
            mine[:len(keys)] = [chosen[k] for k in keys]
        total = share(ndarray.array(mine, dtype=np.float32)).asnumpy()
        self._sums = {}
        choice = {}
        for key, value in zip(keys, total):
            r = int(value)
            if r != value or r not in self.candidates:
                raise RuntimeError('L-GreCo: rank 0 sent rank %r for key %r, not one of %s'
                                   % (float(value), key, self.candidates))
            choice[key] = r
        self._choice = choice
        self.history.append((step, dict(choice)))
        log.info('L-GreCo at step %d: ranks %s', step,
                 ', '.join('%s: %d' % (k, choice[k]) for k in keys))

    # -- checkpoints ------------------------------------------------------------------
    def state(self):
        """The ranks in force (every worker holds the same), saved with checkpoints. A
        measurement in progress is not saved: after a resume the next re-plan measures
        the steps of its window taken since."""
        return {'choice': {file_key(k): r for k, r in self._choice.items()}}

    def restore(self, state):
        if state:
            self._choice = {parse_file_key(k): int(r) for k, r in state['choice'].items()}
