"""NumPy reference of every codec: the executable spec the C++ kernels are held to.

Every encoder takes ``grad`` and the worker's ``residual`` (float32, same shape), forms
``acc = grad + residual`` in float32 and returns ``(payload, new_residual, status)``.
On a non-finite ``acc`` it returns status NONFINITE, an invalid payload and the
residual unchanged: a bad step never enters the error-feedback memory.
Decoders return ``(values, status)``; they check the header and every index and word
before use, and return zeros with a non-zero status for a malformed payload.
The homomorphic (additive) codecs mark a void step in the first word: their encoders
return, on any failure, zeros with a NaN first word (``_void``), so that the sum of
every worker's words has a NaN first word, and their decoders decode such a sum to NaN
everywhere with status VOID (``_void_sum``): a worker can push and decode without
reading anything first (kvstore_ext/codecs/agreed.py, deferred checks).
Parameters are the caller's, not data: an invalid one (k out of range, a negative
scale, a threshold not finite in float32) raises ValueError here where the C++ kernels
return BAD_PARAM; ternary_decode_sum, a decoder, returns BAD_PARAM too.
"""
import numpy as np

from . import wire
from .wire import (HEADER_WORDS, OK, NONFINITE, BAD_SIZE, BAD_PARAM, BAD_INDEX, BAD_WORD,
                   make_header, check_header, pack_digits, unpack_digits, digits_per_word)

f32 = np.float32


def _acc(grad, residual):
    return (np.asarray(grad, f32) + np.asarray(residual, f32)).astype(f32)


def _invalid(n_words=HEADER_WORDS):
    return np.zeros(n_words, f32)


def _void(count):
    """An additive encoder's output of ``count`` words on failure: zeros, the first NaN."""
    words = np.zeros(count, f32)
    if words.size:
        words[0] = np.nan
    return words


def _void_sum(summed, shape):
    """(NaN everywhere, VOID) if the summed additive words are void, else None."""
    summed = np.asarray(summed).reshape(-1)
    if summed.size and np.isnan(summed[0]):
        return np.full(shape, np.nan, f32), wire.VOID
    return None


def _finite_f32(x):
    """True when the real x is finite and stays finite once rounded to float32."""
    with np.errstate(over='ignore'):
        return bool(np.isfinite(f32(x)))


# -- fp32 pass-through ------------------------------------------------------------

def fp32_encode(grad):
    g = np.asarray(grad, f32).reshape(-1)
    if not np.isfinite(g).all():
        return _invalid(HEADER_WORDS + g.size), NONFINITE
    return np.concatenate([make_header(wire.FP32, g.size, 0, 0, g.size), g]), OK


def fp32_decode(payload, n):
    status, _, _ = check_header(payload, wire.FP32, n)
    if status == OK and payload.size != HEADER_WORDS + n:
        status = BAD_SIZE        # a body shorter or longer than the n values it claims
    if status != OK:
        return np.zeros(n, f32), status
    return payload[HEADER_WORDS:].copy(), OK


# -- conv filter selection (Hylo) -------------------------------------------------

def filter_scores(x):
    """Squared L2 norm of each output filter (first axis), accumulated in float64."""
    x = np.asarray(x, f32)
    flat = x.reshape(x.shape[0], -1).astype(np.float64)
    return (flat * flat).sum(axis=1)


def topk_select(scores, k):
    """Indices of the k largest scores, ties to the lower index, returned ascending."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores)))
    return np.sort(order[:k])


def topk_encode(grad, residual, k):
    """Send the k output filters of ``acc`` with the largest norms; keep the rest.

    Payload: header (a = k, b = filter size F), k indices (ascending), k*F values.
    New residual: ``acc`` with the sent filters zeroed.
    """
    acc = _acc(grad, residual)
    o = acc.shape[0]
    f = acc.size // o
    if not 1 <= k <= o:
        raise ValueError('k must be in [1, %d], got %d' % (o, k))
    scores = filter_scores(acc)
    if not np.isfinite(scores).all():
        return _invalid(), np.asarray(residual, f32).copy(), NONFINITE
    idx = topk_select(scores, k)
    flat = acc.reshape(o, f)
    body = np.concatenate([idx.astype(f32), flat[idx].reshape(-1)])
    payload = np.concatenate([make_header(wire.TOPK, acc.size, k, f, body.size), body])
    new_res = flat.copy()
    new_res[idx] = 0
    return payload, new_res.reshape(acc.shape), OK


def indices_valid(idx, rows):
    """Filter indices: integral, in [0, rows), strictly ascending (NaN fails every test)."""
    idx = np.asarray(idx, np.float64)
    return bool((idx == np.floor(idx)).all() and (idx >= 0).all() and (idx < rows).all()
                and (np.diff(idx) > 0).all())


def topk_decode(payload, n):
    status, k, f = check_header(payload, wire.TOPK, n)
    out = np.zeros(n, f32)
    if status != OK:
        return out, status
    # Finite and integral before any int(): the header may hold NaN, Inf or 1e38.
    if not (np.isfinite(k) and np.isfinite(f)) or k != np.floor(k) or f != np.floor(f) \
            or k < 1 or f < 1 or k * f > n or payload.size != HEADER_WORDS + k + k * f:
        return out, BAD_PARAM
    k, f = int(k), int(f)
    if n % f != 0:
        return out, BAD_PARAM
    idx = payload[HEADER_WORDS:HEADER_WORDS + k]
    if not indices_valid(idx, n // f):
        return out, BAD_INDEX
    vals = payload[HEADER_WORDS + k:].reshape(k, f)
    out.reshape(n // f, f)[idx.astype(np.int64)] = vals
    return out, OK


def topk_gather(grad, residual, idx):
    """Homomorphic conv: send the agreed filters ``idx`` (k*F values, no header).

    ``idx`` must be valid (``indices_valid``), else BAD_INDEX and the residual unchanged.
    """
    acc = _acc(grad, residual)
    o = acc.shape[0]
    flat = acc.reshape(o, -1)
    values = np.zeros(len(idx) * flat.shape[1], f32)
    if len(idx) > o:
        raise ValueError('%d indices for %d filters' % (len(idx), o))
    if not indices_valid(idx, o):
        return _void(values.size), np.asarray(residual, f32).copy(), BAD_INDEX
    if not np.isfinite(acc).all():
        return _void(values.size), np.asarray(residual, f32).copy(), NONFINITE
    rows = np.asarray(idx).astype(np.int64)
    new_res = flat.copy()
    new_res[rows] = 0
    return flat[rows].reshape(-1).copy(), new_res.reshape(acc.shape), OK


def topk_scatter(values, idx, shape):
    """Rows ``idx`` of a zero tensor of ``shape`` get ``values`` (k*F of them)."""
    void = _void_sum(values, shape)
    if void is not None:
        return void
    out = np.zeros(shape, f32)
    rows = out.reshape(shape[0], -1)
    if len(idx) > rows.shape[0] or np.size(values) != len(idx) * rows.shape[1]:
        return out, BAD_PARAM
    if not indices_valid(idx, rows.shape[0]):
        return out, BAD_INDEX
    rows[np.asarray(idx).astype(np.int64)] = np.asarray(values, f32).reshape(len(idx),
                                                                              rows.shape[1])
    return out, OK


# -- ternary (Hylo FC 2-bit, adaptive threshold) ----------------------------------

TERNARY_BASE = 3


def adaptive_threshold(acc, scale):
    """t = scale * mean|acc|, the mean accumulated in float64, t rounded to float32.

    Inf when the product exceeds float32's range (the encoder then reports NONFINITE).
    """
    with np.errstate(over='ignore'):
        return f32(scale * (np.abs(acc.astype(np.float64)).sum() / acc.size))


def acc_abs_max(acc):
    """max |acc| (0 for an empty acc), a float32 value."""
    return f32(np.abs(acc).max()) if acc.size else f32(0)


def capped_threshold(acc, scale):
    """The encoder's adaptive t with its delivery cap: ``(t, capped)``, t =
    min(adaptive_threshold, max|acc|) and ``capped`` when the cap decided (adaptive >=
    max|acc|). Capped, the values at max|acc| are selected and a code stands for t under
    every value rule (``ternary_value``): they are sent whole. Why: with equal
    magnitudes and scale > 1 nothing reached scale * mean|acc|, and the threshold grew
    with the residual, so nothing was ever sent. Not capped, the largest |acc| m > t
    shrinks to |m - v| < m (v <= 2t < 2m). Either way a step whose acc is not all zero
    sends something. An Inf adaptive t stays Inf (NONFINITE)."""
    t = adaptive_threshold(acc, scale)
    if not np.isfinite(t):
        return t, False
    largest = acc_abs_max(acc)
    if t >= largest:
        return largest, True
    return t, False


def ternary_codes(acc, t):
    """-1, 0, +1 per element: +1 where acc >= t, -1 where acc <= -t (none when t == 0)."""
    if t <= 0:
        return np.zeros(acc.size, np.int64)
    a = acc.reshape(-1)
    return (a >= t).astype(np.int64) - (a <= -t).astype(np.int64)


def _ternary_residual(acc, codes, t):
    return (acc.reshape(-1) - codes.astype(f32) * f32(t)).astype(f32).reshape(acc.shape)


# value -> value_rule of kvx_ternary_encode (1, a former rule, is refused there)
TERNARY_VALUES = {'t': 0, 'round': 2}


def ternary_value(acc, t, value, capped=False):
    """What a nonzero code stands for: t (``'t'``, MXNet's rule) or 2t (``'round'``:
    the code is acc rounded to the nearest multiple of 2t, clipped to +-1, so a sent
    value's residual stays in [-t, t]). t under every rule when the delivery cap
    decided t (``capped_threshold``).
    """
    if capped:
        return f32(t)
    if value == 'round':
        with np.errstate(over='ignore'):
            return f32(2) * f32(t)
    return f32(t)


def ternary_encode(grad, residual, scale, threshold=0.0, value='t'):
    """Each value becomes 0, +v or -v where |acc| >= t; t = ``threshold`` if > 0, else
    adaptive with the delivery cap (capped_threshold); v by ``value`` (ternary_value).

    Payload: header (a = v, b = 3), then codes + 1 as base-3 digits, 15 per float32.
    An adaptive t that overflows float32 (scale * mean|acc| > FLT_MAX) is NONFINITE, as
    is a v = 2t that does; with a fixed t that is BAD_PARAM.
    """
    if value not in TERNARY_VALUES:
        raise ValueError('value must be one of %s' % (tuple(TERNARY_VALUES),))
    if not (np.isfinite(scale) and scale >= 0 and _finite_f32(threshold) and threshold >= 0):
        raise ValueError('scale and threshold must be finite and >= 0 (threshold in float32)')
    acc = _acc(grad, residual)
    if not np.isfinite(acc).all():
        return _invalid(), np.asarray(residual, f32).copy(), NONFINITE
    t, capped = (f32(threshold), False) if threshold > 0 else capped_threshold(acc, scale)
    if not np.isfinite(t):
        return _invalid(), np.asarray(residual, f32).copy(), NONFINITE
    codes = ternary_codes(acc, t)
    v = ternary_value(acc, t, value, capped)
    if not np.isfinite(v):
        if threshold > 0:
            raise ValueError('2 * threshold overflows float32')
        return _invalid(), np.asarray(residual, f32).copy(), NONFINITE
    body = pack_digits(codes + 1, TERNARY_BASE, f32)
    payload = np.concatenate([make_header(wire.TERNARY, acc.size, v, TERNARY_BASE, body.size),
                              body])
    return payload, _ternary_residual(acc, codes, v), OK


def ternary_decode(payload, n):
    status, t, base = check_header(payload, wire.TERNARY, n)
    out = np.zeros(n, f32)
    if status != OK:
        return out, status
    d = digits_per_word(TERNARY_BASE, f32)
    if base != TERNARY_BASE or not np.isfinite(t) or t < 0 \
            or payload.size != HEADER_WORDS + -(-n // d):
        return out, BAD_PARAM
    words = payload[HEADER_WORDS:]
    if (words != np.floor(words)).any() or (words < 0).any() or (words >= 3.0 ** d).any():
        return out, BAD_WORD
    codes = unpack_digits(words, TERNARY_BASE, n) - 1
    return (codes.astype(f32) * f32(t)).astype(f32), OK


MAX_WORKERS = 1 << 20


def sum_base(num_workers):
    """Base of the additive packing: digit sums of n workers lie in [0, 2n]."""
    return 2 * num_workers + 1


def sum_words(n, num_workers):
    """Words of a homomorphic ternary payload of n elements."""
    return -(-n // digits_per_word(sum_base(num_workers), f32))


def ternary_encode_sum(grad, residual, threshold, num_workers, value=0.0):
    """Homomorphic FC: agreed t; codes + 1 as base-(2n+1) digits in float32, no header.

    Float32 words because MXNet's dist server sums float64 pushes in float32 (measured:
    1e15 + rank from 2 workers into a float64 key returns 1999999973982208).  D digits a
    word with (2n+1)**D <= 2**24 (n = 2: 10, n = 4: 7, n = 8: 5), so every partial sum
    of n workers' words, in any order, is an integer below 2**24, exact in float32, and
    the total is the packing of the summed codes + n.
    """
    if not (1 <= num_workers <= MAX_WORKERS and _finite_f32(threshold) and threshold >= 0):
        raise ValueError('need 1 <= num_workers <= 2**20 and a finite threshold >= 0')
    acc = _acc(grad, residual)
    base = sum_base(num_workers)
    if not np.isfinite(acc).all():
        return (_void(sum_words(acc.size, num_workers)),
                np.asarray(residual, f32).copy(), NONFINITE)
    codes = ternary_codes(acc, f32(threshold))
    v = f32(value) if value > 0 else f32(threshold)    # what a code stands for
    return (pack_digits(codes + 1, base, f32), _ternary_residual(acc, codes, v), OK)


def ternary_decode_sum(words, threshold, num_workers, n):
    """Decode a summed payload (float32 words): sum of codes times t, per element."""
    void = _void_sum(words, n)
    if void is not None:
        return void
    out = np.zeros(n, f32)
    if not (1 <= num_workers <= MAX_WORKERS and _finite_f32(threshold) and threshold >= 0):
        return out, BAD_PARAM
    words = np.asarray(words)
    if words.dtype != f32 or words.ndim != 1 or words.size != sum_words(n, num_workers):
        return out, BAD_PARAM
    base = sum_base(num_workers)
    limit = float(base) ** digits_per_word(base, f32)   # <= 2**24
    if (words != np.floor(words)).any() or (words < 0).any() or (words >= limit).any():
        return out, BAD_WORD
    codes = unpack_digits(words, base, n) - num_workers
    return (codes.astype(f32) * f32(threshold)).astype(f32), OK


def agreed_ternary(stats, scale, value, num_workers, size):
    """(t, v) of the homomorphic FC from the agreement summed over workers, ``stats`` =
    [sum|acc|, max|acc|], as float64.

    t = scale * total / (num_workers * size), capped at the mean of the workers' maxima
    C = sum max / num_workers: the worker with the largest max has max >= C, so unless
    every acc is zero some worker sends, and a worker whose residual keeps growing
    passes C in time. Capped (t >= C), t = C and v = t under every rule; else v = 2t
    ('round') or t ('t'). A non-finite t (a
    worker's NaN/Inf) is 0. Float32 values, as every worker computes them."""
    stats = np.asarray(stats, np.float64)
    t = f32(scale * stats[0] / (num_workers * size))
    cap = f32(stats[-1] / num_workers)
    if not (np.isfinite(t) and np.isfinite(cap)):
        return 0.0, 0.0
    if t >= cap:
        return float(cap), float(cap)
    if value == 'round':
        v = f32(2) * t
        return float(t), float(v if np.isfinite(v) else t)
    return float(t), float(t)


# -- MXNet's built-in 2-bit (fixed threshold), bit layout as MXNet's --------------

_POS = [0xc0, 0x30, 0x0c, 0x03]
_NEG = [0x80, 0x20, 0x08, 0x02]


def twobit_encode(grad, residual, threshold):
    """MXNet's quantize_2bit: 16 values per 32-bit word, 11 = +t, 10 = -t, 00 = 0.

    Returns (uint32 words, new residual).  Same maths as ternary_encode with a fixed
    threshold; only the bit layout differs (raw bits, for MXNet compatibility).
    """
    if not (_finite_f32(threshold) and threshold >= 0):
        raise ValueError('threshold must be finite (in float32) and >= 0')
    acc = _acc(grad, residual).reshape(-1)
    t = f32(threshold)
    codes = ternary_codes(acc, t)
    n = acc.size
    words = -(-n // 16)
    raw = np.zeros(words * 4, np.uint8)
    for i in np.nonzero(codes)[0]:
        mask = _POS[i & 3] if codes[i] > 0 else _NEG[i & 3]
        raw[(i >> 4) * 4 + ((i & 15) >> 2)] |= mask
    return raw.view(np.uint32), _ternary_residual(acc, codes, t).reshape(np.shape(grad))


def twobit_decode(words, threshold, n):
    if not (_finite_f32(threshold) and threshold >= 0):
        raise ValueError('threshold must be finite (in float32) and >= 0')
    raw = np.asarray(words, np.uint32).view(np.uint8)
    i = np.arange(n)
    byte = raw[(i >> 4) * 4 + ((i & 15) >> 2)]
    bits = (byte >> (6 - 2 * (i & 3))) & 3
    t = f32(threshold)
    return np.where(bits == 3, t, np.where(bits == 2, -t, f32(0))).astype(f32)


# -- AdaComp (Chen et al. 2018, arXiv 1712.02679; docs/schemes/adacomp.md) ---------------

def adacomp_entry_words(n):
    """An entry is the code 2 * index + (H < 0): one float32 word while codes stay below
    2**24 (n <= 2**23), else two (code % 2**24, code // 2**24)."""
    return 1 if 2 * n <= 1 << 24 else 2


def adacomp_encode(grad, residual, bin_len, capacity):
    """Localized selection: G = grad + residual, H = G + grad; in each bin of ``bin_len``
    elements of the flattened G, send every j with |H_j| >= max|G| of its bin (bins whose
    G is all zero send nothing), at most ``capacity`` of them: the largest |H| go, ties to
    the lower index. Each sent element stands for sign(H_j) * scale, scale = the mean of
    the bins' max|G| (float64 sum in bin order, then float32); the residual keeps
    G - sign * scale there and G elsewhere.

    Payload of ``8 + capacity * E`` words: header (a = scale, b = count, body = count * E
    words), the entries by ascending index, zeros after them.
    """
    if not (bin_len >= 1 and 1 <= capacity <= np.size(grad)):
        raise ValueError('need bin_len >= 1 and 1 <= capacity <= n')
    g = np.asarray(grad, f32).reshape(-1)
    acc = _acc(grad, residual).reshape(-1)
    n = acc.size
    width = adacomp_entry_words(n)
    payload = np.zeros(HEADER_WORDS + capacity * width, f32)
    with np.errstate(over='ignore', invalid='ignore'):
        h = (acc + g).astype(f32)
    if not np.isfinite(h).all():          # H finite implies grad, residual, G finite
        return payload, np.asarray(residual, f32).copy(), NONFINITE
    bins = -(-n // bin_len)
    padded = np.zeros(bins * bin_len, f32)
    padded[:n] = np.abs(acc)
    gmax = padded.reshape(bins, bin_len).max(axis=1)
    threshold = np.repeat(gmax, bin_len)[:n]
    mag = np.abs(h)
    sent = np.nonzero((threshold > 0) & (mag >= threshold))[0]
    if sent.size > capacity:
        sent = np.sort(sent[np.lexsort((sent, -mag[sent]))[:capacity]])
    scale = f32(np.cumsum(gmax.astype(np.float64))[-1] / bins)
    negative = h[sent] < 0
    codes = 2 * sent.astype(np.int64) + negative
    entries = np.stack([codes % (1 << 24), codes >> 24], axis=1)[:, :width]
    payload[:HEADER_WORDS] = make_header(wire.ADACOMP, n, scale, sent.size, sent.size * width)
    payload[HEADER_WORDS:HEADER_WORDS + entries.size] = entries.reshape(-1)
    new_res = acc.copy()
    new_res[sent] = acc[sent] - np.where(negative, -scale, scale).astype(f32)
    return payload, new_res.reshape(np.shape(grad)), OK


def adacomp_decode(payload, n):
    """+-scale at the sent indices. ``payload`` is the header and its body (a slot's
    padding removed, as decode_slots does)."""
    status, scale, count = check_header(payload, wire.ADACOMP, n)
    out = np.zeros(n, f32)
    if status != OK:
        return out, status
    width = adacomp_entry_words(n)
    if n > 1 << 47:
        return out, wire.BAD_SIZE
    if not np.isfinite(scale) or scale < 0 or count != np.floor(count) or not \
            0 <= count <= n or payload.size != HEADER_WORDS + count * width:
        return out, BAD_PARAM
    words = payload[HEADER_WORDS:].astype(np.float64).reshape(-1, width)
    if (words != np.floor(words)).any() or (words < 0).any() or (words >= 1 << 24).any():
        return out, BAD_WORD
    codes = words[:, 0].astype(np.int64)
    if width == 2:
        codes += words[:, 1].astype(np.int64) << 24
    index = codes >> 1
    if (index >= n).any() or (np.diff(index) <= 0).any():
        return out, BAD_INDEX
    out[index] = np.where(codes & 1, -f32(scale), f32(scale)).astype(f32)
    return out, OK


# -- element top-k (the sparsification baseline; docs/schemes/topk.md) ----------------

def element_topk_index_words(n):
    """An index is an exact float32 integer: one word while n <= 2**24, else two
    (index % 2**24, index // 2**24)."""
    return 1 if n <= 1 << 24 else 2


def element_topk_encode(grad, residual, k):
    """Send the k elements of ``acc`` with the largest |acc| (ties to the lower index).

    Payload of ``8 + k * E`` words, E = index words + 1: header (a = k, b = 0, body =
    k * E words), then per sent element by ascending index its index words and its
    float32 value. New residual: ``acc`` with the sent elements zeroed.
    """
    acc = _acc(grad, residual).reshape(-1)
    n = acc.size
    if not 1 <= k <= n:
        raise ValueError('k must be in [1, %d], got %d' % (n, k))
    width = element_topk_index_words(n) + 1
    payload = np.zeros(HEADER_WORDS + k * width, f32)
    if not np.isfinite(acc).all():
        return payload, np.asarray(residual, f32).copy(), NONFINITE
    sent = np.sort(np.lexsort((np.arange(n), -np.abs(acc)))[:k])
    entries = np.stack([sent % (1 << 24), sent >> 24, np.zeros(k, np.int64)], axis=1)
    entries = entries[:, [0, 1, 2] if width == 3 else [0, 2]].astype(f32)
    entries[:, -1] = acc[sent]
    payload[:HEADER_WORDS] = make_header(wire.ELEMENT_TOPK, n, k, 0, k * width)
    payload[HEADER_WORDS:] = entries.reshape(-1)
    new_res = acc.copy()
    new_res[sent] = 0
    return payload, new_res.reshape(np.shape(grad)), OK


def element_topk_decode(payload, n):
    status, k, b = check_header(payload, wire.ELEMENT_TOPK, n)
    out = np.zeros(n, f32)
    if status != OK:
        return out, status
    width = element_topk_index_words(n) + 1
    if not (1 <= k <= n and k == np.floor(k) and b == 0
            and payload.size == HEADER_WORDS + k * width):
        return out, BAD_PARAM
    entries = payload[HEADER_WORDS:].reshape(-1, width)
    words = entries[:, :-1].astype(np.float64)
    values = entries[:, -1]
    if (words != np.floor(words)).any() or (words < 0).any() or (words >= 1 << 24).any() \
            or not np.isfinite(values).all():
        return out, BAD_WORD
    index = words[:, 0].astype(np.int64)
    if width == 3:
        index += words[:, 1].astype(np.int64) << 24
    if (index >= n).any() or (np.diff(index) <= 0).any():
        return out, BAD_INDEX
    out[index] = values
    return out, OK


# -- float16 in sum mode (dist_sync_fp16; docs/schemes/fp16.md) ------------------------

FLOAT16_MAX = 65504.0


def fp16_limit(num_workers):
    """Largest float16 L with ``num_workers * L <= 65504``: no partial sum of the
    workers' halves overflows float16."""
    bound = np.float16(FLOAT16_MAX / num_workers)
    while float(bound) * num_workers > FLOAT16_MAX:
        bound = np.nextafter(bound, np.float16(0))
    return bound


def fp16_encode(grad, residual, num_workers):
    """``acc`` clipped to +-fp16_limit(num_workers), rounded to float16 (nearest, ties to
    even). Returns (float16 halves, new residual = acc - halves, status)."""
    acc = _acc(grad, residual)
    if not np.isfinite(acc).all():
        return np.zeros(acc.shape, np.float16), np.asarray(residual, f32).copy(), NONFINITE
    bound = f32(fp16_limit(num_workers))
    half = np.clip(acc, -bound, bound).astype(np.float16)
    return half, (acc - half.astype(f32)).astype(f32), OK


def fp16_encode_plain(grad, num_workers):
    """Without error feedback: the gradient clipped to +-fp16_limit(num_workers) and
    rounded to float16; nothing is kept. Returns (float16 halves, status)."""
    acc = np.asarray(grad, f32)
    if not np.isfinite(acc).all():
        return np.zeros(acc.shape, np.float16), NONFINITE
    bound = f32(fp16_limit(num_workers))
    return np.clip(acc, -bound, bound).astype(np.float16), OK


def fp16_server_sum(halves):
    """A model of the stock server's sum of float16 pushes: added in float32 in arrival
    order and rounded once to float16. One 4-worker run matched it on every element, a
    later one did not (tests/test_fp16.py asserts only float16 rounding per addition).
    Float32 holds the sum of a few halves exactly unless their magnitudes are more than
    2**13 apart, so the order rarely matters."""
    total = np.zeros(np.shape(halves[0]), f32)
    for h in halves:
        total = (total + np.asarray(h, np.float16).astype(f32)).astype(f32)
    return total.astype(np.float16)


# -- float16 pairs, decoded by the servers (dist_sync_fp16, aggregation='server') -------

def fp16_pairs_encode(grad, residual, limit, error_feedback):
    """fp16_encode's halves (clip at ``limit``), two to a float32 word after the header:
    word j holds half 2j in its low 16 bits and half 2j + 1 in its high 16 (a last odd
    half with zeros); header a = limit, b = error_feedback (1: the residual keeps
    acc - half; 0: acc is the gradient, the residual is neither read nor returned
    changed). The words are raw bits, never NaN or Inf: a word's exponent field is its
    high half's exponent and 3 mantissa bits, all ones only for a half Inf or NaN.
    Returns (payload, new residual, status)."""
    grad = np.asarray(grad, f32).reshape(-1)
    n = grad.size
    words = HEADER_WORDS + (n + 1) // 2
    acc = _acc(grad, np.reshape(residual, -1)) if error_feedback else grad
    kept = None if residual is None else np.asarray(residual, f32).copy()
    if not np.isfinite(acc).all():
        return np.zeros(words, f32), kept, NONFINITE
    half = np.clip(acc, -f32(limit), f32(limit)).astype(np.float16)
    body = np.zeros(2 * (words - HEADER_WORDS), np.float16)
    body[:n] = half
    payload = np.concatenate([wire.make_header(wire.FP16_PAIRS, n, limit, error_feedback,
                                               words - HEADER_WORDS),
                              body.view(np.uint16).view(f32)])
    if error_feedback:
        kept = (acc - half.astype(f32)).astype(f32)
    return payload, kept, OK


def fp16_pairs_decode(payload, n):
    """The halves widened to float32; BAD_WORD if any half is Inf or NaN."""
    status, _, _ = wire.check_header(payload, wire.FP16_PAIRS, n)
    if status == OK and payload.size != HEADER_WORDS + (n + 1) // 2:
        status = wire.BAD_SIZE
    if status != OK:
        return np.zeros(n, f32), status
    half = np.ascontiguousarray(payload[HEADER_WORDS:]).view(np.float16)[:n]
    if not np.isfinite(half).all():
        return np.zeros(n, f32), wire.BAD_WORD
    return half.astype(f32), OK


# -- server-decode aggregation ----------------------------------------------------

from .dad import outer_decode  # noqa: E402  (dad.py imports wire only)

_DECODERS = {wire.FP32: fp32_decode, wire.TOPK: topk_decode, wire.TERNARY: ternary_decode,
             wire.ADACOMP: adacomp_decode, wire.ELEMENT_TOPK: element_topk_decode,
             wire.OUTER: outer_decode, wire.FP16_PAIRS: fp16_pairs_decode}


def register_decoder(codec_id, decode):
    """Make ``decode(payload, n) -> (float32 array, status)`` the reference decoder of
    ``codec_id`` in ``decode_slots``: a codec's own reference module calls it, so that a
    new codec edits no shared file here."""
    _DECODERS[float(codec_id)] = decode


def decode_slots(slots, capacity):
    """What a server does with one key: decode each worker's slot (a payload, then
    padding), which must agree on codec and element count, and sum in float32 in worker
    order. A slot whose first word is NaN is VOID (its worker's gradient was
    non-finite); a void or malformed slot makes the whole sum NaN. Returns (sum of ``capacity`` elements, per-worker
    statuses)."""
    total = np.zeros(capacity, f32)
    statuses, first = [], None
    for slot in np.asarray(slots, f32):
        if slot.size and np.isnan(slot[0]):      # void: a worker's non-finite gradient
            statuses.append(wire.VOID)
            continue
        h = slot[:HEADER_WORDS]
        body = float(h[7]) if slot.size >= HEADER_WORDS else -1.0
        low, high = (float(h[3]), float(h[4])) if slot.size >= HEADER_WORDS else (-1.0, -1.0)
        if not (0 <= body <= slot.size - HEADER_WORDS and body == int(body)
                and 0 <= low < 2 ** 24 and low == int(low) and 0 <= high < 2 ** 24
                and high == int(high)):
            statuses.append(wire.BAD_SIZE)
            continue
        n = int(low) + (int(high) << 24)
        first = first or (float(h[1]), n)
        if not 1 <= n <= capacity:
            statuses.append(wire.BAD_SIZE)
        elif (float(h[1]), n) != first or float(h[1]) not in _DECODERS:
            statuses.append(wire.BAD_CODEC)
        else:
            decoded, status = _DECODERS[float(h[1])](slot[:HEADER_WORDS + int(body)], n)
            statuses.append(status)
            if status == OK:
                total[:n] += decoded
    if any(statuses):
        total[:] = np.nan
    return total, statuses
