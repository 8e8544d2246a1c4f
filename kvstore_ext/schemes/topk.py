"""Top-k sparsification with error feedback: each tensor's largest |values| (server-decoded).

The usual baseline of the sparsification papers (Aji & Heafield 2017; Stich et al. 2018).

Per tensor, after the worker has summed its devices:

1. **Size threshold.** Tensors with fewer than ``size_threshold`` elements (32768, as
   Hylo and AdaComp, so that every scheme compresses the same tensors) and non-float32
   tensors go float32, uncompressed.
2. **Residual.** ``acc = grad + residual`` (error feedback).
3. **Selection.** The ``k = ceil(ratio * n)`` elements with the largest |acc| (ties to
   the lower index; a chunk of a large tensor picks its own k of its own elements).
4. **Payload.** Each sent element is its index (an exact float32 integer, two words
   above 2**24 elements) and its float32 value: 64 bits an element, so the push is
   about ``1 / (2 * ratio)`` times smaller than float32 (25x at the
   default 0.02; why 0.02: docs/decisions/topk-ratio.md).
5. **Residual update.** Sent elements leave the residual (zero-filled); the others
   keep ``acc``.
6. **Aggregation** (server-decode mode): the servers decode every worker's payload
   (C++, ``decode_slots``) and sum; workers pull float32.
7. **Momentum correction** (``momentum``, default 0: off): DGC's (Lin et al. 2018), as
   for Hylo's conv layers (codecs/momentum.py): the worker accumulates its velocity,
   sends the top elements of velocity + residual, zeroes the velocity where it sent,
   and the step returns ``S - m S_prev`` for the unchanged SGD optimizer. Unless set,
   it is the optimizer's (SGD's or NAG's), handed over at the store's first step from
   the Trainer or Module that calls it, or ``kv.follow`` (kvstore_ext/handover.py).
8. **Sparsity warm-up** (``warmup_steps``, default 0: off): DGC's warm-up training.
   Over the first N steps the fraction sent decays exponentially from
   ``warmup_ratio`` (DGC: 0.25) to ``ratio``, ``warmup_ratio * (ratio /
   warmup_ratio) ** (step / N)``, re-planned every step (the residual and the
   momentum state carry over). Why: at 1% a short run with many workers loses badly
   (14 points on cnn512 at 8 workers: docs/schemes/topk.md), because the
   first steps' large gradients wait in the residual for many steps; DGC's authors
   use the warm-up for exactly this. It costs bytes: the warm-up steps send on average
   ``(warmup_ratio - ratio) / ln(warmup_ratio / ratio)`` of the elements (7.4% for
   0.25 -> 0.01), 64 bits each, so keep N small against the run's length.
"""

from .base import Scheme, SIZE_THRESHOLD
from ..codecs import ElementTopKCodec, MomentumCorrected
from ..params import Param


class TopK(Scheme):
    name = 'topk'
    PARAMS = {
        'ratio': Param('float', 0.02, 'fraction of elements sent per tensor (k = '
                       'ceil(ratio * n)); the push ratio is about 1 / (2 ratio): raise it '
                       'if accuracy lags', low=0, low_open=True, high=1, rank='tune'),
        'warmup_steps': Param('int', 0, "DGC's sparsity warm-up: over the first this many "
                              'steps the fraction sent decays exponentially from '
                              'warmup_ratio to ratio (0: off); costs bytes, keep it small '
                              'against the run', low=0, rank='tune'),
        'warmup_ratio': Param('float', 0.25, 'fraction sent at the first step of the '
                              'sparsity warm-up', low=0, low_open=True, high=1, rank='leave'),
        'size_threshold': SIZE_THRESHOLD,
        'momentum': Param('float', 0.0, "the SGD optimizer's momentum, for DGC's momentum "
                          "correction; unless set, the optimizer's, handed over "
                          '(handover.py): set it only for a loop without a Trainer or '
                          'Module (0: off)', low=0, high=0.999, rank='leave'),
    }

    def ratio_at(self, step):
        """The fraction sent at ``step``: ``ratio``, or during the warm-up
        ``warmup_ratio * (ratio / warmup_ratio) ** (step / warmup_steps)`` (a
        ``warmup_ratio`` at or below ``ratio`` is no warm-up)."""
        p = self.params
        n, ratio, start = p['warmup_steps'], p['ratio'], p['warmup_ratio']
        if step >= n or start <= ratio:
            return ratio
        return start * (ratio / start) ** (step / n)

    def replans_at(self, step):
        return 0 < step <= self.params['warmup_steps']

    def codec_for(self, shape, dtype, step=0):
        if self.exempt(shape, dtype):
            return self.uncompressed(shape, dtype)
        ratio = self.ratio_at(step)
        if self.params['momentum'] > 0:
            return MomentumCorrected(ElementTopKCodec(shape, ratio), self.params['momentum'])
        return ElementTopKCodec(shape, ratio)
