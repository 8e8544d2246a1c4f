"""Compressed replies: the servers re-encode a round's sum (two-way compression).

A Gather round may ask the servers to reply with the sum re-encoded by the workers'
codec instead of float32 (``Gather.reply``), so that the pull shrinks like the push
and does not grow with the number of workers. The server keeps the re-encoding's
error in a residual of its own (error feedback on the server, as DoubleSqueeze
does), so what one reply leaves out goes with the next.

The request travels as a reply row of float32 words that the key carries with it:
[REPLY_MAGIC, codec id, n % 2**24, n // 2**24, a, b, c] (the codec's parameters:
top-k: k, filter size, 0; ternary: scale, fixed threshold, the value rule (0: a code
stands for t, 2: for 2t; any other is refused by the encoder); outer products (rank-dAD's 'rankdad'): rank, rows of the
weight, power iterations, negative with error feedback). Codec id 1 (float32) is
the plain reply: the float32 sum. Any other id is a codec of the codec list
(codec_list.py) whose class has a ``server_reencode``.

A module apart from aggregate.py (decoding) because it needs the codec list complete,
so it imports the codecs, which themselves decode through aggregate.py.
"""
from . import codec_list, codecs  # noqa: F401  (defining the codecs fills the list)
from .errors import PayloadError
from .wire import FP32

REPLY_MAGIC = 7341.0
REPLY_WORDS = 7
FLOAT32_REPLY = (FP32, 0, 0.0, 0.0, 0.0)


def reply_row(codec_id, n, a, b, c):
    """The reply request as float32 words (every one exact)."""
    return [REPLY_MAGIC, float(codec_id), float(n % (1 << 24)), float(n >> 24),
            float(a), float(b), float(c)]


def _reencoder(codec_id):
    codec = codec_list.find(codec_id)
    return None if codec is None else codec.server_reencode


def parse_reply_row(words):
    """(codec id, n, a, b, c) of a reply row; PayloadError if it is not one."""
    if len(words) < REPLY_WORDS or words[0] != REPLY_MAGIC or (
            words[1] != FP32 and _reencoder(words[1]) is None):
        raise PayloadError('not a reply request: %s' % list(words[:REPLY_WORDS]))
    return (int(words[1]), int(words[2]) + (int(words[3]) << 24), float(words[4]),
            float(words[5]), float(words[6]))


def reencode(total, residual, request):
    """The reply payload of the float32 ``total`` (its first n elements) for a reply
    request (codec id, n, a, b, c); ``residual`` (n floats) is updated in place. None
    for the float32 reply."""
    codec_id, n, a, b, c = request
    if codec_id == FP32:
        return None
    return _reencoder(codec_id)(total.reshape((-1,))[:n], residual, a, b, c)
