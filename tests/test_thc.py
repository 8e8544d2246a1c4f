"""dist_sync_thc: the C++ operators against the NumPy reference (python/kvx_ref/thc.py),
bit for bit, on awkward tensors; the float32 sums of n workers' packed digits are exact
integers in any order; the stochastic rounding is unbiased (a statistical bound that a
1% bias fails) and its noise is what the table gives; malformed sums are rejected; the
codec, the scheme, one process through the store; and real ps-lite jobs of 2 and 4
workers, every worker's pull equal to the reference fed the same gradients. Both
quantisation tables: the uniform one (whose reference is checked against the formula
of the kernels before tables were generalised) and THC's non-uniform one
(``table='thc'``: 16 entries on a grid of 30)."""
import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'python'))

from kvx_ref import thc as ref  # noqa: E402
from kvx_ref import wire  # noqa: E402

import mxnet as mx  # noqa: E402

import kvstore_ext  # noqa: E402,F401
from kvstore_ext import chunking  # noqa: E402
from kvstore_ext.codecs import ThcCodec  # noqa: E402
from kvstore_ext.codecs import thc as thc_codec  # noqa: E402
from kvstore_ext.schemes import Thc  # noqa: E402

from test_cpp_ops import (KINDS, grad_residual, library_path, make, nd, ops,  # noqa: E402,F401
                          same_bits, status_of)
from test_dist_aggregate import JOB, job, launch, worker_gradients  # noqa: E402

f32 = np.float32
P = dict(levels=16, clamp=2.5, seed=3, block=1024)
TABLES = ('uniform', 'thc')


def params_of(table, p=P):
    """The ops' attributes (``table`` as its id) and the reference's table name."""
    if table == 'uniform':
        return dict(p, table=0)
    return dict(p, clamp=ref.THC_TABLE_CLAMP, table=1)


def ref_args(p=P):
    return p['levels'], p['clamp'], p['seed']


def ref_table(p):
    """The reference's table name of op attributes ``p``."""
    return ref.TABLES[p.get('table', 0)]


def norm_round(ops, grads, residuals):
    """Every worker's slot from the op (checked against the reference), summed."""
    workers = len(grads)
    total = np.zeros(workers, f32)
    for w, (g, r) in enumerate(zip(grads, residuals)):
        slots, status = ops.kvx_thc_norm(nd(g), nd(r), rank=w, num_workers=workers)
        want, want_status = ref.norm_slots(g, r, w, workers)
        assert status_of(status) == want_status == wire.OK
        assert same_bits(slots.asnumpy(), want)
        total += want
    return total


def ref_step(grads, residuals, norms, step, p=P):
    """The reference's job: (words of each worker, new residuals, their float32 sum,
    decoded sum)."""
    words, new_res = [], []
    for w, (g, r) in enumerate(zip(grads, residuals)):
        wd, res, status = ref.encode(g, r, norms, w, p['levels'], p['clamp'], p['seed'], step,
                                     p['block'], ref_table(p))
        assert status == wire.OK
        words.append(wd)
        new_res.append(res)
    total = np.zeros_like(words[0])
    for wd in words:
        total += wd
    out, status = ref.decode_sum(total, norms, p['levels'], p['clamp'], p['seed'], step,
                                 p['block'], grads[0].size, ref_table(p))
    assert status == wire.OK
    return words, new_res, total, out.reshape(grads[0].shape)


# ---- the kernels, bit for bit ---------------------------------------------------------

SHAPES = [(1,), (7,), (255,), (257,), (3, 5), (16, 3, 3, 3), (1000,), (5000,)]


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kind', KINDS)
def test_rotate_matches_reference(ops, shape, kind):
    x = make(shape, kind, 3)
    m = ref.norm(x)
    norms = np.array([m * f32(0.5), m], f32)      # M = the larger
    z, status = ops.kvx_thc_rotate(nd(x), nd(norms), seed=5, step=9, block=256)
    want = ref.rotate(x, m, 5, 9, 256)
    assert status_of(status) == wire.OK and same_bits(z.asnumpy(), want)
    back, status = ops.kvx_thc_unrotate(z, nd(norms), seed=5, step=9, block=256, shape=shape)
    assert status_of(status) == wire.OK
    assert same_bits(back.asnumpy().reshape(-1), ref.unrotate(want, m, 5, 9, 256, x.size))
    if m > 0 and np.isfinite(m):
        err = np.abs(back.asnumpy().astype(np.float64) - x).max()
        assert err <= 1e-5 * float(m)


@pytest.mark.parametrize('workers', [1, 3, 16])
@pytest.mark.parametrize('levels', [2, 16, 255])
def test_quantize_matches_reference(ops, workers, levels):
    z = (make((3000,), 'randn', 4) * f32(1.5)).astype(f32)
    z[:10] = [50, -50, 2.5, -2.5, 0, 3e38, -3e38, 1e30, -1e-30, 2.4999]
    for rank in (0, workers - 1):
        words, status = ops.kvx_thc_quantize(nd(z), levels=levels, clamp=2.5, seed=11, step=4,
                                             rank=rank, num_workers=workers)
        codes = ref.quantize(z, levels, 2.5, ref.dither(11, 4, rank, z.size))
        want = ref.pack(codes, ref.sum_base(levels, workers))
        assert status_of(status) == wire.OK and same_bits(words.asnumpy(), want)
        assert codes.min() >= 0 and codes.max() <= levels - 1
        assert codes[0] == levels - 1 and codes[1] == 0         # clamped to the end levels
        values, status = ops.kvx_thc_dequantize(words, levels=levels, clamp=2.5,
                                                num_workers=workers, summed=1, size=z.size)
        assert status_of(status) == wire.OK
        assert same_bits(values.asnumpy(), ref.level_sum(codes, levels, 2.5, 1))
    for bad_value in (np.nan, np.inf):       # no code for a NaN (rotate never makes one)
        bad = z.copy()
        bad[7] = bad_value
        words, status = ops.kvx_thc_quantize(nd(bad), levels=levels, clamp=2.5, seed=11,
                                             step=4, rank=0, num_workers=workers)
        assert status_of(status) == wire.NONFINITE


def old_uniform_quantize(z, levels, clamp, u):
    """The uniform quantiser as it was before tables were generalised (commit 37ceba7):
    code = floor(p) + (u < frac(p))."""
    t = f32(clamp)
    inv = f32((levels - 1) / (2.0 * float(t)))
    zc = np.clip(np.asarray(z, f32), -t, t).astype(f32)
    p = np.minimum(((zc + t).astype(f32) * inv).astype(f32), f32(levels - 1))
    lo = np.floor(p)
    return lo.astype(np.int64) + (np.asarray(u, f32) < (p - lo).astype(f32))


@pytest.mark.parametrize('levels', [2, 3, 16, 255])
def test_uniform_table_unchanged(ops, levels):
    """The generalised reference and kernels with the uniform table give the codes of
    the quantiser before tables: the same digits, words and level values."""
    z = (make((5000,), 'randn', 8) * f32(1.5)).astype(f32)
    z[:8] = [50, -50, 2.5, -2.5, 0, 2.4999, -2.4999, 1e-30]
    z[8:8 + levels] = (np.arange(levels) * (5.0 / (levels - 1)) - 2.5).astype(f32)  # levels
    u = ref.dither(11, 4, 1, z.size)
    codes = old_uniform_quantize(z, levels, 2.5, u)
    assert np.array_equal(ref.quantize(z, levels, 2.5, u), codes)
    assert np.array_equal(ref.quantize(z, levels, 2.5, u, 'uniform'), codes)
    words, status = ops.kvx_thc_quantize(nd(z), levels=levels, clamp=2.5, seed=11, step=4,
                                         rank=1, num_workers=3)
    assert status_of(status) == wire.OK
    assert same_bits(words.asnumpy(), ref.pack(codes, 3 * (levels - 1) + 1))
    values = (codes * (5.0 / (levels - 1)) - 2.5).astype(f32)
    assert same_bits(ref.level_sum(codes, levels, 2.5, 1), values)


@pytest.mark.parametrize('workers', [1, 2, 3, 16])
def test_table_quantize_matches_reference(ops, workers):
    """THC's table: digits are its entries' values (0 to 30), the clamp's ends go to 0
    and 30, and the packing is sized by the grid: base 30 n + 1."""
    t = ref.THC_TABLE_CLAMP
    z = (make((3000,), 'randn', 4) * f32(1.2)).astype(f32)
    entries = np.array(ref.THC_TABLE)
    z[:9] = [50, -50, t, -t, 0, 3e38, -3e38, 1e-30, 2.1538]
    z[9:25] = (entries * (2 * t / 30) - t).astype(f32)        # on (or a hair off) entries
    for rank in (0, workers - 1):
        words, status = ops.kvx_thc_quantize(nd(z), levels=16, clamp=t, seed=11, step=4,
                                             rank=rank, num_workers=workers, table=1)
        digits = ref.quantize(z, 16, t, ref.dither(11, 4, rank, z.size), 'thc')
        base = ref.sum_base(16, workers, 'thc')
        assert base == 30 * workers + 1
        assert status_of(status) == wire.OK and same_bits(words.asnumpy(), ref.pack(digits, base))
        assert np.isin(digits, entries).all()
        assert digits[0] == 30 and digits[1] == 0 and digits[4] in (14, 16)
        assert (np.abs(np.searchsorted(entries, digits[9:25]) - np.arange(16)) <= 1).all()
        values, status = ops.kvx_thc_dequantize(words, levels=16, clamp=t, num_workers=workers,
                                                summed=1, size=z.size, table=1)
        assert status_of(status) == wire.OK
        assert same_bits(values.asnumpy(), ref.level_sum(digits, 16, t, 1, 'thc'))
    bad = z.copy()
    bad[7] = np.nan
    _, status = ops.kvx_thc_quantize(nd(bad), levels=16, clamp=t, seed=11, step=4, rank=0,
                                     num_workers=workers, table=1)
    assert status_of(status) == wire.NONFINITE


def test_table_attribute_is_checked(ops):
    """An unknown table id, or the thc table with other than 16 levels, fails the call."""
    z = nd(make((300,), 'randn', 1))
    norms = nd(np.array([10.0], f32))
    for attrs in (dict(levels=16, table=2), dict(levels=16, table=-1),
                  dict(levels=8, table=1), dict(levels=17, table=1)):
        with pytest.raises(mx.base.MXNetError):
            ops.kvx_thc_quantize(z, clamp=2.5, seed=0, step=0, rank=0, num_workers=1,
                                 **attrs)[0].wait_to_read()
        with pytest.raises(mx.base.MXNetError):
            ops.kvx_thc_encode(z, nd(np.zeros(300, f32)), norms, clamp=2.5, seed=0, block=256,
                               step=0, rank=0, **attrs)[0].wait_to_read()
        with pytest.raises(mx.base.MXNetError):
            ops.kvx_thc_decode_sum(nd(np.zeros(75, f32)), norms, clamp=2.5, seed=0, block=256,
                                   step=0, shape=(300,), **attrs)[0].wait_to_read()


def test_reference_table_rounding_is_unbiased():
    """The reference alone, both tables: over 4000 independent dithers the mean value of
    each z's digit is clamp(z) within 5 standard errors (the interval's own: width^2 / 4
    bounds its variance); rounding to the nearest entry fails the same bound."""
    rng = np.random.default_rng(12)
    for table, levels, t in (('uniform', 16, 2.5), ('thc', 16, ref.THC_TABLE_CLAMP)):
        entries = ref.table_values(levels, table)
        g = int(entries[-1])
        delta = 2 * float(f32(t)) / g
        z = rng.uniform(-t * 0.98, t * 0.98, 200).astype(f32)
        trials = 4000
        total = np.zeros(z.size)
        for _ in range(trials):
            u = ((rng.integers(0, 1 << 24, z.size)).astype(np.float64) * 2.0 ** -24).astype(f32)
            total += ref.level_sum(ref.quantize(z, levels, t, u, table), levels, t, 1, table)
        grid = (z.astype(np.float64) + float(f32(t))) / delta
        j = np.minimum(np.searchsorted(entries, np.floor(grid), side='right') - 1, levels - 2)
        lo, hi = entries[j], entries[j + 1]
        se = (hi - lo) * delta / (2 * np.sqrt(trials))
        assert (np.abs(total / trials - z) / se).max() < 5.0, table
        nearest = np.where(grid - lo < hi - grid, lo, hi) * delta - float(f32(t))
        assert (np.abs(nearest - z) / se).max() > 5.0, table


# every kind on the small shapes; 70000 elements (several blocks and a padded tail)
# with 4 workers only for Gaussian data, to keep the test fast
STEP_CASES = [(shape, kind, workers)
              for shape in [(1,), (300,), (16, 3, 3, 3), (5000,), (70000,)]
              for kind in KINDS for workers in (1, 2, 4)
              if not (workers == 4 and shape[0] == 70000 and kind != 'randn')]


@pytest.mark.parametrize('table', TABLES)
@pytest.mark.parametrize('shape, kind, workers', STEP_CASES)
def test_step_matches_reference(ops, shape, kind, workers, table):
    """Norm round, every worker's encode (words and residual), the float32 sum of the
    words in shuffled orders (exact integers, the packing of the summed digits) and the
    decode: ops equal to the reference bit for bit."""
    check_step(ops, shape, kind, workers, params_of(table))


@pytest.mark.parametrize('table', TABLES)
@pytest.mark.parametrize('workers', [2, 8])
def test_step_with_the_default_block_matches_reference(ops, workers, table):
    """Blocks of 65536 (the default) and a tail of smaller ones: the transform runs its
    low levels tile by tile and the high ones over the block; still the reference's
    butterflies, bit for bit (8 workers: 3 digits a word)."""
    check_step(ops, (70000,), 'randn', workers, params_of(table, dict(P, block=65536)))


def check_step(ops, shape, kind, workers, p):
    table = ref_table(p)
    data = [grad_residual(shape, kind, 10 * w + 1) for w in range(workers)]
    grads, residuals = [g for g, _ in data], [r for _, r in data]
    norms = norm_round(ops, grads, residuals)
    words, new_res, total, out = ref_step(grads, residuals, norms, 7, p)
    for w in range(workers):
        res = nd(residuals[w])
        got, status = ops.kvx_thc_encode(nd(grads[w]), res, nd(norms), rank=w, step=7, **p)
        assert status_of(status) == wire.OK
        assert same_bits(got.asnumpy(), words[w]) and same_bits(res.asnumpy(), new_res[w])
    # exact integer sums, whatever order the server adds in
    base = ref.sum_base(p['levels'], workers, table)
    d = ref.padded_size(grads[0].size, p['block'])
    exact = sum(wd.astype(np.int64) for wd in words)
    assert exact.max() < 2 ** 24
    for order in (range(workers), reversed(range(workers))):
        acc = np.zeros_like(total)
        for w in order:
            acc += words[w]
        assert np.array_equal(acc.astype(np.int64), exact)
    digits = [ref.unpack(wd, base, d) for wd in words]
    assert all(np.isin(dg, ref.table_values(p['levels'], table)).all() for dg in digits)
    assert np.array_equal(ref.unpack(total, base, d), sum(digits))
    got, status = ops.kvx_thc_decode_sum(nd(total), nd(norms), step=7, shape=shape, **p)
    assert status_of(status) == wire.OK and same_bits(got.asnumpy(), out)
    # error feedback: the workers' losses add up to what the sum misses
    if kind in ('randn', 'ints'):
        accs = [g + r for g, r in zip(grads, residuals)]
        own = sum(a.astype(np.float64) - r for a, r in zip(accs, new_res))
        scale = max(1.0, float(np.abs(sum(accs)).max()))
        np.testing.assert_allclose(own, out, atol=1e-5 * scale)


def test_a_non_finite_gradient_voids_the_step_in_the_engine(ops):
    """No host read decides a void step: this worker's NaN/Inf makes its norm slot NaN,
    so every worker's summed norms are NaN; an encoder that sees a NaN norm (or a
    non-finite acc) sends NaN words and keeps the residual, and the decoder gives NaN
    everywhere (VOID). The reference does the same."""
    grad, residual = grad_residual((2000,), 'randn', 5)
    norms = np.array([40.0, 41.0], f32)
    for bad in (np.nan, np.inf):
        g = grad.copy()
        g[-1] = bad
        slots, status = ops.kvx_thc_norm(nd(g), nd(residual), rank=1, num_workers=2)
        want, want_status = ref.norm_slots(g, residual, 1, 2)
        assert status_of(status) == want_status == wire.NONFINITE
        assert same_bits(slots.asnumpy(), want) and np.isnan(want[1]) and want[0] == 0
        res = nd(residual)
        words, status = ops.kvx_thc_encode(nd(g), res, nd(norms), rank=0, step=0, **P)
        assert status_of(status) == wire.NONFINITE
        assert same_bits(res.asnumpy(), residual) and np.isnan(words.asnumpy()).all()
    void_norms = np.array([40.0, np.nan], f32)
    res = nd(residual)
    words, status = ops.kvx_thc_encode(nd(grad), res, nd(void_norms), rank=0, step=0, **P)
    want_words, want_res, want_status = ref.encode(grad, residual, void_norms, 0,
                                                   *ref_args(), 0, P['block'])
    assert status_of(status) == want_status == wire.VOID
    assert same_bits(words.asnumpy(), want_words) and np.isnan(want_words).all()
    assert same_bits(res.asnumpy(), residual) and same_bits(want_res, residual)
    out, status = ops.kvx_thc_decode_sum(words, nd(void_norms), step=0, shape=(2000,), **P)
    want, want_status = ref.decode_sum(want_words, void_norms, *ref_args(), 0, P['block'],
                                       2000)
    assert status_of(status) == want_status == wire.VOID
    assert np.isnan(out.asnumpy()).all() and np.isnan(want).all()


def test_encode_rejects_bad_norms(ops):
    grad, residual = grad_residual((2000,), 'randn', 5)
    for bad_norms in ([np.inf, 1.0], [-1.0, 1.0]):
        res = nd(residual)
        words, status = ops.kvx_thc_encode(nd(grad), res, nd(np.array(bad_norms, f32)),
                                           rank=0, step=0, **P)
        assert status_of(status) == wire.BAD_PARAM and same_bits(res.asnumpy(), residual)
        assert not words.asnumpy().any()


@pytest.mark.parametrize('table', TABLES)
def test_decode_rejects_malformed_sums(ops, table):
    """Every worker-side check of a summed payload: zeros and a status (never a crash);
    a wrong length fails the call (shape inference), as for the other sum decoders."""
    n, workers = 3000, 2
    p = params_of(table)
    data = [grad_residual((n,), 'randn', w) for w in range(workers)]
    grads, residuals = [g for g, _ in data], [r for _, r in data]
    norms = norm_round(ops, grads, residuals)
    _, _, total, _ = ref_step(grads, residuals, norms, 0, p)
    base = ref.sum_base(16, workers, table)           # 31 (uniform) or 61 (thc): 4 digits
    limit = float(base) ** 4
    for word, status in [(-1.0, wire.BAD_WORD), (0.5, wire.BAD_WORD), (limit, wire.BAD_WORD),
                         (np.nan, wire.BAD_WORD), (np.inf, wire.BAD_WORD),
                         (limit - 1, wire.OK)]:
        bad = total.copy()
        bad[17] = word
        out, got = ops.kvx_thc_decode_sum(nd(bad), nd(norms), step=0, shape=(n,), **p)
        want, want_status = ref.decode_sum(bad, norms, *ref_args(p), 0, p['block'], n, table)
        assert status_of(got) == want_status == status
        assert same_bits(out.asnumpy(), want)
        if status != wire.OK:
            assert not out.asnumpy().any()
    for bad_norms in ([1.0, -1.0], [np.inf, 0.0]):
        out, got = ops.kvx_thc_decode_sum(nd(total), nd(np.array(bad_norms, f32)), step=0,
                                          shape=(n,), **p)
        assert status_of(got) == wire.BAD_PARAM and not out.asnumpy().any()
    with pytest.raises(mx.base.MXNetError):
        ops.kvx_thc_decode_sum(nd(total[:-1]), nd(norms), step=0, shape=(n,), **p)[0] \
            .wait_to_read()
    with pytest.raises(mx.base.MXNetError):            # a base beyond 2**24
        ops.kvx_thc_decode_sum(nd(total), nd(norms), step=0, shape=(n,),
                               **dict(P, levels=2 ** 24))[0].wait_to_read()


@pytest.mark.parametrize('table', TABLES)
def test_stochastic_rounding_is_unbiased(ops, table):
    """One worker, T large enough that nothing is clamped: over K steps (fresh signs and
    dither each), the mean decoded contribution must be x. Bounds, each at 5 standard
    errors (estimated from the samples): every element; the projection on x (a scale
    bias); the chi-square of all 256 elements. A 1% scale bias fails them. And the
    noise energy is the rounding variance the table gives: the sum over coordinates of
    (p - t[j]) (t[j+1] - p) (2T/g)^2, times r^2 B (the inverse transform's gain)."""
    n, steps = 256, 1500
    p = dict(params_of(table), clamp=8.0, block=256)
    entries = ref.table_values(16, table)
    g = int(entries[-1])
    x = make((n,), 'randn', 21)
    zero = nd(np.zeros(n, f32))
    m = ref.norm(x)
    norms = nd(np.array([m], f32))
    samples = np.empty((steps, n))
    largest, expected_noise = 0.0, 0.0
    for step in range(steps):
        z, _ = ops.kvx_thc_rotate(nd(x), norms, seed=p['seed'], step=step, block=256)
        largest = max(largest, float(np.abs(z.asnumpy()).max()))
        grid = (z.asnumpy().astype(np.float64) + 8.0) * g / 16.0
        j = np.minimum(np.searchsorted(entries, np.floor(grid), side='right') - 1, 14)
        expected_noise += ((grid - entries[j]) * (entries[j + 1] - grid)).sum() * (16.0 / g) ** 2
        words, status = ops.kvx_thc_encode(nd(x), zero.copy(), norms, rank=0, step=step, **p)
        out, status = ops.kvx_thc_decode_sum(words, norms, step=step, shape=(n,), **p)
        samples[step] = out.asnumpy()
    assert largest < p['clamp']                       # no clamping: E[decoded] = x exactly
    mean, se = samples.mean(axis=0), samples.std(axis=0, ddof=1) / np.sqrt(steps)
    assert (se > 0).all()

    def biased(target):
        """The three statistics of mean - target, in standard errors."""
        t = (mean - target) / se
        projection = ((mean - target) * x).sum() / np.sqrt((se ** 2 * x ** 2).sum())
        chi2 = ((t ** 2).sum() - n) / np.sqrt(2 * n)
        return np.abs(t).max(), abs(projection), chi2

    element, projection, chi2 = biased(x)
    assert element < 5.0 and projection < 5.0 and chi2 < 5.0, (element, projection, chi2)
    element, projection, chi2 = biased(x * 1.01)
    assert projection > 5.0 and chi2 > 5.0, (element, projection, chi2)
    # the noise: r^2 B = M^2 / n for one block of n = d = B
    ratio = ((samples - x) ** 2).sum() / (expected_noise * float(m) ** 2 / n)
    assert 0.95 < ratio < 1.05, ratio
    if table == 'uniform':      # about (2T/15)^2 / 6 a coordinate
        noise = (samples - x).var() / ((2 * 8.0 / 15) ** 2 / 6 * float(m) ** 2 / n)
        assert 0.5 < noise < 1.5, noise


# ---- codec, scheme, store --------------------------------------------------------------

def test_scheme_and_codec():
    scheme = Thc()
    codec = scheme.codec_for((512, 3136), np.float32)
    assert isinstance(codec, ThcCodec) and codec.levels == 16 and codec.clamp == 2.5
    assert scheme.codec_for((100,), np.float32).passthrough
    assert scheme.codec_for((512, 3136), np.float16).passthrough
    assert scheme.codec_for((32768,), np.float32).name == 'thc'
    with pytest.raises(ValueError):
        Thc(block=1000)
    with pytest.raises(ValueError):
        Thc(levels=1)
    with pytest.raises(ValueError):
        Thc(clamp=0)
    with pytest.raises(ValueError):
        Thc(q=16)
    # words: 8 bits an element for 2-4 workers at q = 16, 6 codes a word for one
    assert thc_codec.blocks(70000, 65536) == ref.blocks(70000, 65536)
    for n in (1, 255, 300, 40000, 70000):
        for workers in (1, 2, 4, 8):
            assert thc_codec.sum_words(n, 65536, 16, workers) == \
                ref.sum_words(n, 65536, 16, workers)
    assert codec.wire_words(4) == [('norm', 'sum', 4, 4),
                                   ('payload', 'sum', 512 * 3136 // 4, 512 * 3136 // 4)]
    with pytest.raises(ValueError):
        thc_codec.sum_words(10, 65536, 1025, 2 ** 14 + 1)


def test_table_scheme_and_codec():
    """table='thc': 16 levels only, its own default clamp, the table carried by chunks
    and identity, the packing sized by the grid (30), not by q - 1."""
    scheme = Thc(table='thc')
    codec = scheme.codec_for((512, 3136), np.float32)
    assert (codec.table, codec.levels, codec.clamp) == ('thc', 16, 2.1539)
    assert Thc(table='thc', clamp=2.0).codec_for((40000,), np.float32).clamp == 2.0
    assert Thc().codec_for((40000,), np.float32).clamp == 2.5          # uniform: unchanged
    assert Thc(table='uniform', clamp=3.0).codec_for((40000,), np.float32).clamp == 3.0
    assert "THC's non-uniform table" in codec.describe() and '2.1539' in codec.describe()
    assert 'uniform' in Thc().codec_for((40000,), np.float32).describe()
    chunk = codec.chunk(0, 1000)
    assert chunk.table == 'thc' and chunk.clamp == 2.1539
    assert codec.same_as(ThcCodec((512, 3136), 16, 2.1539, 0, 65536, 'thc'))
    assert not codec.same_as(ThcCodec((512, 3136), 16, 2.1539, 0, 65536, 'uniform'))
    # 4 workers: base 121, 3 digits a word (uniform: 61, 4); 2 workers: both 4
    for n in (1, 255, 300, 40000, 70000):
        for workers in (1, 2, 4, 8, 16):
            assert thc_codec.sum_words(n, 65536, 16, workers, 'thc') == \
                ref.sum_words(n, 65536, 16, workers, 'thc')
    assert codec.sum_words(4) == -(-512 * 3136 // 3)
    assert codec.sum_words(2) == 512 * 3136 // 4
    assert codec.sum_words(16) == 512 * 3136 // 2
    assert codec.wire_words(4) == [('norm', 'sum', 4, 4), ('payload', 'sum', 535211, 535211)]
    # bad parameters: clear ValueErrors at scheme creation
    for bad in (dict(table='thc', levels=8), dict(table='thc', levels=17),
                dict(table='nonuniform'), dict(table='THC'), dict(table=1)):
        with pytest.raises(ValueError, match='table|levels'):
            Thc(**bad)
    with pytest.raises(ValueError, match='levels must be 16'):
        Thc(table='thc', levels=4)
    with pytest.raises(ValueError):
        mx.kv.create('dist_sync_thc').set_gradient_compression({'table': 'thc', 'levels': 8})
    with pytest.raises(ValueError):
        ThcCodec((100,), 15, 2.0, 0, 256, 'thc')
    with pytest.raises(ValueError):
        thc_codec.sum_words(10, 65536, 16, 559241, 'thc')            # 30 n + 1 > 2**24


@pytest.mark.parametrize('table', TABLES)
def test_store_matches_reference(table):
    """One process (rank 0 of 1) through the store: outputs, residuals and the step
    count over steps, bit for bit; chunks have their own norm and step count."""
    kv = mx.kv.create('dist_sync_thc')
    params = dict(P, size_threshold=0, chunk_size=1024, table=table)
    if table == 'thc':
        del params['clamp']                      # the table's default, 2.1539
    kv.set_gradient_compression(params)
    p = dict(params_of(table), block=P['block'])
    shape = (3000,)
    codec = Thc(**params).codec_for(shape, np.float32)
    chunks = chunking.split(codec, 1024)
    assert len(chunks) == 3
    residual = np.zeros(shape, f32)
    rng = np.random.default_rng(2)
    for step in range(4):
        grad = (rng.standard_normal(shape) * 0.1).astype(f32)
        value = mx.nd.array(grad)
        kv.pushpull('w', value)
        expect = np.zeros(shape, f32)
        for chunk in chunks:
            g, r = chunk.view(grad), chunk.view(residual)
            norms, _ = ref.norm_slots(g, r, 0, 1)
            _, new_res, _, out = ref_step([g], [r], norms, step, p)
            r[...] = new_res[0]
            chunk.view(expect)[...] = out
        assert same_bits(value.asnumpy(), expect), step
        assert same_bits(kv.key_state('w').residual, residual), step
    for arrays in kv.key_state('w').chunks:
        assert arrays['step'] == 4
    stats = kv.comm_stats()
    # one worker: 6 digits a word uniform (base 16), 4 with THC's table (base 31); chunks
    # of 1000 pad to 1024: 171 or 256 words, plus one norm word a chunk and step
    assert [c.codec.size for c in chunks] == [1000] * 3
    words = {'uniform': 171, 'thc': 256}[table]
    assert stats['push_bytes'] == stats['pull_bytes'] == 4 * 4 * 3 * (words + 1)


# ---- real ps-lite jobs ---------------------------------------------------------------------

DIST_PARAMS = {'size_threshold': 100, 'chunk_size': 1024, 'block': 256}
DIST_STEPS = 3


@pytest.mark.parametrize('table', TABLES)
@pytest.mark.parametrize('workers, servers', [(2, 1), (4, 2)])
def test_dist_matches_reference(tmp_path, job_env, workers, servers, table):
    """Every worker pulls the same sums, equal bit for bit to the reference fed the same
    gradients (norm round, encode of every worker, float32 sum, decode), chunk by chunk
    and step by step; residuals too; and both directions are compressed."""
    params = dict(DIST_PARAMS, table=table)
    launch(tmp_path, job_env, workers, servers,
           [JOB, '--kvstore', 'dist_sync_thc', '--params', json.dumps(params),
            '--steps', str(DIST_STEPS), '--out', str(tmp_path)], timeout=180)
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    assert sorted(i['rank'] for i in infos) == list(range(workers))
    scheme = Thc(**params)
    p = dict(params_of(table), block=DIST_PARAMS['block'], seed=0)
    compressed = 0
    for key, shape in job.SHAPES.items():
        codec = scheme.codec_for(shape, np.float32)
        residuals = [np.zeros(shape, f32) for _ in range(workers)]
        for step in range(DIST_STEPS):
            outs = [run['out/%s/%d' % (key, step)] for run in runs]
            for out in outs[1:]:
                assert same_bits(out, outs[0]), 'workers pulled different sums'
            grads = worker_gradients(workers, step, key)
            if codec.passthrough:
                np.testing.assert_allclose(outs[0], sum(grads), rtol=1e-6, atol=1e-6)
                continue
            compressed += 1
            expect = np.zeros(shape, f32)
            for chunk in chunking.split(codec, DIST_PARAMS['chunk_size']):
                g = [chunk.view(x) for x in grads]
                r = [chunk.view(x) for x in residuals]
                norms = sum(ref.norm_slots(gw, rw, w, workers)[0]
                            for w, (gw, rw) in enumerate(zip(g, r)))
                _, new_res, _, out = ref_step(g, r, norms, step, p)
                for rw, nr in zip(r, new_res):
                    rw[...] = nr
                chunk.view(expect)[...] = out
            assert same_bits(outs[0], expect), (key, step)
            for w, run in enumerate(runs):
                assert same_bits(run['res/%s/%d' % (key, step)], residuals[w]), (key, step, w)
    assert compressed == 3 * DIST_STEPS                     # conv, fc, wide; bias is float32
    stats = infos[0]['stats']
    # 4 digits a word (8 bits a value) but THC's table at 4 workers: 3 (10.7 bits)
    shrink = 2.8 if (table, workers) == ('thc', 4) else 3
    assert stats['push_bytes'] < stats['raw_bytes'] / shrink
    assert stats['pull_bytes'] < stats['raw_bytes'] / shrink
