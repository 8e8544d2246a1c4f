"""No compression: float32 as it is. The stock server adds it (like MXNet's dist_sync);
behind the common header it can also travel as a server-decoded payload."""
from .base import Codec, GatherCodec, check_encoded
from ..ops import op
from ..rounds import Sum
from ..wire import FP32, fp32_payload_words


class FP32Codec(Codec):
    name = 'fp32'
    uses_residual = False
    passthrough = True
    codec_id = FP32

    @staticmethod
    def payload_words_of(n, a, b):
        return fp32_payload_words(n)

    def chunk(self, start, stop):
        return FP32Codec((stop - start,))

    def payload_words(self):
        return fp32_payload_words(self.size)

    def encode(self, grad, residual=None):
        """The gradient behind a header (the servers' decode_slots also reads fp32)."""
        payload, status = op('kvx_fp32_encode')(grad.reshape((-1,)))
        check_encoded(status)
        return payload

    decode = GatherCodec.decode

    def step(self, grad, state, num_workers, rank):
        """The gradient itself; no residual is at stake, so NaN is not checked (as in
        MXNet's dist_sync)."""
        total = yield Sum('payload', grad)
        return total.reshape(self.shape)

    def wire_words(self, num_workers):
        return [('payload', 'sum', self.size, self.size)]
