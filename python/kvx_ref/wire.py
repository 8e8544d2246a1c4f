"""Wire format shared by every server-decoded payload: header and digit packing.

Why integers in float containers: MXNet's dist server only adds floating types, and
its merge of row_sparse slots computes ``x + 0``, which does not preserve arbitrary
bit patterns (``-0.0``, signalling NaNs, denormals under DAZ).  So every integer
(codes, indices, counts) is stored as an exactly representable float (below 2**24 in
float32, below 2**53 in float64).  One codec carries raw bits: float16 pairs
(codecs.py, ``fp16_pairs_encode``), whose words are never NaN or Inf.

Header: 8 float32 words at the start of every server-decoded payload::

    [0] MAGIC          [1] codec id       [2] VERSION
    [3] n % 2**24      [4] n // 2**24     (n = element count of the tensor)
    [5] param a        [6] param b        (codec-specific, see codecs.py)
    [7] body length in words (everything after the header)
"""
import numpy as np

MAGIC = 7340.0
VERSION = 1.0
HEADER_WORDS = 8
MANTISSA_BITS = {np.dtype(np.float32): 24, np.dtype(np.float64): 53}

# codec ids (header word 1)
FP32, TOPK, TERNARY, ADACOMP, ELEMENT_TOPK, OUTER, FP16_PAIRS = 1, 2, 3, 4, 5, 6, 7

# status codes returned by encoders and decoders (0 = ok)
OK, NONFINITE, BAD_MAGIC, BAD_VERSION, BAD_CODEC, BAD_SIZE, BAD_PARAM, BAD_INDEX, BAD_WORD, \
    VOID = range(10)


def make_header(codec, n, a, b, body_len):
    return np.array([MAGIC, codec, VERSION, n % (1 << 24), n >> 24, a, b, body_len],
                    dtype=np.float32)


def check_header(payload, codec, n):
    """Return (status, a, b). ``n`` is the element count the receiver expects."""
    if payload.dtype != np.float32 or payload.ndim != 1 or payload.size < HEADER_WORDS:
        return BAD_SIZE, 0.0, 0.0
    h = payload[:HEADER_WORDS]
    if h[0] != MAGIC:
        return BAD_MAGIC, 0.0, 0.0
    if h[2] != VERSION:
        return BAD_VERSION, 0.0, 0.0
    if h[1] != codec:
        return BAD_CODEC, 0.0, 0.0
    if h[3] + h[4] * float(1 << 24) != n or h[7] != payload.size - HEADER_WORDS:
        return BAD_SIZE, 0.0, 0.0
    return OK, float(h[5]), float(h[6])


def digits_per_word(base, dtype):
    """Largest D with base**D <= 2**mantissa: every packed word is then an exact integer."""
    limit = 1 << MANTISSA_BITS[np.dtype(dtype)]
    d, power = 0, 1
    while power * base <= limit:
        power *= base
        d += 1
    return d


def pack_digits(digits, base, dtype):
    """Pack small non-negative integers (< base) little-endian, D digits per word.

    Unused positions of the last word hold ``pad`` = 0 digits.  The caller offsets the
    codes so that digit sums of several workers stay below ``base``.
    """
    d = digits_per_word(base, dtype)
    digits = np.asarray(digits, dtype=np.int64)
    words = -(-digits.size // d)
    padded = np.zeros(words * d, dtype=np.int64)
    padded[:digits.size] = digits
    powers = base ** np.arange(d, dtype=np.int64)
    return (padded.reshape(words, d) * powers).sum(axis=1).astype(dtype)


def unpack_digits(words, base, count):
    """Inverse of pack_digits: the first ``count`` digits of the packed words."""
    d = digits_per_word(base, words.dtype)
    w = np.asarray(words).astype(np.int64)
    out = np.empty((w.size, d), dtype=np.int64)
    for j in range(d):
        out[:, j] = w % base
        w = w // base
    return out.reshape(-1)[:count]
