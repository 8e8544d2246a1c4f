"""Hylo's FC codec: values of ``acc = grad + residual`` with |acc| >= t become +-v, the
others 0, with t = scale * mean|acc| (adaptive) or a fixed threshold (MXNet's 2-bit);
the quantisation error stays in the residual. v (``value``) is

* ``'t'``: MXNet's rule (dist_sync_2bit); a large accumulated value drains only t a step;
* ``'round'``: 2t, so that a code is acc rounded to the nearest multiple of 2t (clipped
  to +-1): the residual of a sent value stays within +-t (Hylo's rule). A former rule,
  the mean |acc| of the sent values, kept the tail of the large ones in the residual
  and lost 3-4 points of an MLP trained 48 steps by 8 workers
  (docs/decisions/hylo-fc-value.md); its number, 1, is refused by the kernels.

The header carries v, so decoders do not depend on the choice. Codes travel as base-3
digits, 15 per float32 word."""
from .base import GatherCodec, check_encoded
from ..ops import op
from ..wire import ternary_payload_words


VALUE_RULES = {'t': 0, 'round': 2}        # value -> value_rule of the C++ kernels
VALUE_TEXT = {'t': '', 'round': ', value 2t'}


class TernaryCodec(GatherCodec):
    name = 'ternary'
    deferred_checks = True
    codec_id = 3

    @staticmethod
    def payload_words_of(n, a, b):
        return ternary_payload_words(n)

    @staticmethod
    def server_reencode(total, residual, scale, threshold, value_rule):
        """The servers' reply: the sum plus their residual, ternary by the same rule."""
        payload, status = op('kvx_ternary_encode')(total, residual, scale=scale,
                                                   threshold=threshold,
                                                   value_rule=int(value_rule))
        check_encoded(status, 'aggregate', defer=False)
        return payload

    def __init__(self, shape, scale=1.0, threshold=0.0, value='t', compressed_reply=False):
        super().__init__(shape)
        if value not in VALUE_RULES:
            raise ValueError('value must be one of %s, got %r' % (tuple(VALUE_RULES), value))
        self.value = value
        self.compressed_reply = bool(compressed_reply)
        if not scale > 0:
            raise ValueError('scale must be > 0, got %r' % scale)
        if not threshold >= 0:
            raise ValueError('threshold must be >= 0, got %r' % threshold)
        self.scale = float(scale)
        self.threshold = float(threshold)

    def chunk(self, start, stop):
        """Each chunk adapts its own threshold to its own magnitude."""
        return type(self)((stop - start,), self.scale, self.threshold, self.value,
                          self.compressed_reply)

    def payload_words(self):
        return ternary_payload_words(self.size)

    def encode(self, grad, residual):
        payload, status = op('kvx_ternary_encode')(grad, residual, scale=self.scale,
                                                   threshold=self.threshold,
                                                   value_rule=VALUE_RULES[self.value])
        check_encoded(status)
        return payload

    def reply_request(self):
        """The servers re-encode sum + their residual with the same rule."""
        return (self.codec_id, self.size, self.scale, self.threshold,
                float(VALUE_RULES[self.value]))

    def kernel_cases(self):
        encode = ('ternary_encode fixed t' if self.threshold > 0 else
                  'ternary_encode adaptive')
        if self.compressed_reply:
            return ((encode, 'ternary_decode'), ('ternary_decode_add',),
                    ('ternary_encode adaptive',))
        return (encode, 'fp32_decode'), ('ternary_decode_add',), ()

    def describe(self):
        more = VALUE_TEXT[self.value] + \
            (', compressed reply' if self.compressed_reply else '')
        if self.threshold > 0:
            return 'ternary, t = %g%s' % (self.threshold, more)
        return 'ternary, t = %g * mean|acc|%s' % (self.scale, more)

