"""Element top-k with error feedback (as in Aji & Heafield 2017, Stich et al. 2018): the k
elements of ``acc = grad + residual`` with the largest |acc| travel as (index, value)
entries, ties to the lower index; the residual of a sent element becomes 0 and the
others keep ``acc``. ``k = ceil(ratio * n)`` per tensor (per chunk), at least 1, so the
payload has one size for the whole run. docs/schemes/topk.md has the payload."""
import math

from .base import GatherCodec, check_encoded
from ..ops import op
from ..wire import element_topk_payload_words


class ElementTopKCodec(GatherCodec):
    name = 'element_topk'
    deferred_checks = True
    reports_sent = True
    codec_id = 5

    @staticmethod
    def payload_words_of(n, k, b):
        return element_topk_payload_words(n, int(k))

    def __init__(self, shape, ratio):
        super().__init__(shape)
        if not 0 < ratio <= 1:
            raise ValueError('ratio must be in (0, 1], got %r' % (ratio,))
        self.ratio = float(ratio)
        self.k = min(self.size, max(1, math.ceil(self.ratio * self.size)))

    def chunk(self, start, stop):
        """A chunk sends the same share of its own elements."""
        return type(self)((stop - start,), self.ratio)

    def payload_words(self):
        return element_topk_payload_words(self.size, self.k)

    def encode(self, grad, residual):
        payload, status = op('kvx_element_topk_encode')(grad, residual, k=self.k)
        check_encoded(status)
        return payload

    def sent_rows(self, payload):
        """The k element indices of the payload's entries (int64, one engine op)."""
        return op('kvx_element_topk_sent')(payload, n=self.size, k=self.k)

    def describe(self):
        return 'top %d of %d elements' % (self.k, self.size)
