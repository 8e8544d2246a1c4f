"""Hylo's conv codec: send the k output filters of ``grad + residual`` with the largest
L2 norms (indices + float32 values); the other filters stay in the residual."""
import math

from .base import GatherCodec, check_encoded
from ..ops import op
from ..wire import HEADER_WORDS, topk_payload_words


class FilterTopKCodec(GatherCodec):
    name = 'topk'
    deferred_checks = True
    chunk_by_rows = True
    reports_sent = True
    codec_id = 2

    @staticmethod
    def payload_words_of(n, k, filter_size):
        return topk_payload_words(int(k), int(filter_size))

    @staticmethod
    def server_reencode(total, residual, k, filter_size, _):
        """The servers' reply: the top k filters of the sum plus their residual."""
        payload, status = op('kvx_topk_encode')(total.reshape((-1, int(filter_size))),
                                                residual.reshape((-1, int(filter_size))),
                                                k=int(k))
        check_encoded(status, 'aggregate', defer=False)
        return payload

    def __init__(self, shape, k, compressed_reply=False):
        super().__init__(shape)
        self.compressed_reply = bool(compressed_reply)
        filters = self.shape[0]
        if not 1 <= int(k) <= filters:
            raise ValueError('k must be between 1 and the %d filters, got %r' % (filters, k))
        self.k = int(k)
        self.filter_size = self.size // filters

    def chunk(self, start, stop):
        """A chunk of filters sends the same share of its filters (at least one)."""
        filters = stop - start
        k = min(max(math.ceil(self.k * filters / self.shape[0]), 1), filters)
        return type(self)((filters,) + self.shape[1:], k, self.compressed_reply)

    def payload_words(self):
        return topk_payload_words(self.k, self.filter_size)

    def encode(self, grad, residual):
        payload, status = op('kvx_topk_encode')(grad, residual, k=self.k)
        check_encoded(status)
        return payload

    def sent_rows(self, payload):
        """The k filter indices at the payload's head."""
        return payload[HEADER_WORDS:HEADER_WORDS + self.k]

    def reply_request(self):
        """The servers send the top k filters of sum + their residual."""
        return (self.codec_id, self.size, self.k, self.filter_size, 0.0)

    def kernel_cases(self):
        if self.compressed_reply:
            return (('topk_encode F=4608 5%', 'topk_decode F=4608 5%'),
                    ('topk_decode_add F=4608 5%',), ('topk_encode F=4608 5%',))
        return ('topk_encode F=4608 5%', 'fp32_decode'), ('topk_decode_add F=4608 5%',), ()

    def describe(self):
        return 'top %d of %d filters%s' % (self.k, self.shape[0], ', compressed reply'
                                           if self.compressed_reply else '')
