"""The servers' decode-and-sum in NumPy, for codecs the plugin's C++ table does not know.

Why: a codec whose class gives a NumPy ``server_decode`` (codec_list.py) reaches the
servers with no C++ at all: a contributor can try a server-decoded codec from Python
alone (and a test can define one), then move its decoder to C++ when it matters. The
price: the server waits for the round's slots (a sync, where the C++ path lets the
engine decode while the server takes the next key's pushes) and decodes in NumPy.
Keys of the C++ codecs do not come here (``python_decoded`` says which go where).

It does what the C++ ``decode_slots`` (cpp/codec_table.h) does, status for status: a
void slot (first word NaN) or a malformed one makes the whole sum NaN; the slots must
agree on codec and element count; the sum is float32, in worker order.
"""
import numpy as np

from . import codec_list
from .errors import VOID
from .wire import HEADER_MAGIC, HEADER_VERSION, HEADER_WORDS, MANTISSA_F32

BAD_MAGIC, BAD_VERSION, BAD_CODEC, BAD_SIZE = 2, 3, 4, 5      # cpp/wire.h's statuses


def wanted(slots):
    """True if the slots (an NDArray or array, one row a worker) hold a codec that only
    a NumPy ``server_decode`` decodes. Reads the slots (a wait) only if such a codec
    is known in this process at all."""
    decoders = codec_list.python_decoded()
    if not decoders:
        return False
    rows = slots.asnumpy() if hasattr(slots, 'asnumpy') else np.asarray(slots)
    return any(float(i) in decoders for i in rows[:, 1])


def _header(slot):
    """(status, codec id, n, payload words) of a slot's header: its sizes (as the C++
    ``slot_header``; magic and version are the decoder's to check, after)."""
    if slot.size < HEADER_WORDS:
        return BAD_SIZE, 0.0, 0, 0
    low, high, body = float(slot[3]), float(slot[4]), float(slot[7])
    exact = float(1 << MANTISSA_F32)
    if not (0 <= low < exact and low == int(low) and 0 <= high < exact
            and high == int(high) and 0 <= body <= slot.size - HEADER_WORDS
            and body == int(body)):
        return BAD_SIZE, 0.0, 0, 0
    return 0, float(slot[1]), int(low) + (int(high) << MANTISSA_F32), \
        HEADER_WORDS + int(body)


def decode_slots(slots, capacity):
    """(float32 sum of ``capacity`` elements, float32 statuses, one a worker) of the
    payloads in the rows of the float32 array ``slots``."""
    total = np.zeros(capacity, np.float32)
    statuses, first = [], None
    decoders = codec_list.python_decoded()
    for slot in np.asarray(slots, np.float32):
        if slot.size and np.isnan(slot[0]):
            statuses.append(VOID)
            continue
        status, codec_id, n, words = _header(slot)
        if status == 0:
            first = first or (codec_id, n)
            if not 1 <= n <= capacity:
                status = BAD_SIZE
            elif (codec_id, n) != first or codec_id not in decoders:
                status = BAD_CODEC
            elif slot[0] != HEADER_MAGIC:       # what every decoder checks first
                status = BAD_MAGIC
            elif slot[2] != HEADER_VERSION:
                status = BAD_VERSION
            else:
                decoded, status = decoders[codec_id](slot[:words], n)
                decoded = np.asarray(decoded, np.float32).reshape((-1,))
                if status == 0 and decoded.size != n:    # the decoder's own bug
                    status = BAD_SIZE
                if status == 0:
                    total[:n] += decoded
        statuses.append(int(status))
    if any(statuses):
        total[:] = np.nan
    return total, np.array(statuses, np.float32)
