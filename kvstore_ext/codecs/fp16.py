"""Half precision in sum mode: each worker sends ``acc = grad + residual`` rounded to
float16 in a float16 key, which MXNet's stock server adds and workers pull
as float16: the bytes of both directions halve. The rounding error, and what clipping
holds back, stays in the residual (error feedback).

Overflow: float16 ends at 65504. Each worker clips acc to ``limit(num_workers)``, the
largest float16 L with ``num_workers * L <= 65504``, before rounding, so that neither a
worker's value nor any partial sum at the server can overflow; the excess stays in the
residual and goes with the next steps. The server adds the halves in float32 and rounds
the sum once to float16 (measured, docs/schemes/fp16.md): an error of at most half a float16
unit of the sum that no worker's residual sees.

Without error feedback (``error_feedback=False``) a worker sends its gradient clipped
and rounded, and keeps no residual: what float16 rounds away (a relative 2**-11 of each
value) is lost, and so is what the clip holds back. Why offer it: the residual costs a
worker a read and a write of the residual a step (``kvx_fp16_encode`` against
``kvx_fp16_round``), the bulk of this codec's time on a fast link.
"""
import numpy as np

from .base import Codec, GatherCodec
from ..checks import check_encoded
from ..ops import op
from ..rounds import Sum
from ..wire import HEADER_WORDS

FLOAT16_MAX = 65504.0


def limit(num_workers):
    """Largest float16 L with ``num_workers * L <= 65504`` (no partial sum overflows)."""
    bound = np.float16(FLOAT16_MAX / num_workers)
    while float(bound) * num_workers > FLOAT16_MAX:
        bound = np.nextafter(bound, np.float16(0))
    return float(bound)


class Float16Codec(Codec):
    name = 'fp16'
    deferred_checks = True   # nothing waits on the host: see step
    sums_into = True         # the widened sum goes straight into the output's part

    def __init__(self, shape, error_feedback=True):
        super().__init__(shape)
        self.error_feedback = bool(error_feedback)
        self.uses_residual = self.error_feedback      # the store keeps one only then

    def chunk(self, start, stop):
        return Float16Codec((stop - start,), self.error_feedback)

    def step(self, grad, state, num_workers, rank):
        # One op on the engine, nothing read on the host (so no key waits here for its
        # backward pass before it is pushed): acc clipped and rounded, the residual
        # updated; a non-finite acc makes every half NaN, so every worker's sum is NaN,
        # and leaves the residual as it was (cpp/codecs/fp16.h). The status is the
        # store's to read at the key's next step (deferred_checks).
        bound = limit(num_workers)
        if self.error_feedback:
            half, status = op('kvx_fp16_encode')(grad, state.residual, limit=bound)
        else:
            half, status = op('kvx_fp16_round')(grad, limit=bound)
        check_encoded(status, 'gradient + residual' if self.error_feedback else 'gradient')
        total = yield Sum('payload', half)
        if state.out is None:
            return op('kvx_fp16_widen')(total).reshape(self.shape)
        # widened into the output's part (a copy of every compressed tensor a step
        # less: the store returns state.out as the sum, codecs/base.py ``sums_into``)
        op('kvx_fp16_widen')(total, out=state.out.reshape(total.shape))
        return state.out

    def wire_words(self, num_workers):
        # float32 words: two halves a word
        return [('payload', 'sum', self.size / 2, self.size / 2)]

    def describe(self):
        return 'float16 (sum mode%s)' % ('' if self.error_feedback else
                                         ', no error feedback')


class Float16PairsCodec(GatherCodec):
    """Float16 decoded by the servers (``aggregation='server'``): each worker's halves,
    clipped and rounded as in sum mode, travel two to a float32 word in a Gather payload
    (cpp/codecs/fp16.h, kvx_ref ``fp16_pairs_encode``); the servers widen every
    worker's halves and add them in float32 with the plugin's kernels, and reply the sum
    rounded once to float16, as pairs again: the sum in the plugin's kernels instead of
    MXNet's server. Measured, it costs more than it saves: the Gather path's CPU exceeds
    the stock server's float16 sum, which takes little (docs/schemes/fp16.md, "Step
    time"); sum mode is the default. Bytes: 2 an element each way, plus a header."""

    name = 'fp16_pairs'
    codec_id = 7
    deferred_checks = True
    compressed_reply = True
    REPLY_LIMIT = 65504.0    # the sum of the workers' clipped halves stays below it

    @staticmethod
    def payload_words_of(n, a, b):
        return HEADER_WORDS + -(-n // 2)

    @staticmethod
    def server_reencode(total, residual, limit, error_feedback, _):
        """The servers' reply: the float32 sum rounded to float16 once; no residual."""
        payload, status = op('kvx_codec_encode')(total, residual, codec=7,
                                                 a=limit, b=0.0)
        check_encoded(status, 'aggregate', defer=False)
        return payload

    def __init__(self, shape, error_feedback=True):
        super().__init__(shape)
        self.error_feedback = bool(error_feedback)
        self.uses_residual = self.error_feedback

    def chunk(self, start, stop):
        return Float16PairsCodec((stop - start,), self.error_feedback)

    def payload_words(self):
        return self.payload_words_of(self.size, 0, 0)

    def step(self, grad, state, num_workers, rank):
        total = yield self.gather(self.encode(grad, state.residual, num_workers))
        return total.reshape(self.shape)

    # GatherCodec's step_sent encodes without the worker count: the plain one, over step
    step_sent = Codec.step_sent

    def encode(self, grad, residual, num_workers=1):
        """The payload, clipped at ``limit(num_workers)`` as in sum mode, so that the
        servers' float32 sum rounds to a finite float16."""
        # without error feedback the kernel reads only grad (b=0): grad stands in for
        # the residual the op's signature asks for
        payload, status = op('kvx_codec_encode')(
            grad, residual if self.error_feedback else grad, codec=self.codec_id,
            a=limit(num_workers), b=float(self.error_feedback))
        check_encoded(status, 'gradient + residual' if self.error_feedback else 'gradient')
        return payload

    def reply_request(self):
        return (self.codec_id, self.size, self.REPLY_LIMIT, 0.0, 0.0)

    def describe(self):
        return 'float16 pairs (server aggregation%s)' % (
            '' if self.error_feedback else ', no error feedback')

