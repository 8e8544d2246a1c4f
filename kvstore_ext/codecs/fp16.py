"""Half precision in sum mode: each worker sends ``acc = grad + residual`` rounded to
float16 in a float16 key, which MXNet's stock server adds (in float16) and workers pull
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
worker two passes over the tensor a step (``grad + residual`` and ``acc - half``, with
a float16 to float32 conversion), the bulk of this codec's time on a fast link.
"""
import numpy as np

from .base import Codec
from ..errors import NonFiniteGradientError
from ..ops import op
from ..rounds import Sum

FLOAT16_MAX = 65504.0


def limit(num_workers):
    """Largest float16 L with ``num_workers * L <= 65504`` (no partial sum overflows)."""
    bound = np.float16(FLOAT16_MAX / num_workers)
    while float(bound) * num_workers > FLOAT16_MAX:
        bound = np.nextafter(bound, np.float16(0))
    return float(bound)


class Float16Codec(Codec):
    name = 'fp16'

    def __init__(self, shape, error_feedback=True):
        super().__init__(shape)
        self.error_feedback = bool(error_feedback)
        self.uses_residual = self.error_feedback      # the store keeps one only then

    def chunk(self, start, stop):
        return Float16Codec((stop - start,), self.error_feedback)

    def step(self, grad, state, num_workers, rank):
        residual = state.residual if self.error_feedback else None
        acc = grad + residual if self.error_feedback else grad
        if int(op('kvx_finite_check')(acc.reshape((-1,))).asscalar()):
            raise NonFiniteGradientError('gradient + residual holds non-finite values (NaN '
                                         'or Inf); nothing was sent and the residual is '
                                         'unchanged')
        bound = limit(num_workers)
        half = acc.clip(-bound, bound).astype(np.float16)
        if self.error_feedback:
            residual[:] = acc - half.astype(np.float32)
        total = yield Sum('payload', half)
        return total.astype(np.float32).reshape(self.shape)

    def wire_words(self, num_workers):
        # float32 words: two halves a word
        return [('payload', 'sum', self.size / 2, self.size / 2)]

    def describe(self):
        return 'float16 (sum mode%s)' % ('' if self.error_feedback else
                                         ', no error feedback')
