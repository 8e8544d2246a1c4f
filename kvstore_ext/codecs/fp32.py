"""No compression: float32 as it is. Additive, so in a distributed run the stock
server sums it (like MXNet's dist_sync); behind the common header it can also travel
as a server-decoded payload."""
from .base import Codec, HEADER_WORDS, check_encoded
from ..ops import op


class FP32Codec(Codec):
    name = 'fp32'
    uses_residual = False
    additive = True

    def chunk(self, start, stop):
        return FP32Codec((stop - start,))

    def payload_words(self):
        return HEADER_WORDS + self.size

    def encode(self, grad, residual=None):
        payload, status = op('kvx_fp32_encode')(grad.reshape((-1,)))
        check_encoded(status)
        return payload

    def sum_words(self, num_workers):
        return self.size

    def sum_shape(self, num_workers):
        """The tensor's own shape: MXNet's pushpull of several devices needs it."""
        return self.shape

    def encode_sum(self, grad, residual, num_workers, settled=None):
        """The gradient itself; no residual is at stake, so NaN is not checked (as in
        MXNet's dist_sync)."""
        return grad

    def decode_sum(self, summed, num_workers, settled=None):
        return summed.reshape(self.shape)

