"""Hylo's FC codec: every value becomes 0, +t or -t, with t = scale * mean|grad + residual|
(adaptive) or a fixed threshold (MXNet's 2-bit); the quantisation error stays in the
residual. Codes travel as base-3 digits, 15 per float32 word."""
from .base import Codec, HEADER_WORDS, check_encoded
from ..ops import op

DIGITS_PER_WORD = 15


class TernaryCodec(Codec):
    name = 'ternary'

    def __init__(self, shape, scale=1.0, threshold=0.0):
        super().__init__(shape)
        if not scale > 0:
            raise ValueError('scale must be > 0, got %r' % scale)
        if not threshold >= 0:
            raise ValueError('threshold must be >= 0, got %r' % threshold)
        self.scale = float(scale)
        self.threshold = float(threshold)

    def chunk(self, start, stop):
        """Each chunk adapts its own threshold to its own magnitude."""
        return type(self)((stop - start,), self.scale, self.threshold)

    def payload_words(self):
        return HEADER_WORDS + -(-self.size // DIGITS_PER_WORD)

    def encode(self, grad, residual):
        payload, status = op('kvx_ternary_encode')(grad, residual, scale=self.scale,
                                                   threshold=self.threshold)
        check_encoded(status)
        return payload

    def describe(self):
        if self.threshold > 0:
            return 'ternary, t = %g' % self.threshold
        return 'ternary, t = %g * mean|acc|' % self.scale

