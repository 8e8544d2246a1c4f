"""The codec interface: encode one tensor, decode payloads, wrapping the C++ operators.

One codec instance per tensor (or chunk of a tensor), so it knows the shape and the
parameters its encoder needs. Two families, chosen by ``additive``:

* server-decode codecs (``additive = False``): ``encode`` gives a float32 payload with
  a self-describing header (python/kvx_ref/wire.py), so a parameter server can decode
  payloads it knows nothing else about (aggregate.py; the C++ ``decode_slots``
  dispatches on the header's codec id);
* additive codecs (``additive = True``): ``encode_sum`` gives an array whose sum over
  workers, formed by the stock server, ``decode_sum`` turns into the float32 sum.
  They may first need an agreement among workers (``agreement_words > 0``; see
  agreement.py).

Every integer in a payload is an exact float, so payloads survive the server's merge.
"""
import numpy as np

from ..errors import NonFiniteGradientError, PayloadError, status_message

HEADER_WORDS = 8


class Codec:
    """Base class; see the module docstring for the two families."""

    name = None
    uses_residual = True
    additive = False
    agreement_words = 0
    agreement_mode = 'round'   # or 'previous' (see agreement.py)
    chunk_by_rows = False    # True: chunks are ranges of the first axis (filters)

    def __init__(self, shape):
        self.shape = tuple(int(d) for d in shape)
        self.size = int(np.prod(self.shape)) if self.shape else 1

    # -- chunking: large tensors travel as chunks that decode on their own ---------
    def chunk_layout(self):
        """(rows, elements per row) along which the tensor may be cut."""
        if self.chunk_by_rows:
            return self.shape[0], self.size // self.shape[0]
        return self.size, 1

    def chunk(self, start, stop):
        """Codec for rows [start, stop) of ``chunk_layout``."""
        raise NotImplementedError

    # -- server-decode family -------------------------------------------------------
    def payload_words(self):
        """Length (float32 words) of one worker's payload: fixed per tensor."""
        raise NotImplementedError

    def encode(self, grad, residual):
        """Payload of ``grad + residual``; updates ``residual`` in place.

        Raises NonFiniteGradientError (residual untouched) on NaN/Inf."""
        raise NotImplementedError

    def decode(self, payload):
        """Dense float32 tensor of one payload (what a server adds for one worker)."""
        from ..aggregate import decode_sum
        return decode_sum([payload], self.shape)

    # -- additive family ------------------------------------------------------------
    sum_dtype = np.float32

    def sum_words(self, num_workers):
        raise NotImplementedError

    def sum_shape(self, num_workers):
        """Shape of the sum-mode key (MXNet checks pushes against it)."""
        return (self.sum_words(num_workers),)

    def agreement(self, grad, residual):
        """Small float32 array each worker contributes; the sum is what all agree on."""
        raise NotImplementedError

    def settle(self, agreed, num_workers):
        """What every worker derives from the agreed sum (``None`` if the codec needs
        no agreement): the parameters ``encode_sum`` and ``decode_sum`` take. Called
        once a step (agreement.Agreement.settled)."""
        return None

    def encode_sum(self, grad, residual, num_workers, settled):
        raise NotImplementedError

    def decode_sum(self, summed, num_workers, settled):
        raise NotImplementedError

    def describe(self):
        return self.name

    def __repr__(self):
        return '%s(%s, shape=%s)' % (type(self).__name__, self.describe(), self.shape)


def check_encoded(status, what='gradient'):
    """Raise if an encoder reported a non-finite input (status: 1-element NDArray)."""
    code = int(status.asscalar())
    if code:
        raise NonFiniteGradientError(
            '%s: %s; nothing was sent and the residual is unchanged'
            % (what, status_message(code)))


def check_decoded(status, what='payload'):
    code = int(status.asscalar())
    if code:
        raise PayloadError('%s rejected: %s' % (what, status_message(code)))
