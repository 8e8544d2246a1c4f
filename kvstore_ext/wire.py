"""The wire constants and payload sizes kvstore_ext's Python side uses.

They are the C++ library's (cpp/wire.h, cpp/codecs/; exported through the C API) and
the spec's (python/kvx_ref/wire.py): tests/test_cpp_ops.py (``test_wire_tables_agree``)
holds them equal, size by size. Which codec has which id and layout is its class's
to say (codec_list.py). Kept as plain Python (not read from the library at import)
because the launcher and the schemes' planning run where the plugin need not be
loaded.
"""

HEADER_WORDS = 8
HEADER_MAGIC = 7340.0         # header word 0 (cpp/wire.h kHeaderMagic)
HEADER_VERSION = 1.0          # header word 2
MANTISSA_F32 = 24              # integers are exact in float32 below 2**24

# The ids of the server-decoded codecs (header word 1) are their classes' ``codec_id``
# (codec_list.py). float32's is here too: it is also the plain reply (replies.py).
FP32 = 1

TERNARY_DIGITS = 15            # base-3 digits a float32 word: 3**15 <= 2**24 < 3**16


def digits_per_float32(base):
    """Largest D with base**D <= 2**24, so every packed word, and the sum of the
    workers' words, is an integer float32 holds exactly."""
    digits, power = 0, 1
    while power * base <= 1 << MANTISSA_F32:
        power *= base
        digits += 1
    return digits


def fp32_payload_words(n):
    return HEADER_WORDS + n


def topk_payload_words(k, filter_size):
    return HEADER_WORDS + k + k * filter_size


def ternary_payload_words(n):
    return HEADER_WORDS + -(-n // TERNARY_DIGITS)


def ternary_sum_words(n, num_workers):
    """Words of a homomorphic ternary payload: codes + 1 as base-(2n+1) digits."""
    return -(-n // digits_per_float32(2 * num_workers + 1))


def adacomp_entry_words(n):
    """Words of one AdaComp entry (code 2 * index + sign): one while codes stay below
    2**24 (n <= 2**23), else two."""
    return 1 if 2 * n <= 1 << MANTISSA_F32 else 2


def adacomp_payload_words(n, count):
    """Header + ``count`` entries (a slot holds ``count`` = the codec's capacity)."""
    return HEADER_WORDS + count * adacomp_entry_words(n)


def element_topk_index_words(n):
    """Words of one element top-k index: one while n <= 2**24, else two."""
    return 1 if n <= 1 << MANTISSA_F32 else 2


def element_topk_payload_words(n, k):
    """Header + ``k`` entries of index words and a float32 value."""
    return HEADER_WORDS + k * (element_topk_index_words(n) + 1)


def outer_payload_words(n, k, out):
    """Header + U (k x out) + V (k x in), in = n / out: a sum of k outer products
    (dAD's rows, rank-dAD's factors). -1 (as the library) if out does not divide n."""
    if k < 0 or out < 1 or n < 1 or n % out:
        return -1
    return HEADER_WORDS + k * (out + n // out)

