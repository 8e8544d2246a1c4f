"""Server-side maths of server-decode mode: decode every worker's payload and sum.

One C++ operator (``kvx_decode_slots``) does it for all workers of a key; the
parameter servers call it on the gathered slots, the single-process transport on its
one payload, so a one-process run exercises exactly what the servers do. A codec
decoded in NumPy (codec_list.py) goes through py_decode.py instead, here as there.
"""
import numpy as np

from . import py_decode
from .errors import VOID, PayloadError, status_message
from .ops import op


def decode_slots(slots, capacity):
    """(float32 sum of ``capacity`` elements, the workers whose slot was void) of the
    payloads in the rows of ``slots``. A void slot (``rounds.void``: its worker's
    gradient was non-finite) makes the sum all NaN, which every worker then pulls;
    PayloadError names the first malformed slot."""
    if py_decode.wanted(slots):
        from mxnet import ndarray
        total, status = py_decode.decode_slots(slots.asnumpy(), capacity)
        total, status = ndarray.array(total, dtype=np.float32), ndarray.array(status)
    else:
        total, status = op('kvx_decode_slots')(slots, size=capacity)
    voided = []
    for worker, code in enumerate(status.asnumpy()):
        if code == VOID:
            voided.append(worker)
        elif code:
            raise PayloadError('payload of worker %d rejected: %s'
                               % (worker, status_message(code)))
    return total, voided


def decode_sum(payloads, shape):
    """Sum of the decoded 1-D ``payloads`` as a float32 array of ``shape`` (all NaN if
    one of them was void)."""
    from mxnet import ndarray
    width = max(p.size for p in payloads)
    slots = ndarray.zeros((len(payloads), width), dtype=np.float32)
    for row, payload in enumerate(payloads):
        slots[row, :payload.size] = payload
    return decode_slots(slots, int(np.prod(shape)))[0].reshape(shape)
