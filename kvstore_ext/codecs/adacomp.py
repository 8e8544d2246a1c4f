"""AdaComp's codec (Chen et al. 2018, arXiv 1712.02679): localized selection of residues.

With ``G = grad + residual`` and ``H = G + grad``, every element whose |H| reaches the
largest |G| of its bin (``bin`` elements of the flattened tensor) is sent as its index
and the sign of H; all sent elements stand for one scale per tensor, the mean of the
bins' max|G|. The residual keeps ``G - sign * scale`` where sent, ``G`` elsewhere.

The payload varies with the number selected, the PS slot does not: it holds
``capacity`` entries. When more qualify, the ``capacity`` largest |H| go and the others
stay in the residual (they qualify again next step). docs/schemes/adacomp.md has the details.

With DGC's momentum correction (``MomentumCorrected(AdaCompCodec(...))``,
codecs/momentum.py): the worker's velocity ``u = m u + grad`` takes the gradient's
place (``G = u + residual``, ``H = G + u``), ``u`` is zeroed on the elements sent
(``step_sent`` reports them), and the step returns ``S - m S_prev`` for the unchanged
SGD optimizer (python/kvx_ref/momentum.py ``momentum_adacomp_step`` is the spec).
"""
import math

from .base import GatherCodec, check_encoded
from ..ops import op
from ..rounds import Gather
from ..wire import adacomp_payload_words


class AdaCompCodec(GatherCodec):
    name = 'adacomp'
    deferred_checks = True
    reports_sent = True
    codec_id = 4
    speed_params = ('bin',)   # 50 for conv tensors, 500 for others by default

    @staticmethod
    def payload_words_of(n, a, count):
        return adacomp_payload_words(n, int(count))

    def __init__(self, shape, bin, max_per_bin):
        super().__init__(shape)
        if int(bin) < 1:
            raise ValueError('bin must be >= 1, got %r' % (bin,))
        if not max_per_bin > 0:
            raise ValueError('max_per_bin must be > 0, got %r' % (max_per_bin,))
        self.bin = int(bin)
        self.max_per_bin = float(max_per_bin)
        bins = -(-self.size // self.bin)
        self.capacity = min(self.size, max(1, math.ceil(self.max_per_bin * bins)))

    def chunk(self, start, stop):
        """A chunk has bins of its own (they restart at its first element)."""
        return type(self)((stop - start,), self.bin, self.max_per_bin)

    def payload_words(self):
        return adacomp_payload_words(self.size, self.capacity)

    def encode(self, grad, residual):
        payload, status = op('kvx_adacomp_encode')(grad, residual, bin=self.bin,
                                                   capacity=self.capacity)
        check_encoded(status)
        return payload

    def step(self, grad, state, num_workers, rank):
        payload = self.encode(grad, state.residual)
        # elements sent (header word 6), a view read only by whoever inspects it:
        # bench/experiments/adacomp_layers.py's per-layer rates
        state.last['sent'] = payload[6:7]
        total = yield Gather('payload', payload, self.size)
        return total.reshape(self.shape)

    def step_sent(self, grad, state, num_workers, rank):
        payload = self.encode(grad, state.residual)
        state.last['sent'] = payload[6:7]
        total = yield Gather('payload', payload, self.size)
        return total, self.sent_rows(payload)

    def sent_rows(self, payload):
        """One index a slot entry (int64, one engine op, no wait): the element of each
        of the header's ``count`` entries (code // 2), and ``size`` (nothing) for the
        slot's unused entries after them."""
        return op('kvx_adacomp_sent')(payload, n=self.size, capacity=self.capacity)

    def describe(self):
        return 'adacomp, bins of %d, at most %d of %d sent' % (self.bin, self.capacity,
                                                               self.size)
