"""PowerSGD's fused orthonormalisation ops (cpp/ops/powersgd.cc) against NumPy.

``kvx_powersgd_p_hat(p) -> (p_hat, void)`` and ``kvx_powersgd_next_q(q_old, q_sum,
void_in) -> (q_next, void)``: the Q factor of a Householder QR, whose columns (signs
included) equal NumPy's float64 ``qr`` (python/kvx_ref/powersgd.py, ``orthonormalise``)
to float32 rounding, orthonormal for zero and rank-deficient input too; the same bits
on every call; a NaN or Inf (or a void step before) makes the step void, P^ of zeros
orthonormal and the next Q the old one; bad shapes and dtypes are refused, naming the op.
``kvx_powersgd_acc(grad, residual) -> (acc, status)``: step 1, ``grad + residual`` bit
for bit NumPy's, with the gradient's finite check as its status.
"""
import numpy as np
import pytest
import mxnet as mx

from kvx_ref import powersgd as ref

from test_cpp_ops import make, nd, ops, library_path, same_bits  # noqa: F401

f32 = np.float32


def orthonormality_error(q):
    q = np.asarray(q, np.float64)
    return np.abs(q.T @ q - np.eye(q.shape[1])).max()


def p_hat_of(ops, p):
    p_hat, void = ops.kvx_powersgd_p_hat(nd(p))
    return p_hat.asnumpy(), void.asnumpy()


def next_q_of(ops, q_old, q_sum, void_in):
    q_next, void = ops.kvx_powersgd_next_q(nd(q_old), nd(q_sum),
                                           nd(np.array([void_in], f32)))
    return q_next.asnumpy(), void.asnumpy()


@pytest.mark.parametrize('shape', [(1, 1), (2, 1), (5, 5), (12, 4), (300, 4), (5000, 1),
                                   (3136, 16)])
@pytest.mark.parametrize('kind', ['randn', 'huge', 'tiny', 'mixed', 'ints'])
def test_p_hat_matches_numpy_qr(ops, shape, kind):
    """Columns equal NumPy's (signs included) to float32 rounding (computed in double,
    rounded once), Q^T Q = I, void 0, and the next Q of the same matrix is the same
    bits."""
    a = make(shape, kind, 3)
    got, void = p_hat_of(ops, a)
    assert got.dtype == f32 and got.shape == shape
    assert void.shape == (1,) and void[0] == 0
    np.testing.assert_allclose(got, ref.orthonormalise(a), rtol=0, atol=1e-7)
    assert orthonormality_error(got) < 1e-6
    again, _ = p_hat_of(ops, a)
    assert same_bits(again, got)
    q_next, void = next_q_of(ops, make(shape, 'randn', 9), a, 0.0)
    assert void[0] == 0 and same_bits(q_next, got)


def test_zero_input_gives_identity_columns(ops):
    got, void = p_hat_of(ops, np.zeros((7, 3), f32))
    assert void[0] == 0
    np.testing.assert_array_equal(got, np.eye(7, 3))


@pytest.mark.parametrize('case', ['repeated column', 'zero column', 'zero rows',
                                  'one direction'])
def test_rank_deficient_input_stays_orthonormal(ops, case):
    """Householder, unlike Gram-Schmidt, gives orthonormal columns spanning the input's
    when columns repeat or vanish; the columns NumPy determines (those before the
    first dependent one) are NumPy's."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((60, 4)).astype(f32)
    first_free = 4
    if case == 'repeated column':
        a[:, 2] = 3 * a[:, 0]
        first_free = 2
    elif case == 'zero column':
        a[:, 1] = 0
        first_free = 1
    elif case == 'zero rows':
        a[30:, :] = 0
    else:
        a = np.outer(rng.standard_normal(60), [1, -2, 0.5, 4]).astype(f32)
        first_free = 1
    got, void = p_hat_of(ops, a)
    assert void[0] == 0 and np.isfinite(got).all()
    assert orthonormality_error(got) < 1e-6
    spanned = got @ (got.T.astype(np.float64) @ a)
    np.testing.assert_allclose(spanned, a, rtol=0, atol=1e-5 * np.abs(a).max())
    np.testing.assert_allclose(got[:, :first_free], ref.orthonormalise(a)[:, :first_free],
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize('where', [(0, 0), (17, 2), (39, 3)])
def test_nonfinite_p_is_void(ops, bad, where):
    """A NaN or +-Inf anywhere in P: void 1 and P^ the orthonormal columns of zeros (the
    identity's), finite, so the rest of the step computes on finite values."""
    p = make((40, 4), 'randn', 6)
    p[where] = bad
    got, void = p_hat_of(ops, p)
    assert void[0] == 1
    np.testing.assert_array_equal(got, np.eye(40, 4))


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_nonfinite_q_sum_keeps_old_q(ops, bad):
    q_old = ref.orthonormalise(make((50, 3), 'randn', 7)).astype(f32)
    q_sum = make((50, 3), 'randn', 8)
    q_sum[25, 1] = bad
    got, void = next_q_of(ops, q_old, q_sum, 0.0)
    assert void[0] == 1 and same_bits(got, q_old)


@pytest.mark.parametrize('void_in', [1.0, 9.0, np.nan])
def test_void_p_passes_through(ops, void_in):
    """A void P (void_in not 0, NaN included) voids the step whatever Q's sum: the old Q
    stays, bit for bit."""
    q_old = ref.orthonormalise(make((50, 3), 'randn', 7)).astype(f32)
    got, void = next_q_of(ops, q_old, make((50, 3), 'randn', 8), void_in)
    assert void[0] == 1 and same_bits(got, q_old)


def test_finite_q_sum_is_orthonormalised(ops):
    q_sum = make((50, 3), 'randn', 8)
    got, void = next_q_of(ops, make((50, 3), 'randn', 7), q_sum, 0.0)
    assert void[0] == 0
    np.testing.assert_allclose(got, ref.orthonormalise(q_sum), rtol=0, atol=1e-5)


@pytest.mark.parametrize('shape', [(4,), (3, 4), (1, 2), (2, 3, 4)])
def test_p_hat_refuses_bad_shapes(ops, shape):
    """P must be rows x rank with 1 <= rank <= rows."""
    with pytest.raises(mx.base.MXNetError, match='kvx_powersgd_p_hat'):
        ops.kvx_powersgd_p_hat(mx.nd.zeros(shape)).wait_to_read()


@pytest.mark.parametrize('shapes', [((5, 2), (5, 3), (1,)), ((5, 2), (4, 2), (1,)),
                                    ((5, 2), (5, 2), (2,)), ((2, 5), (2, 5), (1,)),
                                    ((10,), (10,), (1,))])
def test_next_q_refuses_bad_shapes(ops, shapes):
    arrays = [mx.nd.zeros(s) for s in shapes]
    with pytest.raises(mx.base.MXNetError, match='kvx_powersgd_next_q'):
        ops.kvx_powersgd_next_q(*arrays)[0].wait_to_read()


@pytest.mark.parametrize('dtype', [np.float64, np.float16, np.int32])
def test_ops_refuse_other_dtypes(ops, dtype):
    with pytest.raises(mx.base.MXNetError, match='kvx_powersgd_p_hat'):
        ops.kvx_powersgd_p_hat(mx.nd.ones((5, 2), dtype=dtype))[0].wait_to_read()
    with pytest.raises(mx.base.MXNetError, match='kvx_powersgd_next_q'):
        ops.kvx_powersgd_next_q(mx.nd.ones((5, 2)), mx.nd.ones((5, 2), dtype=dtype),
                                mx.nd.zeros((1,)))[0].wait_to_read()


@pytest.mark.parametrize('shape', [(1,), (7, 3), (512, 3136), (64, 32, 5, 5)])
def test_acc_is_the_sum_bit_for_bit(ops, shape):
    rng = np.random.default_rng(11)
    grad = rng.standard_normal(shape).astype(f32)
    residual = (rng.standard_normal(shape) * 1e-3).astype(f32)
    acc, status = ops.kvx_powersgd_acc(nd(grad), nd(residual.reshape((-1,))))
    assert acc.shape == shape
    assert same_bits(acc.asnumpy(), grad + residual)
    assert status.asnumpy().tolist() == [0.0]


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize('at', [0, 37, 999])
def test_acc_status_says_a_nonfinite_gradient(ops, bad, at):
    grad = np.ones(1000, f32)
    grad[at] = bad
    acc, status = ops.kvx_powersgd_acc(nd(grad), nd(np.zeros(1000, f32)))
    assert status.asnumpy().tolist() == [1.0]          # kNonFinite
    assert not np.isfinite(acc.asnumpy()[at])
    residual = np.zeros(1000, f32)
    residual[at] = bad                                  # only the gradient counts
    _, status = ops.kvx_powersgd_acc(nd(np.ones(1000, f32)), nd(residual))
    assert status.asnumpy().tolist() == [0.0]


def test_acc_refuses_mismatched_sizes_and_dtypes(ops):
    with pytest.raises(mx.base.MXNetError, match='kvx_powersgd_acc'):
        ops.kvx_powersgd_acc(nd(np.ones(10, f32)), nd(np.ones(9, f32)))
    with pytest.raises(mx.base.MXNetError, match='kvx_powersgd_acc'):
        ops.kvx_powersgd_acc(mx.nd.ones(10, dtype=np.float64), nd(np.ones(10, f32)))
