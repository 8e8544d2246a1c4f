"""Element top-k with error feedback (as in Aji & Heafield 2017, Stich et al. 2018): the k
elements of ``acc = grad + residual`` with the largest |acc| travel as (index, value)
entries, ties to the lower index; the residual of a sent element becomes 0 and the
others keep ``acc``. ``k = ceil(ratio * n)`` per tensor (per chunk), at least 1, so the
payload has one size for the whole run. docs/schemes/topk.md has the payload."""
import math

from .base import GatherCodec, check_encoded
from ..ops import op
from ..wire import HEADER_WORDS, element_topk_index_words, element_topk_payload_words


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
        """The k element indices of the payload's entries (int64)."""
        from mxnet import ndarray
        width = element_topk_index_words(self.size) + 1
        entries = payload[HEADER_WORDS:].reshape((self.k, width))
        sent = ndarray.cast(entries[:, 0], 'int64')
        if width == 3:                # index = low word + high word * 2**24
            sent = sent + ndarray.cast(entries[:, 1], 'int64') * (1 << 24)
        return sent

    def describe(self):
        return 'top %d of %d elements' % (self.k, self.size)
