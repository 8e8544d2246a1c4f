"""NumPy reference of THC (Tensor Homomorphic Compression), the spec of cpp/codecs/thc.cc.

THC makes quantised gradients *additive*: every worker maps its ``x = grad + residual``
into the same randomly rotated, equally scaled coordinate system and rounds to integer
levels, so that the parameter server can add the integers and the workers decode the
sum. One step of one chunk, as the C++ kernels do it (bit for bit):

1. ``norm_slots``: each worker's ``||x||_2`` (float64 sum of squares in NumPy's order,
   rounded to float32) in its own slot of a ``num_workers``-word array; the summed array
   holds every worker's norm (each slot is one worker's value plus zeros: exact), and
   all use ``M = max``.
2. ``rotate``: zero-pad x to ``padded_size`` (blocks: powers of two, see ``blocks``),
   multiply block b (float32) by ``s_b = float32(min(sqrt(d) / (M sqrt(B_b)), FLT_MAX))``,
   clamp to ``+-float32(2 sqrt(d / B_b))`` (a guard that only a wrong M reaches), flip
   signs (a +-1 per padded position from the shared seed and the step), then the
   unnormalised Walsh-Hadamard transform of every block (float32 butterflies). Scaling
   first bounds every value by ``sqrt(d / B_b)`` and every transformed value by
   ``sqrt(d B_b)``, so the float32 transform never overflows; the coordinates are then
   about N(0, ||x||^2 / M^2) when x's energy is spread (at most unit variance).
3. ``quantize``: clamp to ``[-T, T]`` and round stochastically between the two
   entries of a table around it. A table (``table_values``) is ``q`` sorted integers
   ``t[0] = 0 < ... < t[q-1] = g`` of a grid of g; entry value j stands for
   ``(j - g/2) * 2T/g``. ``'uniform'``: ``t[k] = k``, ``g = q - 1`` (levels
   ``-T + k * 2T/(q-1)``); ``'thc'``: THC's non-uniform table, ``q = 16`` on ``g = 30``
   (``THC_TABLE``). ``p = min((z + T) * float32(g/(2T)), g)``, the interval
   ``t[j] <= p <= t[j+1]`` (j <= q - 2), ``w = t[j+1] - t[j]``, digit =
   ``t[j] + w * (u < float32(p - t[j]) / w)`` with a 24-bit uniform u from the worker's
   own stream, so ``E[value] = clamp(z)``. The digit is the entry's *value*, an integer
   in [0, g]: values add, indices do not. (Uniform: ``floor(p) + (u < frac(p))``.)
4. ``pack``: digits as base ``b = n g + 1`` digits (n = num_workers), D a float32
   word with ``b**D <= 2**24``: every partial sum of n workers' words is an integer below
   2**24, exact in float32 (MXNet's server adds float32 keys; float64 keys are summed in
   float32 precision, so they would not help), and the sum is the packing of the summed
   digits.
5. ``decode_sum``: unpack S, the sum of n digits, per coordinate; the level sum is
   ``L = S * 2T/g - n T`` (float64, rounded to float32); invert the transform:
   ``signs * fwht(L * r_b)``, ``r_b = float32(M / (sqrt(d) sqrt(B_b)))`` (float32
   products), and drop the padding. The worker's residual is ``x - decode(own digits,
   n = 1)``: what its own contribution lost to the clamp and the rounding (error
   feedback).

Randomness is counter-based (SplitMix64's finaliser over a counter), so a step is a pure
function of (seed, step, rank) and checkpoints need only the step count:

* signs: ``key = stream(seed, step, 0)``; position i's sign is bit ``i % 64`` of
  ``mix64(key + i // 64)`` (1 = negative). The same on every worker.
* dither: ``key = stream(seed, step, rank + 1)``, folded to 32 bits ``k = (key ^ key >>
  32) mod 2**32``; position i's u is the top 24 bits of ``hash32(k + i mod 2**32)``
  (Chris Wellons' lowbias32 mixer) times 2**-24. Each worker has its own stream, so
  rounding errors are independent across workers.

``stream(seed, step, who) = mix64(mix64(mix64(seed) ^ step) ^ who)``.
"""
import numpy as np

from .codecs import filter_scores
from .wire import OK, NONFINITE, BAD_PARAM, BAD_WORD, VOID, digits_per_word

f32 = np.float32
MASK = (1 << 64) - 1
MIN_BLOCK = 256                # a tail below this is padded to a power of two
MAX_WORKERS = 1 << 20
MAX_LEVELS = 1 << 16
MAX_CLAMP = 1e4
EXACT = 1 << 24                # float32 integers are exact below this
FLT_MAX = float(np.finfo(f32).max)
# THC's non-uniform table (its authors' code): 16 entries of a grid of 30, denser near 0,
# where the rotated coordinates (about N(0, 1)) are; used with T = Phi^-1(1 - 1/64).
THC_TABLE = (0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30)
THC_TABLE_CLAMP = 2.1539
TABLES = ('uniform', 'thc')


# -- counter-based randomness ---------------------------------------------------------

def mix64(z):
    """SplitMix64's step and finaliser on uint64 (arrays or scalars; wraps mod 2**64)."""
    z = np.asarray(z, np.uint64)
    with np.errstate(over='ignore'):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def stream(seed, step, who):
    """The key of one random stream: who = 0 for the shared signs, rank + 1 for a
    worker's dither."""
    k = mix64(np.uint64(seed))
    k = mix64(k ^ np.uint64(step))
    return mix64(k ^ np.uint64(who))


def signs(seed, step, d):
    """+-1 (float32) of the d padded positions, shared by every worker."""
    key = stream(seed, step, 0)
    i = np.arange(d, dtype=np.uint64)
    with np.errstate(over='ignore'):
        h = mix64(key + (i >> np.uint64(6)))
    bit = (h >> (i & np.uint64(63))) & np.uint64(1)
    return np.where(bit == 1, f32(-1), f32(1)).astype(f32)


def hash32(x):
    """lowbias32 (Chris Wellons, public domain) on uint32 arrays."""
    x = np.asarray(x, np.uint32)
    with np.errstate(over='ignore'):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7feb352d)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846ca68b)
    return x ^ (x >> np.uint32(16))


def dither(seed, step, rank, d):
    """The d uniforms in [0, 1) (24 bits, exact float32) of worker ``rank``."""
    key = int(stream(seed, step, rank + 1))
    k = (key ^ (key >> 32)) & 0xFFFFFFFF
    i = np.arange(d, dtype=np.uint64)
    h = hash32(((np.uint64(k) + i) & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    return ((h >> np.uint32(8)).astype(np.float64) * 2.0 ** -24).astype(f32)


# -- layout ---------------------------------------------------------------------------

def valid_block(block):
    return MIN_BLOCK <= block <= (1 << 24) and block & (block - 1) == 0


def blocks(n, block):
    """Sizes of the Hadamard blocks of n elements, in order: ``block`` while at least
    that much is left, then the largest power of two that fits, down to MIN_BLOCK; a
    tail below MIN_BLOCK takes the next power of two (the only padding, < MIN_BLOCK)."""
    sizes, rest = [], int(n)
    while rest > 0:
        if rest >= block:
            size = block
        elif rest >= MIN_BLOCK:
            size = 1 << (rest.bit_length() - 1)
        else:
            size = 1 << (rest - 1).bit_length()
        sizes.append(size)
        rest -= min(size, rest)
    return sizes


def padded_size(n, block):
    return sum(blocks(n, block))


def table_valid(levels, table):
    """A known table: 'uniform' with 2 <= q <= 2**16, or 'thc' with q = 16."""
    if table == 'uniform':
        return 2 <= levels <= MAX_LEVELS
    return table == 'thc' and levels == len(THC_TABLE)


def table_values(levels, table='uniform'):
    """The table's entries t[0..q-1] (int64), t[0] = 0, t[q-1] = g."""
    if not table_valid(levels, table):
        raise ValueError('no table %r with %r levels' % (table, levels))
    return np.arange(levels, dtype=np.int64) if table == 'uniform' else \
        np.array(THC_TABLE, np.int64)


def grid(levels, table='uniform'):
    """g: the largest entry (q - 1 for the uniform table, 30 for THC's)."""
    return int(table_values(levels, table)[-1])


def sum_base(levels, num_workers, table='uniform'):
    """Base of the packing: the sum of n digits lies in [0, n g]."""
    return num_workers * grid(levels, table) + 1


def sum_words(n, block, levels, num_workers, table='uniform'):
    """float32 words of a packed payload of n elements."""
    d = padded_size(n, block)
    return -(-d // digits_per_word(sum_base(levels, num_workers, table), f32))


def params_valid(levels, clamp, block, num_workers, table='uniform'):
    return (1 <= num_workers <= MAX_WORKERS and table_valid(levels, table)
            and valid_block(block)
            and sum_base(levels, num_workers, table) <= EXACT
            and np.isfinite(f32(clamp)) and f32(clamp) > 0 and clamp <= MAX_CLAMP)


# -- 1. the norm round ----------------------------------------------------------------

def norm(acc):
    """||acc||_2: float64 sum of squares in NumPy's order, rounded to float32 (at most
    float32's largest value)."""
    squares = filter_scores(np.asarray(acc, f32).reshape(1, -1))[0]
    return f32(min(np.sqrt(squares), FLT_MAX))


def norm_slots(grad, residual, rank, num_workers):
    """(num_workers words, zero but this worker's norm at ``rank``; status). A
    non-finite acc puts NaN in the slot: the summed norms are NaN on every worker, and
    the step is void there (``encode``, ``decode_sum``)."""
    acc = (np.asarray(grad, f32) + np.asarray(residual, f32)).astype(f32)
    slots = np.zeros(num_workers, f32)
    if not np.isfinite(acc).all():
        slots[rank] = np.nan
        return slots, NONFINITE
    slots[rank] = norm(acc)
    return slots, OK


def max_norm(norms):
    """M, or None if the norms are not finite and >= 0."""
    norms = np.asarray(norms, f32)
    if norms.size < 1 or not np.isfinite(norms).all() or (norms < 0).any():
        return None
    return f32(norms.max())


# -- 2. the randomized Hadamard transform ---------------------------------------------

def fwht(x):
    """Unnormalised Walsh-Hadamard transform of a power-of-two float32 block: butterflies
    (a + b, a - b) at strides 1, 2, 4, ... in float32."""
    x = np.asarray(x, f32).copy()
    h = 1
    while h < x.size:
        pairs = x.reshape(-1, 2, h)
        a, b = pairs[:, 0, :].copy(), pairs[:, 1, :].copy()
        pairs[:, 0, :] = a + b
        pairs[:, 1, :] = a - b
        h *= 2
    return x


def scales(n, block, m):
    """Per block: (size, s, bound, r), float32: s = sqrt(d) / (M sqrt(B)) capped at
    float32's largest (0 when M = 0: then every x is 0), bound = 2 sqrt(d / B),
    r = M / (sqrt(d) sqrt(B)); float64 expressions, rounded once."""
    sizes = blocks(n, block)
    d = float(sum(sizes))
    out = []
    for size in sizes:
        s = min(np.sqrt(d) / (float(m) * np.sqrt(float(size))), FLT_MAX) if m > 0 else 0.0
        out.append((size, f32(s), f32(2.0 * np.sqrt(d / size)),
                    f32(float(m) / (np.sqrt(d) * np.sqrt(float(size))))))
    return out


def rotate(x, m, seed, step, block):
    """z (padded, float32): scaled, clamped, signed, Hadamard-transformed x (step 2 of
    the module docstring)."""
    x = np.asarray(x, f32).reshape(-1)
    layout = scales(x.size, block, m)
    d = sum(size for size, _, _, _ in layout)
    padded = np.zeros(d, f32)
    padded[:x.size] = x
    sign = signs(seed, step, d)
    z = np.empty(d, f32)
    offset = 0
    for size, s, bound, _ in layout:
        with np.errstate(over="ignore"):      # x * s beyond float32: clamped
            part = np.clip((padded[offset:offset + size] * s).astype(f32), -bound, bound)
        z[offset:offset + size] = fwht(part.astype(f32) * sign[offset:offset + size])
        offset += size
    return z


def unrotate(z, m, seed, step, block, n):
    """Inverse of ``rotate`` (up to rounding and the clamp): signs * fwht(z * r), the
    first n elements."""
    z = np.asarray(z, f32)
    sign = signs(seed, step, z.size)
    out = np.empty(z.size, f32)
    offset = 0
    for size, _, _, r in scales(n, block, m):
        h = fwht((z[offset:offset + size] * r).astype(f32))
        out[offset:offset + size] = h * sign[offset:offset + size]
        offset += size
    return out[:n]


# -- 3. stochastic rounding, 4. packing -------------------------------------------------

def quantize(z, levels, clamp, u, table='uniform'):
    """Digits (table values in [0, g]) of z clamped to [-T, T]; E[value(digit)] =
    clamp(z). Rounds between the two entries around p (step 3 of the module docstring)."""
    entries = table_values(levels, table)
    g = int(entries[-1])
    t = f32(clamp)
    inv = f32(g / (2.0 * float(t)))
    zc = np.clip(np.asarray(z, f32), -t, t).astype(f32)
    p = ((zc + t).astype(f32) * inv).astype(f32)
    p = np.minimum(p, f32(g))
    # the interval of each p: j = the last entry <= floor(p), at most q - 2
    j = np.minimum(np.searchsorted(entries, np.floor(p).astype(np.int64), side='right') - 1,
                   levels - 2)
    lo, width = entries[j], entries[j + 1] - entries[j]
    frac = ((p - lo.astype(f32)).astype(f32) / width.astype(f32)).astype(f32)
    return lo + width * (np.asarray(u, f32) < frac)


def level_sum(digits_sum, levels, clamp, num_workers, table='uniform'):
    """float32 value of a sum of num_workers digits: S * 2T/g - n T (float64)."""
    t = float(f32(clamp))
    delta = 2.0 * t / grid(levels, table)
    return (np.asarray(digits_sum, np.float64) * delta - num_workers * t).astype(f32)


def pack(codes, base):
    """Digits (< base) little-endian, D a float32 word (base**D <= 2**24); the last
    word's unused digits are 0."""
    d = digits_per_word(base, f32)
    codes = np.asarray(codes, np.int64)
    words = -(-codes.size // d)
    padded = np.zeros(words * d, np.int64)
    padded[:codes.size] = codes
    powers = base ** np.arange(d, dtype=np.int64)
    return (padded.reshape(words, d) * powers).sum(axis=1).astype(f32)


def unpack(words, base, count):
    d = digits_per_word(base, f32)
    w = np.asarray(words).astype(np.int64)
    out = np.empty((w.size, d), np.int64)
    for j in range(d):
        out[:, j] = w % base
        w = w // base
    return out.reshape(-1)[:count]


# -- one step ---------------------------------------------------------------------------

def encode(grad, residual, norms, rank, levels, clamp, seed, step, block, table='uniform'):
    """(words, new residual, status) of worker ``rank``; num_workers = len(norms). A
    void step (a non-finite acc: NONFINITE; a NaN norm, another worker's: VOID) sends
    NaN words, whose sum is NaN everywhere, and keeps the residual."""
    num_workers = len(norms)
    if not (params_valid(levels, clamp, block, num_workers, table) and 0 <= rank < num_workers
            and 0 <= step < EXACT):
        raise ValueError('bad THC parameters')
    acc = (np.asarray(grad, f32) + np.asarray(residual, f32)).astype(f32)
    shape, acc = acc.shape, acc.reshape(-1)
    words = sum_words(acc.size, block, levels, num_workers, table)
    if not np.isfinite(acc).all():
        return np.full(words, np.nan, f32), np.asarray(residual, f32).copy(), NONFINITE
    if np.isnan(np.asarray(norms, f32)).any():
        return np.full(words, np.nan, f32), np.asarray(residual, f32).copy(), VOID
    m = max_norm(norms)
    if m is None:
        return np.zeros(words, f32), np.asarray(residual, f32).copy(), BAD_PARAM
    z = rotate(acc, m, seed, step, block)
    digits = quantize(z, levels, clamp, dither(seed, step, rank, z.size), table)
    own = unrotate(level_sum(digits, levels, clamp, 1, table), m, seed, step, block, acc.size)
    new_residual = (acc - own).astype(f32).reshape(shape)
    return pack(digits, sum_base(levels, num_workers, table)), new_residual, OK


def decode_sum(words, norms, levels, clamp, seed, step, block, n, table='uniform'):
    """(float32 sum over workers of n elements, status) of summed words; a NaN norm (a
    void step) gives NaN everywhere and VOID."""
    out = np.zeros(n, f32)
    num_workers = len(norms)
    if not (params_valid(levels, clamp, block, num_workers, table) and 0 <= step < EXACT):
        return out, BAD_PARAM
    words = np.asarray(words)
    if (words.dtype != f32 or words.ndim != 1
            or words.size != sum_words(n, block, levels, num_workers, table)):
        return out, BAD_PARAM
    if np.isnan(np.asarray(norms, f32)).any():
        return np.full(n, np.nan, f32), VOID
    m = max_norm(norms)
    if m is None:
        return out, BAD_PARAM
    base = sum_base(levels, num_workers, table)
    limit = float(base) ** digits_per_word(base, f32)
    if (words != np.floor(words)).any() or (words < 0).any() or (words >= limit).any():
        return out, BAD_WORD
    d = padded_size(n, block)
    summed = level_sum(unpack(words, base, d), levels, clamp, num_workers, table)
    return unrotate(summed, m, seed, step, block, n), OK
