"""Server-side maths of server-decode mode: decode every worker's payload and sum.

One C++ operator (``kvx_decode_slots``) does it for all workers of a key; the
parameter servers call it on the gathered slots, the single-process transport on its
one payload, so a one-process run exercises exactly what the servers do.
"""
import numpy as np

from .errors import VOID, PayloadError, status_message
from .ops import op
from .wire import FP32, OUTER, TERNARY, TOPK


def decode_slots(slots, capacity):
    """(float32 sum of ``capacity`` elements, the workers whose slot was void) of the
    payloads in the rows of ``slots``. A void slot (``rounds.void``: its worker's
    gradient was non-finite) makes the sum all NaN, which every worker then pulls;
    PayloadError names the first malformed slot."""
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


# -- compressed replies: the server re-encodes the sum (two-way compression) --------
#
# A Gather round may ask the servers to reply with the sum re-encoded by the workers'
# codec instead of float32 (``Gather.reply``), so that the pull shrinks like the push
# and does not grow with the number of workers. The server keeps the re-encoding's
# error in a residual of its own (error feedback on the server, as DoubleSqueeze
# does), so what one reply leaves out goes with the next.
#
# The request travels as a reply row of float32 words that the key carries with it:
# [REPLY_MAGIC, codec id, n % 2**24, n // 2**24, a, b, c] (the codec's parameters:
# top-k: k, filter size, 0; ternary: scale, fixed threshold, 1 if the value sent is the
# mean of the selected; outer products (rank-dAD's 'rankdad'): rank, rows of the
# weight, power iterations, negative with error feedback). Codec id 1 (float32) is
# the plain reply: the float32 sum.

REPLY_MAGIC = 7341.0
REPLY_WORDS = 7
FLOAT32_REPLY = (FP32, 0, 0.0, 0.0, 0.0)


def reply_row(codec_id, n, a, b, c):
    """The reply request as float32 words (every one exact)."""
    return [REPLY_MAGIC, float(codec_id), float(n % (1 << 24)), float(n >> 24),
            float(a), float(b), float(c)]


def parse_reply_row(words):
    """(codec id, n, a, b, c) of a reply row; PayloadError if it is not one."""
    if len(words) < REPLY_WORDS or words[0] != REPLY_MAGIC or words[1] not in _REENCODE:
        raise PayloadError('not a reply request: %s' % list(words[:REPLY_WORDS]))
    return (int(words[1]), int(words[2]) + (int(words[3]) << 24), float(words[4]),
            float(words[5]), float(words[6]))


def _topk_reply(total, residual, k, filter_size, _):
    from .codecs.base import check_encoded
    payload, status = op('kvx_topk_encode')(total.reshape((-1, int(filter_size))),
                                            residual.reshape((-1, int(filter_size))),
                                            k=int(k))
    check_encoded(status, 'aggregate', defer=False)
    return payload


def _ternary_reply(total, residual, scale, threshold, value_rule):
    from .codecs.base import check_encoded
    payload, status = op('kvx_ternary_encode')(total, residual, scale=scale,
                                               threshold=threshold,
                                               value_rule=int(value_rule))
    check_encoded(status, 'aggregate', defer=False)
    return payload


def _outer_reply(total, residual, rank, rows, iterations):
    """rank-dAD's 'rankdad': the summed gradient (rows x cols) factorised again to
    rank r by the workers' power iteration (seed 0, no early stop; lowrank.py), replied
    as its factors. ``iterations`` > 0: no residual, as the authors' (``residual``
    stays zero); < 0 (rank-dAD's error feedback, codecs/outer.py): ``-iterations``
    iterations on the sum plus ``residual``, which keeps what the factors leave out
    (python/kvx_ref/dad.py ``server_reply``)."""
    from mxnet import ndarray
    from .codecs.base import check_encoded
    from .lowrank import factors_of_matrix
    feedback = iterations < 0
    matrix = total.asnumpy().reshape((int(rows), -1)).astype(np.float64)
    if feedback:
        matrix += residual.asnumpy().reshape(matrix.shape)
    p, q = factors_of_matrix(matrix, int(rank), int(abs(iterations)))
    u, v = p.T.astype(np.float32), q.T.astype(np.float32)
    if feedback:
        left = matrix - u.T.astype(np.float64) @ v.astype(np.float64)
        residual[:] = ndarray.array(left.reshape((-1,)), dtype=np.float32)
    payload, status = op('kvx_outer_encode')(ndarray.array(u, dtype=np.float32),
                                             ndarray.array(v, dtype=np.float32),
                                             capacity=int(rank))
    check_encoded(status, 'aggregate', defer=False)
    return payload


_REENCODE = {FP32: None, TOPK: _topk_reply, TERNARY: _ternary_reply, OUTER: _outer_reply}


def reencode(total, residual, request):
    """The reply payload of the float32 ``total`` (its first n elements) for a reply
    request (codec id, n, a, b, c); ``residual`` (n floats) is updated in place. None
    for the float32 reply."""
    codec_id, n, a, b, c = request
    encode = _REENCODE[codec_id]
    if encode is None:
        return None
    return encode(total.reshape((-1,))[:n], residual, a, b, c)
