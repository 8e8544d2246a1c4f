"""Server-side maths of server-decode mode: decode every worker's payload and sum.

One C++ operator (``kvx_decode_slots``) does it for all workers of a key; the
parameter servers call it on the gathered slots, the single-process transport on its
one payload, so a one-process run exercises exactly what the servers do.
"""
import numpy as np

from .errors import PayloadError, status_message
from .ops import op


def decode_slots(slots, capacity):
    """float32 sum (``capacity`` elements) of the payloads in the rows of ``slots``;
    PayloadError names the first malformed one."""
    total, status = op('kvx_decode_slots')(slots, size=capacity)
    for worker, code in enumerate(status.asnumpy()):
        if code:
            raise PayloadError('payload of worker %d rejected: %s'
                               % (worker, status_message(code)))
    return total


def decode_sum(payloads, shape):
    """Sum of the decoded 1-D ``payloads`` as a float32 array of ``shape``."""
    from mxnet import ndarray
    width = max(p.size for p in payloads)
    slots = ndarray.zeros((len(payloads), width), dtype=np.float32)
    for row, payload in enumerate(payloads):
        slots[row, :payload.size] = payload
    return decode_slots(slots, int(np.prod(shape))).reshape(shape)
