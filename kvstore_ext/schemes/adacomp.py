"""AdaComp: per-bin residue selection, index + sign, one scale a tensor (server-decoded).

Chen et al., "AdaComp: Adaptive Residual Gradient Compression", AAAI 2018,
arXiv 1712.02679, Algorithm 1 (shared/papers/adacomp.md; docs/schemes/adacomp.md).

Per tensor, after the worker has summed its devices:

1. **Size threshold.** Tensors with fewer than ``size_threshold`` elements (32768, as
   Hylo, so that the two schemes compress the same tensors) and non-float32 tensors go
   float32, uncompressed.
2. **Residual.** ``G = residual + grad`` (the residue that error feedback carries) and
   ``H = G + grad`` (the residue plus the latest gradient once more: elements still
   growing are favoured).
3. **Bins.** The flattened G is cut into bins of ``bin_conv`` (50) elements for conv
   tensors (3-D and more) and ``bin_fc`` (500) for the others; a chunk of a large tensor
   (``chunk_size``) starts bins of its own. ``gmax`` = max|G| over each bin.
4. **Selection.** Every element with ``|H_j| >= gmax`` of its bin is sent (a bin whose
   G is all zero sends nothing): the number sent adapts to how peaked each bin is, with
   no global sort.
5. **Quantisation.** A sent element is its index and the sign of H_j; every sent
   element stands for one scale per tensor, the mean of the bins' gmax. The residual
   becomes ``G_j - sign_j * scale`` for the sent elements and ``G`` elsewhere.
6. **Capacity.** A parameter-server slot has a fixed size, so at most
   ``ceil(max_per_bin * bins)`` elements (3 per bin on average) are sent; if more
   qualify, those with the largest |H| go and the rest stay in G (they qualify again
   next step). The payload is 32 bits an element sent (64 above 2**23 elements).
7. **Aggregation** (server-decode mode, as Hylo's paper design): the servers decode every
   worker's payload (C++, ``decode_slots``) and sum; workers pull float32.
8. **Momentum correction** (``momentum``, default 0: off): DGC's (Lin et al. 2018), as
   for dist_sync_topk (codecs/momentum.py): the worker accumulates its velocity
   ``u = m u + grad`` and encodes it in the gradient's place (``G = u + residual``,
   ``H = G + u``), zeroes ``u`` on the elements sent, and the step returns
   ``S - m S_prev`` for the unchanged SGD optimizer. Unless set, it is the optimizer's
   (SGD's or NAG's), handed over at the store's first step (kvstore_ext/handover.py).
"""

from .base import Scheme, SIZE_THRESHOLD
from ..codecs.adacomp import AdaCompCodec
from ..codecs.momentum import MomentumCorrected
from ..params import Param


class AdaComp(Scheme):
    name = 'adacomp'
    PARAMS = {
        'max_per_bin': Param('float', 3.0, 'slot capacity: elements sent per bin on average '
                             'at most (the largest |H| go first); the bytes pushed are the '
                             "slot's, about bin / max_per_bin fewer than float32: 10 halved "
                             "the MLP's loss at half the ratio", low=0, low_open=True,
                             rank='tune'),
        'bin_fc': Param('int', 500, 'bin length for FC and other tensors: one element a bin '
                        'qualifies at least; shorter bins send more', low=1, rank='tune'),
        'bin_conv': Param('int', 50, 'bin length for conv tensors (3-D and more)', low=1,
                          rank='tune'),
        'size_threshold': SIZE_THRESHOLD,
        'momentum': Param('float', 0.0, "the SGD optimizer's momentum, for DGC's momentum "
                          'correction: the velocity is encoded in the gradient\'s place; '
                          "unless set, the optimizer's, handed over (handover.py): set it "
                          'only for a loop without a Trainer or Module (0: off)',
                          low=0, high=0.999, rank='leave'),
    }

    def codec_for(self, shape, dtype, step=0):
        if self.exempt(shape, dtype):
            return self.uncompressed(shape, dtype)
        bin_len = self.params['bin_conv'] if len(shape) >= 3 else self.params['bin_fc']
        codec = AdaCompCodec(shape, bin_len, self.params['max_per_bin'])
        if self.params['momentum'] > 0:
            return MomentumCorrected(codec, self.params['momentum'])
        return codec
