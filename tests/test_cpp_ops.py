"""Differential tests: the C++ operators of libkvx_ops.so against the NumPy reference.

Every op runs through MXNet (mx.library.load + mx.nd.kvx_*) on random and awkward
tensors, and its payloads, residuals and decodes must equal python/kvx_ref's bit for bit.
The one quantity not compared bit for bit is the adaptive ternary threshold t (a float64
sum whose order is an implementation detail): t is compared with rtol 1e-6, then the
payload is compared exactly with the reference encoded at that t.

The library comes from $KVX_OPS_LIB, else the installed package's (see the ``ops`` fixture).
"""
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'python'))

from kvx_ref import codecs as ref  # noqa: E402
from kvx_ref import wire  # noqa: E402

import mxnet as mx  # noqa: E402

f32 = np.float32


# ---- fixtures and helpers ----------------------------------------------------------

@pytest.fixture(scope='session')
def library_path():
    """The plugin under test: $KVX_OPS_LIB, else the one kvstore_ext loads (installed)."""
    path = os.environ.get('KVX_OPS_LIB')
    if not path:
        from kvstore_ext import _lib
        path = _lib.library_path()
    assert os.path.isfile(path), 'plugin %s does not exist' % path
    return os.path.abspath(path)


TEST_LIBRARY = 'libkvx_test_ops.so'


def _test_ops_library(library_path):
    """The operators only tests use (the per-codec decoders, THC's pieces, ...), a
    library of their own built and installed next to the plugin (CMake KVX_TEST_OPS):
    $KVX_TEST_OPS_LIB, else the one beside the plugin."""
    path = os.environ.get('KVX_TEST_OPS_LIB') or os.path.join(
        os.path.dirname(library_path), TEST_LIBRARY)
    assert os.path.isfile(path), 'test library %s does not exist (make install)' % path
    return os.path.abspath(path)


@pytest.fixture(scope='session')
def ops(library_path):
    """mx.nd with the kvx_* operators of the plugin and of the test library registered
    (each library is loaded once)."""
    if not hasattr(mx.nd, 'kvx_fp32_encode'):
        mx.library.load(library_path, verbose=False)
    if not hasattr(mx.nd, 'kvx_fp32_decode'):
        mx.library.load(_test_ops_library(library_path), verbose=False)
    return mx.nd


def nd(x):
    return mx.nd.array(x, dtype=x.dtype)


def same_bits(a, b):
    """Exact equality, distinguishing -0.0 from +0.0 and comparing NaN payload bits."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(a.view(view), b.view(view))


def status_of(s):
    return int(s.asnumpy()[0])


def make(shape, kind, seed):
    """Awkward tensors: random, zeros, huge/tiny magnitudes, mixed, integers (ties)."""
    rng = np.random.default_rng(seed)
    if kind == 'randn':
        return rng.standard_normal(shape).astype(f32)
    if kind == 'zeros':
        return np.zeros(shape, f32)
    if kind == 'huge':
        return (rng.standard_normal(shape) * 1e30).astype(f32)
    if kind == 'tiny':
        return (rng.standard_normal(shape) * 1e-30).astype(f32)
    if kind == 'mixed':
        return (rng.standard_normal(shape) * 10.0 ** rng.integers(-20, 20, shape)).astype(f32)
    if kind == 'ints':   # small integers: many equal values and equal filter scores
        return rng.integers(-2, 3, shape).astype(f32)
    raise ValueError(kind)


def grad_residual(shape, kind, seed):
    grad = make(shape, kind, seed)
    residual = (make(shape, kind, seed + 1) * f32(0.25)).astype(f32)
    return grad, residual


KINDS = ['randn', 'zeros', 'huge', 'tiny', 'mixed', 'ints']


# ---- fp32 ----------------------------------------------------------------------------

@pytest.mark.parametrize('shape', [(1,), (7,), (3, 5), (16, 3, 3, 3)])
@pytest.mark.parametrize('kind', KINDS)
def test_fp32_roundtrip(ops, shape, kind):
    grad = make(shape, kind, 1)
    payload, status = ops.kvx_fp32_encode(nd(grad))
    want, want_status = ref.fp32_encode(grad)
    assert status_of(status) == want_status == 0
    assert same_bits(payload.asnumpy(), want)
    n = grad.size
    out, status = ops.kvx_fp32_decode(payload, size=n)
    assert status_of(status) == 0 and same_bits(out.asnumpy(), ref.fp32_decode(want, n)[0])
    out, status = ops.kvx_fp32_decode(payload, shape=shape)
    assert out.shape == shape and same_bits(out.asnumpy().reshape(-1), grad.reshape(-1))
    acc = make(shape, 'randn', 2)
    acc_nd = nd(acc)
    assert status_of(ops.kvx_fp32_decode_add(payload, acc_nd)) == 0
    assert same_bits(acc_nd.asnumpy(), acc + grad)


def test_finite_check(ops):
    x = make((5, 7), 'randn', 3)
    assert status_of(ops.kvx_finite_check(nd(x))) == 0
    for bad in [np.nan, np.inf, -np.inf]:
        y = x.copy()
        y[4, 6] = bad
        assert status_of(ops.kvx_finite_check(nd(y))) == wire.NONFINITE


@pytest.mark.parametrize('rows, cols, rank', [(1, 1, 1), (7, 300, 4), (64, 33, 2)])
@pytest.mark.parametrize('status, writes', [(0.0, True), (1.0, False), (9.0, False),
                                            (np.nan, False)])
def test_lowrank_residual(ops, rows, cols, rank, status, writes):
    """PowerSGD's residual acc - p q^T, bit for bit the float32 products added in rank
    order, written only if status is 0 (a void step keeps the residual as it was, NaN
    status included)."""
    acc, p, q = make((rows, cols), 'randn', 4), make((rows, rank), 'randn', 5), \
        make((cols, rank), 'randn', 6)
    residual = make((rows * cols,), 'randn', 7)
    product = p[:, :1] * q[:, 0]
    for k in range(1, rank):
        product = product + p[:, k:k + 1] * q[:, k]
    res_nd = nd(residual)
    ops.kvx_lowrank_residual(nd(acc), res_nd, nd(p), nd(q),
                             nd(np.array([status], np.float32))).wait_to_read()
    want = (acc - product).reshape(-1) if writes else residual
    assert same_bits(res_nd.asnumpy(), want)
    if writes:
        np.testing.assert_allclose(res_nd.asnumpy().reshape(rows, cols), acc - p @ q.T,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('shapes', [((4, 5), (20,), (3, 2), (5, 2), (1,)),
                                    ((4, 5), (20,), (4, 2), (5, 3), (1,)),
                                    ((4, 5), (21,), (4, 2), (5, 2), (1,)),
                                    ((4, 5), (20,), (4, 2), (5, 2), (2,)),
                                    ((20,), (20,), (4, 2), (5, 2), (1,))])
def test_lowrank_residual_shapes(ops, shapes):
    arrays = [nd(make(s, 'randn', i)) for i, s in enumerate(shapes)]
    with pytest.raises(mx.base.MXNetError, match='kvx_lowrank_residual'):
        ops.kvx_lowrank_residual(*arrays).wait_to_read()


# ---- float16 (dist_sync_fp16) ----------------------------------------------------------

def _float16_edge_values():
    """Every finite float16, the midpoints between neighbours (ties go to the even one)
    and the float32 values either side of each midpoint, both signs, plus random float32
    bit patterns up to 65504 (float16's subnormals and float32's included)."""
    finite = np.arange(0, 0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mid = ((finite[:-1] + finite[1:]) / 2).astype(f32)
    rng = np.random.default_rng(7)
    patterns = rng.integers(0, 0x477fe001, 200000, dtype=np.uint32).view(f32)
    values = np.concatenate([finite.astype(f32), mid, np.nextafter(mid, f32(0)),
                             np.nextafter(mid, f32(np.inf)), patterns])
    return np.concatenate([values, -values])


def test_fp16_round_is_numpys(ops):
    """kvx_fp16_round rounds as NumPy's astype(float16): nearest, ties to even, float16
    subnormals, -0.0, bit for bit."""
    x = _float16_edge_values()
    half, status = ops.kvx_fp16_round(nd(x), limit=65504.0)
    assert half.dtype == np.float16 and status_of(status) == 0
    assert same_bits(half.asnumpy(), x.astype(np.float16))


def test_fp16_widen_is_exact(ops):
    """kvx_fp16_widen: every float16 (subnormals, Inf, NaN, both zeros) to float32 as
    NumPy widens it, bit for bit; shape kept."""
    every = np.arange(0, 0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    out = ops.kvx_fp16_widen(mx.nd.array(every.reshape(256, 256), dtype=np.float16))
    assert out.dtype == np.float32 and out.shape == (256, 256)
    assert same_bits(out.asnumpy().reshape(-1), every.astype(f32))
    with pytest.raises(mx.base.MXNetError, match='float16'):
        ops.kvx_fp16_widen(nd(make((4,), 'randn', 1))).wait_to_read()


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('num_workers', [1, 3, 8])
def test_fp16_encode_matches_reference(ops, kind, num_workers):
    """Halves and residual bit for bit the reference's (clip at the workers' limit)."""
    grad, residual = grad_residual((64, 33), kind, 20 + num_workers)
    want_half, want_res, want_status = ref.fp16_encode(grad, residual, num_workers)
    res_nd = nd(residual)
    half, status = ops.kvx_fp16_encode(nd(grad), res_nd,
                                       limit=float(ref.fp16_limit(num_workers)))
    assert status_of(status) == want_status == 0
    assert half.shape == grad.shape and same_bits(half.asnumpy(), want_half)
    assert same_bits(res_nd.asnumpy(), want_res)
    plain, status = ops.kvx_fp16_round(nd(grad), limit=float(ref.fp16_limit(num_workers)))
    assert same_bits(plain.asnumpy(), ref.fp16_encode_plain(grad, num_workers)[0])


@pytest.mark.parametrize('where', ['grad', 'residual', 'sum'])
@pytest.mark.parametrize('value', [np.nan, np.inf, -np.inf])
def test_fp16_encode_nonfinite_voids(ops, where, value):
    """A NaN or Inf in grad, in the residual, or an acc that overflows float32: every half
    NaN (the workers' sum is void), the residual bit for bit as it was, status 1."""
    grad, residual = make((50,), 'randn', 1), make((50,), 'randn', 2)
    if where == 'sum':
        grad[7], residual[7] = 3e38 * np.sign(value), 3e38 * np.sign(value)
        if np.isnan(value):
            grad[7], residual[7] = 3e38, 3e38
    else:
        {'grad': grad, 'residual': residual}[where][7] = value
    res_nd = nd(residual)
    half, status = ops.kvx_fp16_encode(nd(grad), res_nd, limit=65504.0)
    assert status_of(status) == 1
    assert np.isnan(half.asnumpy()).all()
    assert same_bits(res_nd.asnumpy(), residual)
    if where == 'grad':
        half, status = ops.kvx_fp16_round(nd(grad), limit=65504.0)
        assert status_of(status) == 1 and np.isnan(half.asnumpy()).all()


@pytest.mark.parametrize('attrs, match', [
    ({}, 'limit'), ({'limit': 0.0}, 'limit'), ({'limit': -1.0}, 'limit'),
    ({'limit': 70000.0}, '65504'), ({'limit': 1.0, 'scale': 2.0}, 'scale')])
def test_fp16_encode_refuses_bad_limits(ops, attrs, match):
    with pytest.raises(mx.base.MXNetError, match=match):
        ops.kvx_fp16_encode(nd(make((4,), 'randn', 1)), nd(make((4,), 'randn', 2)),
                            **attrs)[0].wait_to_read()


def test_fp16_encode_refuses_bad_inputs(ops):
    with pytest.raises(mx.base.MXNetError, match='kvx_fp16_encode'):
        ops.kvx_fp16_encode(nd(make((4,), 'randn', 1)), nd(make((5,), 'randn', 2)),
                            limit=1.0)[0].wait_to_read()
    with pytest.raises(mx.base.MXNetError, match='float32'):
        ops.kvx_fp16_round(nd(make((4,), 'randn', 1).astype(np.float64)),
                           limit=1.0)[0].wait_to_read()


# ---- top-k -----------------------------------------------------------------------------

TOPK_SHAPES = [(1, 1), (7,), (10, 3), (16, 8, 3, 3), (64, 3, 5, 5), (3, 20000)]


def ks_for(o):
    return sorted({1, max(1, o // 3), o})


@pytest.mark.parametrize('shape', TOPK_SHAPES)
@pytest.mark.parametrize('kind', KINDS)
def test_topk_encode_decode(ops, shape, kind):
    o = shape[0]
    n = int(np.prod(shape))
    for k in ks_for(o):
        grad, residual = grad_residual(shape, kind, 10 + k)
        want, want_res, want_status = ref.topk_encode(grad, residual, k)
        res_nd = nd(residual)
        payload, status = ops.kvx_topk_encode(nd(grad), res_nd, k=k)
        assert status_of(status) == want_status == 0
        assert same_bits(payload.asnumpy(), want), (shape, kind, k)
        assert same_bits(res_nd.asnumpy(), want_res)
        out, status = ops.kvx_topk_decode(payload, shape=shape)
        want_out, _ = ref.topk_decode(want, n)
        assert status_of(status) == 0 and out.shape == shape
        assert same_bits(out.asnumpy().reshape(-1), want_out)
        acc = make(shape, 'randn', 5)
        acc_nd = nd(acc)
        assert status_of(ops.kvx_topk_decode_add(payload, acc_nd)) == 0
        # The op adds to the sent filters only, so -0.0 elsewhere stays -0.0: compare by ==.
        assert np.array_equal(acc_nd.asnumpy(), acc + want_out.reshape(shape))


def test_topk_ties_and_equal_filters(ops):
    """Equal scores resolve to the lower index: permuted copies of one filter, zeros."""
    rng = np.random.default_rng(4)
    base = rng.integers(-3, 4, 12).astype(f32)   # integer squares: sums exact in any order
    grad = np.stack([rng.permutation(base) for _ in range(9)]).astype(f32)   # equal norms
    for g in [grad, np.zeros((9, 12), f32), np.ones((9, 12), f32)]:
        for k in [1, 4, 9]:
            residual = np.zeros_like(g)
            res_nd = nd(residual)
            payload, _ = ops.kvx_topk_encode(nd(g), res_nd, k=k)
            want, want_res, _ = ref.topk_encode(g, residual, k)
            assert same_bits(payload.asnumpy(), want)
            assert list(payload.asnumpy()[8:8 + k]) == list(range(k))


@pytest.mark.parametrize('kind', KINDS)
def test_filter_scores(ops, kind):
    for shape in TOPK_SHAPES:
        x = make(shape, kind, 6)
        got = ops.kvx_filter_scores(nd(x)).asnumpy()
        assert same_bits(got, ref.filter_scores(x).astype(f32))


@pytest.mark.parametrize('kind', KINDS)
def test_acc_statistics(ops, kind):
    """The agreement statistics of acc = grad + residual, without forming acc: the same
    bits as the reference applied to acc (float32 sum, then float64 accumulation)."""
    for shape in TOPK_SHAPES + [(5000,), (3, 1000)]:
        grad, residual = grad_residual(shape, kind, 80)
        acc = grad + residual
        got = ops.kvx_acc_abs_sum(nd(grad), nd(residual)).asnumpy()
        assert same_bits(got, np.array([np.abs(acc.astype(np.float64)).sum()], f32)), shape
        if len(shape) > 1:
            got = ops.kvx_acc_filter_scores(nd(grad), nd(residual)).asnumpy()
            assert same_bits(got, ref.filter_scores(acc).astype(f32)), shape


@pytest.mark.parametrize('shape', [(1, 1), (10, 3), (16, 8, 3, 3), (64, 3, 5, 5)])
@pytest.mark.parametrize('kind', ['randn', 'zeros', 'mixed'])
def test_topk_gather_scatter(ops, shape, kind):
    o = shape[0]
    for k in ks_for(o):
        grad, residual = grad_residual(shape, kind, 20 + k)
        idx = ref.topk_select(ref.filter_scores(grad + residual), k)
        res_nd = nd(residual)
        values, status = ops.kvx_topk_gather(nd(grad), res_nd, nd(idx.astype(f32)))
        want_values, want_res, want_status = ref.topk_gather(grad, residual, idx)
        assert status_of(status) == want_status == 0
        assert same_bits(values.asnumpy(), want_values)
        assert same_bits(res_nd.asnumpy(), want_res)
        # Summed values of several workers scatter like the reference.
        summed = (want_values * 3).astype(f32)
        out, status = ops.kvx_topk_scatter(nd(summed), nd(idx.astype(f32)), shape=shape)
        want_out, want_status = ref.topk_scatter(summed, idx, shape)
        assert status_of(status) == want_status == 0
        assert same_bits(out.asnumpy(), want_out)


@pytest.mark.parametrize('bad', [[1, 1], [3, 2], [-1, 2], [0, 10], [0.5, 2], [np.nan, 2],
                                 [1, np.inf], [-np.inf, 2], [1e30, 2]])
def test_topk_gather_scatter_bad_indices(ops, bad):
    grad, residual = grad_residual((10, 3), 'randn', 7)
    idx = np.array(bad, f32)
    res_nd = nd(residual)
    values, status = ops.kvx_topk_gather(nd(grad), res_nd, nd(idx))
    want_values, want_res, want_status = ref.topk_gather(grad, residual, idx)
    assert status_of(status) == want_status == wire.BAD_INDEX
    assert same_bits(res_nd.asnumpy(), residual) and same_bits(want_res, residual)
    # a void payload (first word NaN, as every failing encoder's): the sum is void
    assert same_bits(values.asnumpy(), want_values)
    assert np.isnan(want_values[0]) and not want_values[1:].any()
    out, status = ops.kvx_topk_scatter(nd(np.ones(6, f32)), nd(idx), shape=(10, 3))
    want_out, want_status = ref.topk_scatter(np.ones(6, f32), idx, (10, 3))
    assert status_of(status) == want_status == wire.BAD_INDEX
    assert same_bits(out.asnumpy(), want_out) and not want_out.any()


def test_topk_gather_bad_indices_before_nonfinite():
    """Index checks come first: bad indices and a NaN gradient give BAD_INDEX."""
    grad, residual = grad_residual((10, 3), 'randn', 8)
    grad[2, 1] = np.nan
    assert ref.topk_gather(grad, residual, np.array([4, 4]))[2] == wire.BAD_INDEX
    assert ref.topk_gather(grad, residual, np.array([2, 4]))[2] == wire.NONFINITE


def test_topk_scatter_reference_params():
    """The reference's scatter: values of the wrong length, more indices than filters."""
    assert ref.topk_scatter(np.ones(5, f32), np.array([1, 2]), (4, 3))[1] == wire.BAD_PARAM
    assert ref.topk_scatter(np.ones(15, f32), np.arange(5), (4, 3))[1] == wire.BAD_PARAM
    out, status = ref.topk_scatter(np.zeros(0, f32), np.zeros(0), (4, 3))
    assert status == wire.OK and out.shape == (4, 3) and not out.any()


# ---- ternary --------------------------------------------------------------------------

TERNARY_SHAPES = [(1,), (14,), (15,), (16,), (31,), (7, 11), (1000,), (64, 3, 3, 3), (12345,)]


def check_ternary(ops, grad, residual, scale, threshold):
    """Encode with the op; compare with the reference at the op's t (see module doc)."""
    res_nd = nd(residual)
    payload, status = ops.kvx_ternary_encode(nd(grad), res_nd, scale=scale, threshold=threshold)
    assert status_of(status) == 0
    got = payload.asnumpy()
    t = got[5]
    if threshold > 0:
        assert t == f32(threshold)
    else:
        want_t = ref.capped_threshold((grad + residual).astype(f32), scale)[0]
        assert np.isclose(t, want_t, rtol=1e-6, atol=0), (t, want_t)
        threshold = float(t)   # the reference with t fixed to the op's t
    want, want_res, want_status = ref.ternary_encode(grad, residual, scale, threshold)
    assert want_status == 0
    assert same_bits(got, want)
    assert same_bits(res_nd.asnumpy(), want_res)
    return payload, want


@pytest.mark.parametrize('shape', TERNARY_SHAPES)
@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('scale,threshold', [(1.0, 0.0), (0.5, 0.0), (2.5, 0.0), (1.0, 0.3)])
def test_ternary_encode_decode(ops, shape, kind, scale, threshold):
    grad, residual = grad_residual(shape, kind, 30)
    n = grad.size
    payload, want = check_ternary(ops, grad, residual, scale, threshold)
    out, status = ops.kvx_ternary_decode(payload, shape=shape)
    want_out, _ = ref.ternary_decode(want, n)
    assert status_of(status) == 0 and out.shape == shape
    assert same_bits(out.asnumpy().reshape(-1), want_out)
    acc = make(shape, 'randn', 31)
    acc_nd = nd(acc)
    assert status_of(ops.kvx_ternary_decode_add(payload, acc_nd)) == 0
    assert same_bits(acc_nd.asnumpy(), (acc + want_out.reshape(shape)).astype(f32))


@pytest.mark.parametrize('shape', TERNARY_SHAPES)
@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('scale,threshold', [(2.0, 0.0), (1.0, 0.3)])
def test_ternary_encode_value_rule(ops, shape, kind, scale, threshold):
    """value_rule 2: codes as with v = t, the header's value (and the residual) is 2t
    ('round'); the plain decoder reads it."""
    value = 'round'
    grad, residual = grad_residual(shape, kind, 32)
    res_nd = nd(residual)
    rule = ref.TERNARY_VALUES[value]
    payload, status = ops.kvx_ternary_encode(nd(grad), res_nd, scale=scale, threshold=threshold,
                                             value_rule=rule)
    assert status_of(status) == 0
    got = payload.asnumpy()
    plain, _ = ops.kvx_ternary_encode(nd(grad), nd(residual), scale=scale, threshold=threshold)
    t = float(plain.asnumpy()[5])
    assert same_bits(got[8:], plain.asnumpy()[8:])          # the same codes
    # the delivery cap decided t: a code stands for t under every rule
    capped = threshold == 0 and ref.capped_threshold((grad + residual).astype(f32), scale)[1]
    assert got[5] == (np.float32(t) if capped else np.float32(2 * t))
    want, want_res, want_status = ref.ternary_encode(grad, residual, scale,
                                                     0.0 if capped else t, value=value)
    assert want_status == 0
    assert same_bits(got, want)
    assert same_bits(res_nd.asnumpy(), want_res)
    out, status = ops.kvx_ternary_decode(payload, shape=shape)
    want_out, _ = ref.ternary_decode(want, grad.size)
    assert status_of(status) == 0 and same_bits(out.asnumpy().reshape(-1), want_out)


EQUAL_KINDS = ['constant', 'sign', 'one', 'two', 'randn']


def equal_magnitudes(kind, seed):
    """Tensors whose magnitudes are all equal (or nearly: 'two'), where the delivery
    cap decides t, and a random one, where it does not."""
    rng = np.random.default_rng(seed)
    if kind == 'constant':
        return np.full((300, 200), 0.5, f32)
    if kind == 'sign':
        return rng.choice(f32([-1, 1]), size=(1000,))
    if kind == 'one':
        return np.array([-3.0], f32)
    if kind == 'two':
        return np.array([1.0, -0.25], f32)
    return rng.standard_normal((7, 11)).astype(f32)


@pytest.mark.parametrize('kind', EQUAL_KINDS)
@pytest.mark.parametrize('value', ['t', 'round'])
@pytest.mark.parametrize('scale', [0.5, 2.0, 4.0])
def test_ternary_encode_delivery_cap(ops, kind, value, scale):
    """Adaptive t capped at max|acc| (capped: v = t): the op and the reference agree bit
    for bit over several steps of error feedback, and a step whose acc is not all zero
    gives the largest |acc| a code."""
    grad = equal_magnitudes(kind, 40)
    residual = np.zeros_like(grad)
    res_nd = nd(residual)
    rule = ref.TERNARY_VALUES[value]
    for step in range(4):
        acc = (grad + residual).astype(f32)
        payload, status = ops.kvx_ternary_encode(nd(grad), res_nd, scale=scale,
                                                 value_rule=rule)
        want, residual, want_status = ref.ternary_encode(grad, residual, scale, value=value)
        assert status_of(status) == want_status == 0
        assert same_bits(payload.asnumpy(), want), step
        assert same_bits(res_nd.asnumpy(), residual), step
        out, _ = ref.ternary_decode(want, grad.size)
        top = np.abs(acc.reshape(-1)) == np.abs(acc).max()
        assert np.all(np.sign(out[top]) == np.sign(acc.reshape(-1)[top])), step
    assert same_bits(ops.kvx_acc_abs_max(nd(grad), nd(residual)).asnumpy(),
                     np.array([ref.acc_abs_max(grad + residual)], f32))


def test_acc_abs_max_nonfinite(ops):
    """NaN if some acc is NaN, else Inf if some is infinite: the homomorphic cap of a
    worker's bad step is not finite, and the agreement falls back to t = 0."""
    zeros = nd(np.zeros(3, f32))
    got = ops.kvx_acc_abs_max(nd(np.array([1, -np.inf, 2], f32)), zeros).asnumpy()
    assert got[0] == np.inf
    got = ops.kvx_acc_abs_max(nd(np.array([1, np.nan, -np.inf], f32)), zeros).asnumpy()
    assert np.isnan(got[0])


def test_ternary_encode_value_rule_checked(ops):
    """An unknown rule is refused at the op, 1 (a former rule) too; 2t beyond float32 is
    NONFINITE for an adaptive t (residual untouched)."""
    grad, residual = grad_residual((100,), 'randn', 34)
    for rule in (1, 3):
        with pytest.raises(mx.base.MXNetError, match='value_rule'):
            ops.kvx_ternary_encode(nd(grad), nd(residual), scale=2.0, value_rule=rule)
    # a servers' reply request naming rule 1 (its c word) is refused the same way, and
    # no codec takes the former rule's name
    from kvstore_ext.codecs import AdditiveTernaryCodec, TernaryCodec
    from kvstore_ext.replies import reencode
    with pytest.raises(mx.base.MXNetError, match='value_rule'):
        reencode(nd(grad), nd(residual), (wire.TERNARY, 100, 2.0, 0.0, 1.0))
    for codec in (TernaryCodec, AdditiveTernaryCodec):
        with pytest.raises(ValueError, match="value must be one of \\('t', 'round'\\)"):
            codec((100,), 2.0, value='mean')
    with pytest.raises(ValueError, match='value must be'):
        ref.ternary_encode(grad, residual, 2.0, value='mean')
    # t = 1.9 * 1.5e38 < max|acc| = 3e38 (the delivery cap does not decide), 2t overflows
    big = np.concatenate([np.full(50, 3e38, f32), np.zeros(50, f32)])
    res_nd = nd(np.zeros(100, f32))
    _, status = ops.kvx_ternary_encode(nd(big), res_nd, scale=1.9, value_rule=2)
    _, _, want_status = ref.ternary_encode(big, np.zeros(100, f32), 1.9, value='round')
    assert status_of(status) == want_status == wire.NONFINITE
    assert not res_nd.asnumpy().any()


def test_ternary_encode_sum_value(ops):
    """value > 0: selection by threshold, the residual keeps acc - code * value."""
    grad, residual = grad_residual((1000,), 'randn', 33)
    res_nd = nd(residual)
    words, status = ops.kvx_ternary_encode_sum(nd(grad), res_nd, threshold=1.0, num_workers=4,
                                                value=1.75)
    want, want_res, want_status = ref.ternary_encode_sum(grad, residual, 1.0, 4, value=1.75)
    assert status_of(status) == want_status == 0
    assert same_bits(words.asnumpy(), want) and same_bits(res_nd.asnumpy(), want_res)


@pytest.mark.parametrize('case', ['huge_acc', 'huge_scale'])
def test_adaptive_threshold_overflow(ops, case):
    """t = scale * mean|acc| beyond float32's range: NONFINITE, nothing sent, residual kept."""
    if case == 'huge_acc':
        grad, residual, scale = np.full(40, 3e38, f32), np.zeros(40, f32), 2.0
    else:
        grad, residual = grad_residual((40,), 'randn', 90)
        scale = 1e300
    res_nd = nd(residual)
    payload, status = ops.kvx_ternary_encode(nd(grad), res_nd, scale=scale)
    want, want_res, want_status = ref.ternary_encode(grad, residual, scale)
    assert status_of(status) == want_status == wire.NONFINITE
    assert same_bits(res_nd.asnumpy(), residual) and same_bits(want_res, residual)
    words = payload.asnumpy()    # void (set_encoded); the reference zeroes the payload
    assert np.isnan(words[0]) and not words[1:].any() and not want.any()
    # Just inside the range: ok, t = 3e38.
    payload, status = ops.kvx_ternary_encode(nd(np.full(40, 3e38, f32)), nd(np.zeros(40, f32)))
    assert status_of(status) == 0 and payload.asnumpy()[5] == f32(3e38)


def test_reference_rejects_bad_encoder_params():
    """Parameters are the caller's: the reference raises (the kernels return BAD_PARAM)."""
    grad, residual = grad_residual((20,), 'randn', 91)
    for scale, threshold in [(-1.0, 0.0), (np.nan, 0.0), (1.0, -0.5), (1.0, 1e39), (1.0, np.inf)]:
        with pytest.raises(ValueError):
            ref.ternary_encode(grad, residual, scale, threshold)
    for threshold, workers in [(1e39, 2), (-1.0, 2), (np.nan, 2), (0.5, 0), (0.5, 2 ** 20 + 1)]:
        with pytest.raises(ValueError):
            ref.ternary_encode_sum(grad, residual, threshold, workers)
    with pytest.raises(ValueError):
        ref.twobit_encode(grad, residual, 1e39)


def test_adaptive_threshold_is_numpy_exact(ops):
    """Stronger than the rtol check above: the C++ float64 sum reproduces NumPy's order
    (8192-element chunks, pairwise inside), so t is bit-identical for contiguous input."""
    for n in [1, 7, 8, 129, 8191, 8192, 8193, 20000, 100003]:
        grad, residual = grad_residual((n,), 'mixed', n)
        payload, _ = ops.kvx_ternary_encode(nd(grad), nd(residual), scale=1.0)
        assert payload.asnumpy()[5] == ref.adaptive_threshold((grad + residual).astype(f32), 1.0)


SUM_DIGITS = {1: 15, 2: 10, 3: 8, 4: 7, 7: 6, 8: 5, 16: 4}   # (2n+1)**D <= 2**24


def test_sum_digits_per_float32_word():
    for workers, d in SUM_DIGITS.items():
        base = 2 * workers + 1
        assert wire.digits_per_word(base, f32) == d
        assert base ** d <= 2 ** 24 < base ** (d + 1)
        assert ref.sum_words(10 * d + 1, workers) == 11


@pytest.mark.parametrize('num_workers', [1, 2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize('shape', [(1,), (4,), (7,), (16,), (17,), (33,), (9, 11), (1000,),
                                   (40000,)])
def test_ternary_sum(ops, num_workers, shape):
    t = 0.4
    n = int(np.prod(shape))
    total = None
    for w in range(num_workers):
        grad, residual = grad_residual(shape, 'randn', 100 * w + n)
        res_nd = nd(residual)
        words, status = ops.kvx_ternary_encode_sum(nd(grad), res_nd, threshold=t,
                                                   num_workers=num_workers)
        want, want_res, want_status = ref.ternary_encode_sum(grad, residual, t, num_workers)
        assert status_of(status) == want_status == 0
        assert words.dtype == np.float32 and want.dtype == np.float32
        assert words.size == -(-n // SUM_DIGITS[num_workers])
        assert same_bits(words.asnumpy(), want)
        assert same_bits(res_nd.asnumpy(), want_res)
        total = want if total is None else (total + want).astype(f32)   # float32, as the server
    out, status = ops.kvx_ternary_decode_sum(nd(total), threshold=t, num_workers=num_workers,
                                             shape=shape)
    want_out, want_status = ref.ternary_decode_sum(total, t, num_workers, n)
    assert status_of(status) == want_status == 0
    assert out.shape == shape
    assert same_bits(out.asnumpy().reshape(-1), want_out)


@pytest.mark.parametrize('num_workers', [1, 2, 3, 4, 8, 16])
def test_ternary_sum_any_order_is_exact(ops, num_workers):
    """The server adds float32 words in whatever order pushes arrive.  Every order (here:
    random permutations, accumulated in np.float32, sequentially and as a pairwise tree)
    must give exactly the packing of the summed codes + n, and decode to their sum * t.
    Random codes, and the extremes where every code is +1 (largest words) or -1."""
    rng = np.random.default_rng(num_workers)
    t = f32(0.5)
    d = SUM_DIGITS[num_workers]
    n = 50 * d + 3
    base = ref.sum_base(num_workers)
    for pattern in ['random', 'all_plus', 'all_minus']:
        payloads, codes = [], np.zeros(n, np.int64)
        for w in range(num_workers):
            grad = rng.standard_normal(n).astype(f32)
            if pattern != 'random':
                grad[:] = 5.0 if pattern == 'all_plus' else -5.0
            residual = np.zeros(n, f32)
            words, status = ops.kvx_ternary_encode_sum(nd(grad), nd(residual), threshold=t,
                                                       num_workers=num_workers)
            assert status_of(status) == 0
            payloads.append(words.asnumpy())
            codes += ref.ternary_codes(grad, t)
        packed = wire.pack_digits(codes + num_workers, base, f32)
        assert packed.max() < 2 ** 24
        if pattern == 'all_plus':
            assert (packed[:-1] == base ** d - 1).all()   # the largest word there is
        for _ in range(10):
            order = rng.permutation(num_workers)
            total = np.zeros_like(payloads[0])
            for w in order:
                total = (total + payloads[w]).astype(f32)
            assert same_bits(total, packed), (pattern, order)
            level = [payloads[w] for w in order]
            while len(level) > 1:
                pairs = [(level[i] + level[i + 1]).astype(f32) for i in range(0, len(level) - 1, 2)]
                level = pairs + level[len(level) - len(level) % 2:]
            assert same_bits(level[0], packed)
        out, status = ops.kvx_ternary_decode_sum(nd(packed), threshold=float(t),
                                                 num_workers=num_workers, shape=(n,))
        assert status_of(status) == 0
        want, want_status = ref.ternary_decode_sum(packed, t, num_workers, n)
        assert want_status == 0
        assert same_bits(out.asnumpy(), want)
        assert same_bits(want, (codes.astype(f32) * t).astype(f32))


# words, expected status of ternary_decode_sum (4 workers: base 9, 7 digits a word, n = 20)
_LIMIT = 9.0 ** 7
BAD_SUMS = [
    ([5.0, 0.5, 5.0], wire.BAD_WORD),
    ([5.0, -1.0, 5.0], wire.BAD_WORD),
    ([5.0, _LIMIT, 5.0], wire.BAD_WORD),
    ([5.0, _LIMIT + 1, 5.0], wire.BAD_WORD),
    ([5.0, 2.0 ** 24, 5.0], wire.BAD_WORD),
    ([5.0, np.nan, 5.0], wire.BAD_WORD),
    ([5.0, np.inf, 5.0], wire.BAD_WORD),
    ([_LIMIT - 1, -0.0, 5.0], wire.OK),
    ([np.nan, 2.0, 5.0], wire.VOID),     # a worker's void payload was in the sum
]


@pytest.mark.parametrize('words,status', BAD_SUMS)
def test_ternary_decode_sum_bad_words(ops, words, status):
    words = np.array(words, f32)
    want, want_status = ref.ternary_decode_sum(words, 0.5, 4, 20)
    assert want_status == status
    out, got = ops.kvx_ternary_decode_sum(nd(words), threshold=0.5, num_workers=4, shape=(20,))
    assert status_of(got) == status
    assert same_bits(out.asnumpy(), want)
    if status == wire.VOID:
        assert np.isnan(want).all()
    elif status != wire.OK:
        assert not want.any()


def test_ternary_decode_sum_reference_params():
    """Word count, dtype, worker count and threshold: BAD_PARAM, zeros."""
    good = np.full(3, 5.0, f32)
    assert ref.ternary_decode_sum(good, 0.5, 4, 20)[1] == wire.OK
    for words, t, workers in [(good[:2], 0.5, 4), (np.full(4, 5.0, f32), 0.5, 4),
                              (good.astype(np.float64), 0.5, 4), (good.reshape(3, 1), 0.5, 4),
                              (good, 0.5, 0), (good, 0.5, 2 ** 20 + 1), (good, -1.0, 4),
                              (good, np.nan, 4), (good, 1e39, 4)]:
        out, status = ref.ternary_decode_sum(words, t, workers, 20)
        assert status == wire.BAD_PARAM and out.shape == (20,) and not out.any()


# ---- MXNet 2-bit -------------------------------------------------------------------------

@pytest.mark.parametrize('shape', [(1,), (15,), (16,), (17,), (8, 9), (1000,)])
@pytest.mark.parametrize('kind', ['randn', 'zeros', 'mixed', 'ints'])
def test_twobit(ops, shape, kind):
    grad, residual = grad_residual(shape, kind, 40)
    res_nd = nd(residual)
    words = ops.kvx_twobit_encode(nd(grad), res_nd, threshold=0.5)
    want, want_res = ref.twobit_encode(grad, residual, 0.5)
    assert same_bits(words.asnumpy().view(np.uint32), want)
    assert same_bits(res_nd.asnumpy(), want_res)
    out = ops.kvx_twobit_decode(words, threshold=0.5, shape=shape)
    assert same_bits(out.asnumpy().reshape(-1), ref.twobit_decode(want, 0.5, grad.size))


# ---- non-finite input: status 1, residual untouched ----------------------------------

ENCODERS = {
    'fp32': lambda ops, g, r: ops.kvx_fp32_encode(g),
    'topk': lambda ops, g, r: ops.kvx_topk_encode(g, r, k=2),
    'ternary_adaptive': lambda ops, g, r: ops.kvx_ternary_encode(g, r, scale=1.0),
    'ternary_fixed': lambda ops, g, r: ops.kvx_ternary_encode(g, r, threshold=0.5),
    'ternary_sum': lambda ops, g, r: ops.kvx_ternary_encode_sum(g, r, threshold=0.5,
                                                                num_workers=3),
    'gather': lambda ops, g, r: ops.kvx_topk_gather(g, r, nd(np.array([1, 4], f32))),
}
# every encoder but twobit's: a void payload (first word NaN) on failure
VOID_ENCODERS = {'fp32', 'topk', 'ternary_adaptive', 'ternary_fixed', 'ternary_sum', 'gather'}
REF_ENCODERS = {
    'fp32': lambda g, r: ref.fp32_encode(g)[1],
    'topk': lambda g, r: ref.topk_encode(g, r, 2)[2],
    'ternary_adaptive': lambda g, r: ref.ternary_encode(g, r, 1.0)[2],
    'ternary_fixed': lambda g, r: ref.ternary_encode(g, r, 1.0, 0.5)[2],
    'ternary_sum': lambda g, r: ref.ternary_encode_sum(g, r, 0.5, 3)[2],
    'gather': lambda g, r: ref.topk_gather(g, r, np.array([1, 4]))[2],
}


@pytest.mark.parametrize('codec', sorted(ENCODERS))
@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf, 'overflow'])
def test_nonfinite(ops, codec, bad):
    grad, residual = grad_residual((6, 5), 'randn', 50)
    if bad == 'overflow':   # finite inputs whose float32 sum is Inf
        grad[3, 2], residual[3, 2] = 3e38, 3e38
        if codec == 'fp32':
            grad[3, 2] = np.inf   # fp32 sends grad alone
    else:
        grad[3, 2] = bad
    res_nd = nd(residual)
    payload, status = ENCODERS[codec](ops, nd(grad), res_nd)
    assert status_of(status) == REF_ENCODERS[codec](grad, residual) == wire.NONFINITE
    assert same_bits(res_nd.asnumpy(), residual)
    words = payload.asnumpy()
    if codec in VOID_ENCODERS:    # void: decode_slots, and the additive decoders, read VOID
        assert np.isnan(words[0]) and not words[1:].any()
    else:
        assert not words.any()


def test_void_payload_voids_the_sum(ops):
    """What a worker pushes before it reads its encoder's status (store.py, deferred
    checks): the void payload of a non-finite gradient makes decode_slots report VOID
    for its slot and the sum NaN, whatever the other slots hold."""
    grad, residual = grad_residual((6, 5), 'randn', 51)
    good, _ = ops.kvx_ternary_encode(nd(grad), nd(residual), scale=1.0)
    grad[2, 2] = np.nan
    void, status = ops.kvx_ternary_encode(nd(grad), nd(residual), scale=1.0)
    assert status_of(status) == wire.NONFINITE
    slots = mx.nd.stack(good, void)
    total, statuses = ops.kvx_decode_slots(slots, size=30)
    assert list(statuses.asnumpy()) == [wire.OK, wire.VOID]
    assert np.isnan(total.asnumpy()).all()


@pytest.mark.parametrize('codec', ['ternary_sum', 'gather'])
def test_void_payload_voids_the_additive_sum(ops, codec):
    """Homomorphic rounds, as deferred checks run them (codecs/agreed.py): a worker whose
    gradient is non-finite pushes its encoder's void payload at once; the servers add
    it to the others' words, and every worker's decoder turns the sum into NaN
    everywhere with status VOID, without anyone reading the sum first."""
    grad, residual = grad_residual((6, 5), 'randn', 52)
    idx = np.array([1, 4], f32)
    if codec == 'gather':
        good, _ = ops.kvx_topk_gather(nd(grad), nd(residual), nd(idx))
    else:
        good, _ = ops.kvx_ternary_encode_sum(nd(grad), nd(residual), threshold=0.5,
                                             num_workers=3)
    grad[2, 2] = np.nan
    res_nd = nd(residual)
    void, status = ENCODERS[codec](ops, nd(grad), res_nd)
    assert status_of(status) == wire.NONFINITE
    assert same_bits(res_nd.asnumpy(), residual)
    total = good * 2 + void
    if codec == 'gather':
        out, status = ops.kvx_topk_scatter(total, nd(idx), shape=(6, 5))
        want, want_status = ref.topk_scatter(total.asnumpy(), idx, (6, 5))
    else:
        out, status = ops.kvx_ternary_decode_sum(total, threshold=0.5, num_workers=3,
                                                 shape=(6, 5))
        want, want_status = ref.ternary_decode_sum(total.asnumpy(), 0.5, 3, 30)
    assert status_of(status) == want_status == wire.VOID
    assert np.isnan(out.asnumpy()).all() and np.isnan(want).all()


def test_rows_dense(ops):
    """A Gather round's pulled rows read densely: rows a row_sparse array does not hold
    are zeros, as MXNet's cast_storage gives them; a dense input is read as it is."""
    from mxnet.ndarray import sparse
    values = make((7, 5), 'randn', 52)
    held = [0, 2, 3, 6]
    rows = sparse.row_sparse_array((nd(values[held]), mx.nd.array(held, dtype='int64')),
                                   shape=(7, 5))
    for size in (1, 5, 10, 17, 33, 35):
        out = ops.kvx_rows_dense(rows, size=size).asnumpy()
        want = rows.tostype('default').asnumpy().reshape(-1)[:size]
        assert same_bits(out, want), size
    assert same_bits(ops.kvx_rows_dense(nd(values), size=12).asnumpy(),
                     values.reshape(-1)[:12])
    assert not ops.kvx_rows_dense(sparse.zeros('row_sparse', (7, 5)), size=20).asnumpy().any()
    _raises(lambda: ops.kvx_rows_dense(rows, size=36))


def test_after_leaves_its_arrays_as_they_are(ops):
    """kvx_after only orders (tests/test_dist_no_wait.py shows what for): any dtypes,
    x's bits unchanged, a zero out."""
    before = mx.nd.array(make((3, 4), 'randn', 53), dtype='float16')
    for dtype in ('float32', 'float16', 'int64'):
        x = mx.nd.array(make((5,), 'randn', 54), dtype=dtype)
        kept = x.asnumpy().copy()
        assert ops.kvx_after(before, x).asnumpy().tolist() == [0.0]
        assert x.asnumpy().tobytes() == kept.tobytes(), dtype


# ---- malformed payloads: zeros, acc untouched, the reference's status ------------------

def _topk_payload():
    grad, residual = grad_residual((6, 4), 'randn', 60)
    return ref.topk_encode(grad, residual, 3)[0], 24


def _ternary_payload():
    grad, residual = grad_residual((31,), 'randn', 61)
    return ref.ternary_encode(grad, residual, 1.0)[0], 31


def _fp32_payload():
    return ref.fp32_encode(make((5,), 'randn', 62))[0], 5


def _set(i, v):
    def corrupt(p):
        p = p.copy()
        p[i] = v
        return p
    return corrupt


def _truncate(p):
    return p[:5].copy()


def _swap_indices(p):
    p = p.copy()
    p[8], p[10] = p[10], p[8]
    return p


def _short_body(p):
    """Header and length agree with each other, not with n: a body one value short."""
    p = p[:-1].copy()
    p[7] -= 1
    return p


def _extra_word(p):
    p = np.concatenate([p, np.zeros(1, f32)])
    p[7] += 1
    return p


MALFORMED = [
    # codec, corruption, expected status
    ('fp32', _set(0, 1.0), wire.BAD_MAGIC),
    ('fp32', _set(2, 2.0), wire.BAD_VERSION),
    ('fp32', _set(1, wire.TOPK), wire.BAD_CODEC),
    ('fp32', _set(3, 6.0), wire.BAD_SIZE),
    ('fp32', _set(7, 4.0), wire.BAD_SIZE),
    ('fp32', _truncate, wire.BAD_SIZE),
    ('fp32', _short_body, wire.BAD_SIZE),      # read past the body before the fix
    ('fp32', _extra_word, wire.BAD_SIZE),
    ('topk', _set(0, np.nan), wire.BAD_MAGIC),
    ('topk', _set(2, 0.0), wire.BAD_VERSION),
    ('topk', _set(1, wire.TERNARY), wire.BAD_CODEC),
    ('topk', _set(4, 1.0), wire.BAD_SIZE),
    ('topk', _set(5, 2.5), wire.BAD_PARAM),
    ('topk', _set(5, 0.0), wire.BAD_PARAM),
    ('topk', _set(5, 2.0), wire.BAD_PARAM),
    ('topk', _set(6, 5.0), wire.BAD_PARAM),
    ('topk', _set(6, 1e30), wire.BAD_PARAM),
    ('topk', _set(5, np.nan), wire.BAD_PARAM),
    ('topk', _set(5, np.inf), wire.BAD_PARAM),
    ('topk', _set(5, -np.inf), wire.BAD_PARAM),
    ('topk', _set(5, 1e30), wire.BAD_PARAM),
    ('topk', _set(6, np.nan), wire.BAD_PARAM),
    ('topk', _set(6, np.inf), wire.BAD_PARAM),
    ('topk', _set(8, 0.5), wire.BAD_INDEX),
    ('topk', _set(8, -1.0), wire.BAD_INDEX),
    ('topk', _set(10, 6.0), wire.BAD_INDEX),
    ('topk', _set(9, np.nan), wire.BAD_INDEX),
    ('topk', _swap_indices, wire.BAD_INDEX),
    ('ternary', _set(0, 0.0), wire.BAD_MAGIC),
    ('ternary', _set(2, 1.5), wire.BAD_VERSION),
    ('ternary', _set(1, wire.FP32), wire.BAD_CODEC),
    ('ternary', _truncate, wire.BAD_SIZE),
    ('ternary', _set(6, 5.0), wire.BAD_PARAM),
    ('ternary', _set(5, -1.0), wire.BAD_PARAM),
    ('ternary', _set(5, np.inf), wire.BAD_PARAM),
    ('ternary', _set(5, np.nan), wire.BAD_PARAM),
    ('ternary', _extra_word, wire.BAD_PARAM),
    ('ternary', _set(8, 1.5), wire.BAD_WORD),
    ('ternary', _set(9, -1.0), wire.BAD_WORD),
    ('ternary', _set(10, 3.0 ** 15), wire.BAD_WORD),
    ('ternary', _set(10, np.nan), wire.BAD_WORD),
]
PAYLOADS = {'fp32': _fp32_payload, 'topk': _topk_payload, 'ternary': _ternary_payload}
REF_DECODERS = {'fp32': ref.fp32_decode, 'topk': ref.topk_decode,
                'ternary': ref.ternary_decode}


@pytest.mark.parametrize('codec,corrupt,status', MALFORMED)
def test_malformed_payload(ops, codec, corrupt, status):
    good, n = PAYLOADS[codec]()
    bad = corrupt(good)
    assert REF_DECODERS[codec](bad, n)[1] == status
    assert_rejected(ops, codec, bad, n, status)


def assert_rejected(ops, codec, bad, n, status):
    """kvx_<codec>_decode and _decode_add both return ``status`` for the payload ``bad``
    (n elements); the decode's output is zeros and the accumulator is left bit-identical."""
    attrs = {'size': n} if codec == 'fp32' else {'shape': (n,)}
    out, got = getattr(ops, 'kvx_%s_decode' % codec)(nd(bad), **attrs)
    assert status_of(got) == status
    assert same_bits(out.asnumpy(), np.zeros(n, f32))
    acc = make((n,), 'randn', 63)
    acc_nd = nd(acc)
    assert status_of(getattr(ops, 'kvx_%s_decode_add' % codec)(nd(bad), acc_nd)) == status
    assert same_bits(acc_nd.asnumpy(), acc)


def assert_decode_slots(ops, slots, n, bad_word):
    """The servers' decode_slots of every worker's payload (rows of ``slots``, n
    elements) equals the reference's sum bit for bit; with word ``bad_word`` of the last
    slot made an index beyond n, that worker is named and the sum is all NaN."""
    workers = slots.shape[0]
    total, status = ops.kvx_decode_slots(nd(slots), size=n + 9)
    want, want_status = ref.decode_slots(slots, n + 9)
    assert list(status.asnumpy()) == want_status == [0] * workers
    assert same_bits(total.asnumpy(), want)
    slots = slots.copy()
    slots[workers - 1, bad_word] = 2.0 * n
    total, status = ops.kvx_decode_slots(nd(slots), size=n)
    assert list(status.asnumpy()) == ref.decode_slots(slots, n)[1]
    assert status.asnumpy()[-1] == wire.BAD_INDEX
    assert np.isnan(total.asnumpy()).all()


# ---- attribute, dtype and shape validation ----------------------------------------------

def _raises(fn):
    with pytest.raises(mx.base.MXNetError):
        out = fn()
        for o in (out if isinstance(out, (list, tuple)) else [out]):
            o.wait_to_read()


def test_invalid_attrs_and_dtypes(ops):
    g = nd(make((4, 3), 'randn', 70))
    r = nd(np.zeros((4, 3), f32))
    _raises(lambda: ops.kvx_topk_encode(g, r, k=0))
    _raises(lambda: ops.kvx_topk_encode(g, r, k=5))
    _raises(lambda: ops.kvx_topk_encode(g, r, k='two'))
    _raises(lambda: ops.kvx_topk_encode(g, r, k=1, K=1))
    _raises(lambda: ops.kvx_topk_encode(g, r))
    _raises(lambda: ops.kvx_topk_encode(g, nd(np.zeros((3, 4), f32)), k=1))
    _raises(lambda: ops.kvx_topk_encode(g.astype('float64'), r, k=1))
    _raises(lambda: ops.kvx_ternary_encode(g, r, scale=-1.0))
    _raises(lambda: ops.kvx_ternary_encode(g, r, threshold='nan'))
    _raises(lambda: ops.kvx_ternary_encode(g, r, threshold=-0.1))
    _raises(lambda: ops.kvx_ternary_encode_sum(g, r, threshold=0.5, num_workers=0))
    _raises(lambda: ops.kvx_ternary_encode_sum(g, r, threshold=0.5))
    _raises(lambda: ops.kvx_ternary_decode_sum(nd(np.zeros(1, f32)), threshold=0.5,
                                               num_workers=2, shape=(12,)))
    _raises(lambda: ops.kvx_ternary_decode_sum(nd(np.zeros(5)), threshold=0.5,
                                               num_workers=2, shape=(12,)))
    _raises(lambda: ops.kvx_ternary_decode_sum(nd(np.zeros(2)), threshold=0.5,   # float64
                                               num_workers=2, shape=(12,)))
    _raises(lambda: ops.kvx_twobit_encode(g, r, threshold=0.0))
    for stat in (ops.kvx_acc_abs_sum, ops.kvx_acc_filter_scores):
        _raises(lambda: stat(g, nd(np.zeros((3, 4), f32))))
        _raises(lambda: stat(g.astype('float64'), r))
        _raises(lambda: stat(g, r, k=1))
    _raises(lambda: ops.kvx_twobit_decode(nd(np.zeros(2, f32)), threshold=0.5, shape=(12,)))
    _raises(lambda: ops.kvx_topk_decode(nd(np.zeros(8, f32)), shape='(0, 3)'))
    _raises(lambda: ops.kvx_topk_decode(nd(np.zeros(8, f32)), shape='(4, x)'))
    _raises(lambda: ops.kvx_fp32_decode(nd(np.zeros(8, f32)), size=3, shape=(3,)))
    _raises(lambda: ops.kvx_fp32_decode(nd(np.zeros(8, f32))))
    _raises(lambda: ops.kvx_topk_scatter(nd(np.zeros(5, f32)), nd(np.zeros(2, f32)),
                                         shape=(4, 3)))
    _raises(lambda: ops.kvx_filter_scores(nd(np.zeros(3, np.float64))))


def test_shape_spellings(ops):
    payload, _ = ops.kvx_fp32_encode(nd(np.arange(6, dtype=f32)))
    for spelling in ['(2, 3)', '[2, 3]', '(2,3)', (2, 3)]:
        out, status = ops.kvx_fp32_decode(payload, shape=spelling)
        assert out.shape == (2, 3) and status_of(status) == 0
    out, _ = ops.kvx_fp32_decode(payload, shape='(6,)')
    assert out.shape == (6,)


# ---- the ctypes C API (benchmarks, server fallback) ----------------------------------

def test_c_api(library_path):
    import ctypes
    lib = ctypes.CDLL(library_path)
    i64, dbl, ptr = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
    lib.kvx_ternary_payload_words.restype = i64
    lib.kvx_status_name.restype = ctypes.c_char_p

    def p(a):
        return a.ctypes.data_as(ptr)

    assert lib.kvx_abi_version() == 2   # 2: float32 homomorphic words
    grad, residual = grad_residual((1000,), 'randn', 80)
    words = lib.kvx_ternary_payload_words(i64(grad.size))
    payload = np.zeros(words, f32)
    res = residual.copy()
    assert lib.kvx_ternary_encode(p(grad), p(res), i64(grad.size), dbl(1.0), dbl(0.3),
                                  p(payload)) == 0
    want, want_res, _ = ref.ternary_encode(grad, residual, 1.0, 0.3)
    assert same_bits(payload, want) and same_bits(res, want_res)
    out = np.zeros(grad.size, f32)
    bad = payload.copy()
    bad[9] = 0.5
    assert lib.kvx_ternary_decode(p(bad), i64(bad.size), i64(grad.size), p(out)) == wire.BAD_WORD
    # Homomorphic ternary: float32 words in and out; the word count is checked.
    lib.kvx_ternary_sum_words.restype = i64
    num_words = lib.kvx_ternary_sum_words(i64(grad.size), i64(4))
    assert num_words == -(-grad.size // 7)
    words = np.zeros(num_words, f32)
    res = residual.copy()
    assert lib.kvx_ternary_encode_sum(p(grad), p(res), i64(grad.size), dbl(0.3), i64(4),
                                      p(words)) == 0
    want, want_res, _ = ref.ternary_encode_sum(grad, residual, 0.3, 4)
    assert same_bits(words, want) and same_bits(res, want_res)
    assert lib.kvx_ternary_decode_sum(p(words), i64(num_words), dbl(0.3), i64(4),
                                      i64(grad.size), p(out)) == 0
    assert same_bits(out, ref.ternary_decode_sum(want, 0.3, 4, grad.size)[0])
    out[:] = 1
    assert lib.kvx_ternary_decode_sum(p(words), i64(num_words - 1), dbl(0.3), i64(4),
                                      i64(grad.size), p(out)) == wire.BAD_PARAM
    assert not out.any()
    # Scatter with a status.
    values = np.ones(6, f32)
    grid = np.full(30, 7.0, f32)
    assert lib.kvx_topk_scatter(p(values), p(np.array([2, 1], f32)), i64(2), i64(10), i64(3),
                                p(grid)) == wire.BAD_INDEX
    assert not grid.any()
    assert lib.kvx_topk_scatter(p(values), p(np.array([1, 2], f32)), i64(2), i64(10), i64(3),
                                p(grid)) == 0
    assert same_bits(grid, ref.topk_scatter(values, np.array([1, 2]), (10, 3))[0].reshape(-1))
    scores = np.zeros(10, np.float64)
    x = make((10, 7), 'mixed', 81)
    assert lib.kvx_filter_scores(p(x), i64(10), i64(7), p(scores)) == 0
    assert same_bits(scores, ref.filter_scores(x))


def test_wire_tables_agree(library_path):
    """One list of codecs and statuses: the library's tables (cpp/wire.cc, the rows
    cpp/codecs/ register, read through the C API) equal kvstore_ext's codec list (the
    codec classes: codec_list.py), its statuses (errors.py) and the spec's constants
    (python/kvx_ref), entry by entry."""
    import ctypes
    from kvstore_ext import codec_list, codecs as ext_codecs, errors, wire as ext_wire  # noqa: F401
    lib = ctypes.CDLL(library_path)
    i64, f = ctypes.c_int64, ctypes.c_float
    lib.kvx_header_magic.restype = lib.kvx_header_version.restype = f
    lib.kvx_header_words.restype = i64
    lib.kvx_status_name.restype = lib.kvx_status_symbol.restype = ctypes.c_char_p
    lib.kvx_codec_name.restype = ctypes.c_char_p
    lib.kvx_codec_payload_words.restype = i64
    lib.kvx_codec_payload_words.argtypes = [ctypes.c_int, i64, f, f]
    for name in ['fp32_payload_words', 'ternary_payload_words', 'ternary_sum_words']:
        getattr(lib, 'kvx_' + name).restype = i64
    lib.kvx_topk_payload_words.restype = i64

    assert lib.kvx_header_magic() == wire.MAGIC
    assert lib.kvx_header_version() == wire.VERSION
    assert lib.kvx_header_words() == wire.HEADER_WORDS == ext_wire.HEADER_WORDS

    statuses = {lib.kvx_status_symbol(code).decode(): code
                for code in range(lib.kvx_status_count())}
    spec_statuses = {name: getattr(wire, name) for name in dir(wire)
                     if name in ('OK', 'NONFINITE', 'VOID') or name.startswith('BAD_')}
    assert statuses == spec_statuses
    messages = {code: lib.kvx_status_name(code).decode() for code in statuses.values()}
    assert messages == errors.STATUS_MESSAGES
    assert errors.VOID == wire.VOID
    assert lib.kvx_status_symbol(len(statuses)) is None

    codecs = {lib.kvx_codec_name(i).decode(): lib.kvx_codec_id(i)
              for i in range(lib.kvx_codec_count())}
    in_cpp = {name: i for name, i in codec_list.codec_ids().items()
              if codec_list.find(i).server_decode is None}
    assert codecs == in_cpp
    assert len(set(codecs.values())) == len(codecs)
    assert {getattr(wire, name.upper()) for name in codecs} == set(codecs.values())
    assert set(ref._DECODERS) == set(codecs.values())   # the spec's decode_slots

    sizes = [(1, 1, 1), (14, 3, 5), (15, 1, 15), (16, 2, 8), (1000, 7, 100),
             (12345, 40, 300), (2 ** 24 + 3, 1000, 4608)]
    for i in range(lib.kvx_codec_count()):
        words = codec_list.find(lib.kvx_codec_id(i)).payload_words_of
        for n, a, b in sizes:
            assert lib.kvx_codec_payload_words(i, n, a, b) == words(n, a, b), (i, n, a, b)
    for n, k, filter_size in sizes:
        assert lib.kvx_fp32_payload_words(i64(n)) == ext_wire.fp32_payload_words(n)
        assert lib.kvx_ternary_payload_words(i64(n)) == ext_wire.ternary_payload_words(n)
        assert (lib.kvx_topk_payload_words(i64(k), i64(filter_size))
                == ext_wire.topk_payload_words(k, filter_size))
        assert ext_wire.ternary_payload_words(n) == wire.HEADER_WORDS + -(
            -n // wire.digits_per_word(ref.TERNARY_BASE, f32))
        for workers in [1, 2, 3, 4, 8, 16, 1000]:
            assert (lib.kvx_ternary_sum_words(i64(n), i64(workers))
                    == ext_wire.ternary_sum_words(n, workers) == ref.sum_words(n, workers))
    grad, residual = np.ones((6, 5), f32), np.zeros((6, 5), f32)
    for payload in (ref.fp32_encode(grad)[0], ref.topk_encode(grad, residual, 2)[0],
                    ref.ternary_encode(grad, residual, 1.0)[0]):
        words = codec_list.find(int(payload[1])).payload_words_of
        assert payload.size == words(grad.size, payload[5], payload[6])


# ---- server-decode aggregation (kvx_decode_slots) --------------------------------------

def _slots(payloads, slot_words):
    """Payloads padded with garbage into equal slots, as worker pushes arrive at a server."""
    rng = np.random.default_rng(7)
    out = rng.standard_normal((len(payloads), slot_words)).astype(f32) * 1e3
    for w, p in enumerate(payloads):
        out[w, :p.size] = p
    return out


def _worker_payloads(kind, workers, shape, seed):
    rng = np.random.default_rng(seed)
    payloads = []
    for _ in range(workers):
        g = rng.standard_normal(shape).astype(f32)
        r = np.zeros(shape, f32)
        if kind == 'topk':
            payloads.append(ref.topk_encode(g, r, max(1, shape[0] // 4))[0])
        elif kind == 'ternary':
            payloads.append(ref.ternary_encode(g, r, 1.5)[0])
        else:
            payloads.append(ref.fp32_encode(g)[0])
    return payloads


@pytest.mark.parametrize('kind', ['topk', 'ternary', 'fp32'])
@pytest.mark.parametrize('workers', [1, 2, 5])
def test_decode_slots_matches_reference(ops, kind, workers):
    shape = (12, 3, 3, 3)
    payloads = _worker_payloads(kind, workers, shape, workers)
    slots = _slots(payloads, max(p.size for p in payloads) + 13)
    capacity = int(np.prod(shape)) + 50
    total, status = ops.kvx_decode_slots(nd(slots), size=capacity)
    want, want_status = ref.decode_slots(slots, capacity)
    assert list(status.asnumpy()) == want_status == [0] * workers
    assert same_bits(total.asnumpy(), want)
    assert not want[int(np.prod(shape)):].any()


@pytest.mark.parametrize('corrupt, code', [
    (lambda s: s.__setitem__((1, 1), 2.0), wire.BAD_CODEC),            # other codec id
    (lambda s: s.__setitem__((1, 3), s[1, 3] + 1), wire.BAD_CODEC),    # other tensor size
    (lambda s: s.__setitem__((1, 7), 1e9), wire.BAD_SIZE),             # body beyond the slot
    (lambda s: s.__setitem__((1, 0), 1.0), wire.BAD_MAGIC),
    (lambda s: s.__setitem__((1, 9), 3.0 ** 15), wire.BAD_WORD),       # ternary word range
])
def test_decode_slots_names_the_bad_worker(ops, corrupt, code):
    payloads = _worker_payloads('ternary', 3, (40, 7), 1)
    slots = _slots(payloads, payloads[0].size + 4)
    corrupt(slots)
    _, status = ops.kvx_decode_slots(nd(slots), size=400)
    _, want_status = ref.decode_slots(slots, 400)
    assert list(status.asnumpy()) == want_status == [0, code, 0]


@pytest.mark.parametrize('kind', ['topk', 'ternary', 'fp32'])
def test_void_slot_voids_the_sum(ops, kind):
    """A worker whose gradient was non-finite sends a slot of NaN (rounds.void): the
    others' payloads are fine, yet the sum is all NaN, so every worker sees the step void."""
    payloads = _worker_payloads(kind, 3, (12, 3, 3, 3), 4)
    slots = _slots(payloads, max(p.size for p in payloads) + 3)
    slots[1, :] = np.nan
    capacity = 12 * 27
    total, status = ops.kvx_decode_slots(nd(slots), size=capacity)
    want, want_status = ref.decode_slots(slots, capacity)
    assert list(status.asnumpy()) == want_status == [0, wire.VOID, 0]
    assert np.isnan(total.asnumpy()).all() and np.isnan(want).all()


def test_decode_slots_capacity_too_small(ops):
    payloads = _worker_payloads('fp32', 2, (30,), 3)
    _, status = ops.kvx_decode_slots(nd(_slots(payloads, 40)), size=29)
    assert list(status.asnumpy()) == [wire.BAD_SIZE] * 2


# ---- the generic encoder and the split of test-only operators ----------------------------

def test_codec_encode_is_the_table_row_encoder(ops):
    """kvx_codec_encode runs a codec's encoder through its table row (a new codec then
    needs no op of its own): float32's row gives kvx_fp32_encode's payload, bit for bit."""
    for shape, kind in [((7,), 'randn'), ((3, 5), 'mixed'), ((1,), 'zeros')]:
        grad = make(shape, kind, 3)
        residual = nd(np.zeros(shape, f32))
        payload, status = ops.kvx_codec_encode(nd(grad), residual, codec=1)
        want, want_status = ops.kvx_fp32_encode(nd(grad))
        assert status_of(status) == status_of(want_status) == wire.OK
        assert same_bits(payload.asnumpy(), want.asnumpy())
        assert same_bits(payload.asnumpy(), ref.fp32_encode(grad)[0])
    grad = np.array([1.0, np.nan], f32)
    payload, status = ops.kvx_codec_encode(nd(grad), nd(np.zeros(2, f32)), codec=1)
    assert status_of(status) == wire.NONFINITE and np.isnan(payload.asnumpy()[0])
    with pytest.raises(mx.base.MXNetError, match='codec 3 has no encoder'):
        ops.kvx_codec_encode(nd(grad), nd(np.zeros(2, f32)), codec=3).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match='codec 99 has no encoder'):
        ops.kvx_codec_encode(nd(grad), nd(np.zeros(2, f32)), codec=99).wait_to_read()


def test_plugin_has_no_test_ops():
    """The plugin kvstore_ext loads carries the operators it uses, not the ones only
    tests use (those are in libkvx_test_ops): checked in a fresh interpreter."""
    import subprocess
    code = ('import kvstore_ext, json\n'
            'from kvstore_ext import _lib\n'
            'print(json.dumps(sorted(_lib.OPS)))\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json
    names = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert {'kvx_topk_encode', 'kvx_thc_encode', 'kvx_decode_slots',
            'kvx_codec_encode'} <= names
    test_only = {'kvx_topk_decode', 'kvx_fp32_decode_add', 'kvx_thc_rotate',
                 'kvx_thc_unrotate', 'kvx_thc_quantize', 'kvx_thc_dequantize',
                 'kvx_filter_scores', 'kvx_twobit_encode'}
    assert not names & test_only, sorted(names & test_only)
    # what benchmarks call to get them (bench/kernels.py)
    code = ('import kvstore_ext, json\n'
            'from kvstore_ext import _lib\n'
            '_lib.load_test_ops()\n'
            'print(json.dumps(sorted(_lib.OPS)))\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert test_only | names <= set(json.loads(proc.stdout.strip().splitlines()[-1]))


# ---- float16 pairs (dist_sync_fp16, aggregation='server') ------------------------------

@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('error_feedback', [0, 1])
@pytest.mark.parametrize('n', [1, 2, 2113])
def test_fp16_pairs_encode_decode(ops, kind, error_feedback, n):
    """The generic encoder (codec 7) writes the reference's payload and residual bit for
    bit, and the servers' decode_slots adds two workers' halves in float32 as the
    reference does."""
    grad, residual = grad_residual((n,), kind, 40 + n)
    limit = float(ref.fp16_limit(2))
    want, want_res, status = ref.fp16_pairs_encode(grad, residual if error_feedback else None,
                                                   limit, error_feedback)
    assert status == 0
    res_nd = nd(residual)
    payload, status = ops.kvx_codec_encode(nd(grad), res_nd, codec=7, a=limit,
                                           b=float(error_feedback))
    assert status_of(status) == 0 and same_bits(payload.asnumpy(), want)
    assert same_bits(res_nd.asnumpy(), want_res if error_feedback else residual)
    other, _, _ = ref.fp16_pairs_encode(grad[::-1].copy(), None, limit, 0)
    total, statuses = ops.kvx_decode_slots(nd(np.stack([want, other])), size=n)
    want_total, want_statuses = ref.decode_slots(np.stack([want, other]), n)
    assert not statuses.asnumpy().any() and not any(want_statuses)
    assert same_bits(total.asnumpy(), want_total)


@pytest.mark.parametrize('pattern', [0x7c00, 0xfc00, 0x7e00, 0x7c01])
@pytest.mark.parametrize('where', [0, 1, 2])       # low half, high half, last lone half
def test_fp16_pairs_refuse_inf_and_nan_halves(ops, pattern, where):
    """A half Inf or NaN is no encoder's output: BAD_WORD, and the sum is void."""
    grad = make((5,), 'randn', 3)
    payload, _, _ = ref.fp16_pairs_encode(grad, None, 65504.0, 0)
    halves = payload[8:].view(np.uint16).copy()
    halves[{0: 2, 1: 3, 2: 4}[where]] = pattern
    bad = np.concatenate([payload[:8], halves.view(f32)])
    assert ref.fp16_pairs_decode(bad, 5)[1] == wire.BAD_WORD
    total, statuses = ops.kvx_decode_slots(nd(bad[None, :]), size=5)
    assert statuses.asnumpy()[0] == wire.BAD_WORD and np.isnan(total.asnumpy()).all()


def test_fp16_pairs_words_survive_the_servers_merge(ops):
    """Every word a pairs payload can hold (any finite high half over low halves of every
    kind) is unchanged by what MXNet's server and the Gather transport do to payload
    words, ``x * 1`` and ``x + 0``, but for -0.0, which becomes +0.0: the same numbers."""
    finite = np.array([h for h in range(1 << 16) if (h & 0x7c00) != 0x7c00], np.uint32)
    low = np.array([0, 1, 0x3c00, 0x7bff, 0x8000, 0x83ff, 0xfbff, 0x7c00, 0xffff],
                   np.uint32)
    words = ((finite[:, None] << 16) | low[None, :]).reshape(-1).view(f32)
    assert np.isfinite(words).all()
    for merged in (nd(words) * 1.0, nd(words) + 0.0,
                   mx.nd.sparse.row_sparse_array((words[None, :], [0]), shape=(2, words.size))
                   + mx.nd.sparse.zeros('row_sparse', (2, words.size))):
        got = merged.asnumpy().reshape(-1)[:words.size].view(np.uint32)
        sent = words.view(np.uint32)
        changed = got != sent
        assert set(sent[changed].tolist()) <= {0x80000000}
