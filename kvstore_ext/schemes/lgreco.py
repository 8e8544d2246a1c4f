"""L-GreCo over PowerSGD: each layer's rank chosen so that the total size is minimal
while the total compression error stays within that of the uniform default rank.

Markov, Ramezanikebrya, Alistarh, "L-GreCo: Layerwise-adaptive gradient compression
for efficient data-parallel deep learning" (MLSys 2024, arXiv 2210.17357). L-GreCo is
a policy, not a codec: the codec is PowerSGD's (codecs/powersgd.py), with a rank per
tensor. The policy is layerwise.py's (shared with Hylo's family, lgreco_hylo.py); this
module says what a rank costs and loses. Per ``adjust_freq`` steps:

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
import numpy as np

from . import layerwise
from .layerwise import LayerwiseChoice
from .base import SIZE_THRESHOLD
from .powersgd import PowerSGD
from .. import chunking
from ..codecs.powersgd import PowerSGDCodec
from ..params import Param


def candidate_ranks(rank):
    """Sorted candidate ranks, from half to twice ``rank`` (at least 1)."""
    return layerwise.around(rank, integer=True)


def rank_errors(matrix, codecs):
    """Frobenius norm of what the best rank-c approximation loses, for each codec of
    ``codecs`` (one per candidate rank, same tensor), chunk by chunk as each cuts it
    (the cut may differ by rank: PowerSGD cuts a matrix only where its rank-c factors
    exceed chunk_size words)."""
    squared = np.zeros(len(codecs))
    tails = {}
    for i, (codec, chunks) in enumerate(codecs):
        for chunk in chunks:
            rows = (chunk.start, chunk.stop)
            if rows not in tails:
                singular = np.linalg.svd(matrix[chunk.start:chunk.stop], compute_uv=False)
                tails[rows] = np.concatenate([np.cumsum((singular ** 2)[::-1])[::-1],
                                              [0.0]])
            tail = tails[rows]
            squared[i] += tail[min(codec.rank, tail.size - 1)]
    return np.sqrt(squared)


class LGreCo(LayerwiseChoice, PowerSGD):
    name = 'lgreco'
    family = 'ranks'
    PARAMS = dict(PowerSGD.PARAMS, **layerwise.PARAMS, **{
        'rank': Param('int', 4, 'default rank: the error budget is its total error, and '
                      'the candidates go from half to twice it', low=1, rank='tune'),
        # the size rule every scheme shared, as its measurements were made with; plain
        # PowerSGD decides by bytes alone (docs/decisions/powersgd-bytes-rule.md)
        'size_threshold': SIZE_THRESHOLD,
    })

    def check(self, params):
        super().check(params)
        self.ranks = candidate_ranks(params['rank'])

    # -- the family: PowerSGD's rank --------------------------------------------------
    def layer_default(self, shape, dtype):
        """The default rank for tensors PowerSGD compresses after its warm-up."""
        codec = self.codec_for(shape, dtype, step=self.params['warmup_steps'])
        return codec.rank if isinstance(codec, PowerSGDCodec) else None

    def candidates(self, shape):
        return self.ranks

    def codec_with(self, shape, dtype, value):
        return PowerSGDCodec(shape, int(value), self.params['seed'])

    def options(self, shape):
        """[(codec, chunks)] of the candidate ranks that compress ``shape`` at least 2x in
        every chunk."""
        out = []
        for r in self.ranks:
            codec = PowerSGDCodec(shape, r, self.params['seed'])
            chunks = chunking.split(codec, self.params['chunk_size'])
            if all(c.codec.compressible() for c in chunks):
                out.append((codec, chunks))
        return out

    def layer_options(self, shape, summed):
        opts = self.options(shape)
        errors = rank_errors(summed.reshape((shape[0], -1)), opts)
        sizes = [sum(c.codec.rank * (c.codec.rows + c.codec.cols) for c in chunks)
                 for _, chunks in opts]
        return [(codec.rank, e, s) for (codec, _), e, s in zip(opts, errors, sizes)]

    def value_text(self, shape, value):
        return 'rank %d' % value
