"""Server-side maths of server-decode mode: decode every worker's payload and sum.

Shared by the parameter-server aggregator and the single-process transport, so a
one-process run exercises exactly what the servers do.
"""
import numpy as np

from .codecs.base import HEADER_WORDS
from .codecs.registry import codec_class
from .errors import PayloadError


def payload_codec(payload):
    """The codec class named in a payload's header (word 1)."""
    return codec_class(payload[1].asscalar())


def header_size(header, capacity):
    """Payload length (header + body) a header announces, checked against ``capacity``."""
    body = float(header[7])
    if not (body == int(body) and 0 <= body <= capacity - HEADER_WORDS):
        raise PayloadError('header announces a body of %r words in a slot of %d'
                           % (body, capacity))
    return HEADER_WORDS + int(body)


def element_count(header):
    """Tensor size from header words 3 (low 24 bits) and 4 (the rest)."""
    low, high = float(header[3]), float(header[4])
    if not (low == int(low) and high == int(high) and 0 <= low < 1 << 24 and high >= 0):
        raise PayloadError('bad element count in header')
    return int(low) + (int(high) << 24)


def decode_sum(payloads, shape):
    """float32 sum of the decoded payloads; PayloadError names a malformed one."""
    from mxnet import ndarray
    acc = ndarray.zeros(shape, dtype=np.float32)
    for payload in payloads:
        payload_codec(payload).decode_add(payload, acc)
    return acc
