"""DGC's momentum-correction ops (cpp/ops/momentum.cc) against NumPy, bit for bit.

``kvx_momentum_velocity(velocity, grad; momentum)``: ``velocity * m + grad`` in float32,
the product rounded before the sum, as MXNet's two operators computed it.
``kvx_zero_rows(sent, x; rows)``: x (rows of x.size / rows elements) zeroed in place on
the rows ``sent`` names; an index outside [0, rows) (a payload's padding) names nothing.
``kvx_momentum_deliver(total, delivered; momentum) -> out``: ``total - m * delivered``,
then ``delivered`` becomes ``where(total == total, total, delivered)`` in place; ``out``
may be ``total`` itself. Bad shapes, dtypes and attributes are refused, naming the op.
"""
import numpy as np
import pytest
import mxnet as mx

from test_cpp_ops import make, nd, ops, library_path, same_bits  # noqa: F401

f32 = np.float32


@pytest.mark.parametrize('kind', ['randn', 'huge', 'tiny', 'mixed', 'ints', 'zeros'])
@pytest.mark.parametrize('m', [0.9, 0.5, 0.999, 0.0])
def test_velocity_is_numpys(ops, kind, m):
    v, g = make((1003,), kind, 1), make((1003,), 'randn', 2)
    got = ops.kvx_momentum_velocity(nd(v), nd(g), momentum=m).asnumpy()
    assert same_bits(got, (v * f32(m)).astype(f32) + g)
    mxnet_ops = (nd(v) * m + nd(g)).asnumpy()       # what the wrapper ran before
    assert same_bits(got, mxnet_ops)


def test_velocity_takes_grads_shape_and_spreads_nan(ops):
    v = np.arange(12, dtype=f32)
    g = np.ones((3, 4), f32)
    g[1, 2] = np.nan
    got = ops.kvx_momentum_velocity(nd(v), nd(g), momentum=0.9).asnumpy()
    assert got.shape == (3, 4)
    assert np.isnan(got[1, 2]) and np.isfinite(np.delete(got.reshape(-1), 6)).all()


@pytest.mark.parametrize('rows,row_size', [(10, 1), (4, 6), (1, 5)])
def test_zero_rows_in_place(ops, rows, row_size):
    x0 = make((rows * row_size,), 'randn', 3)
    sent = np.array([rows - 1, 0, rows, -1, rows + 7, 0], np.int64)   # padding, repeats
    x = nd(x0)
    ops.kvx_zero_rows(nd(sent), x, rows=rows).wait_to_read()
    want = x0.reshape(rows, row_size).copy()
    want[[rows - 1, 0]] = 0
    assert same_bits(x.asnumpy(), want.reshape(-1))


def test_zero_rows_refuses_bad_input(ops):
    x = nd(np.ones(12, f32))
    with pytest.raises(mx.base.MXNetError, match='kvx_zero_rows'):
        ops.kvx_zero_rows(nd(np.array([0], np.int64)), x, rows=5).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match='kvx_zero_rows'):
        ops.kvx_zero_rows(nd(np.array([0], f32)), x, rows=3).wait_to_read()
    with pytest.raises(mx.base.MXNetError, match='kvx_zero_rows'):
        ops.kvx_zero_rows(nd(np.array([0], np.int64)), x, rows=0).wait_to_read()


@pytest.mark.parametrize('m', [0.9, 0.0])
def test_deliver_is_numpys(ops, m):
    total, previous = make((2000,), 'mixed', 4), make((2000,), 'randn', 5)
    total[[0, 17, 1999]] = np.nan
    total[5] = np.inf
    kept = nd(previous)
    out = ops.kvx_momentum_deliver(nd(total), kept, momentum=m).asnumpy()
    delivered = kept.asnumpy()
    assert same_bits(delivered, np.where(total == total, total, previous))
    assert same_bits(out, total - (previous * f32(m)).astype(f32))
    t, p = nd(total), nd(previous)
    assert same_bits(out, (t - m * p).asnumpy())        # what the wrapper ran before
    assert same_bits(delivered, mx.nd.where(t == t, t, p).asnumpy())
    # the sum written over total (the store's output), the same bits
    into, kept = nd(total), nd(previous)
    ops.kvx_momentum_deliver(into, kept, momentum=m, out=into).wait_to_read()
    assert same_bits(into.asnumpy(), out) and same_bits(kept.asnumpy(), delivered)


def test_shapes_and_attributes_are_checked(ops):
    a, b = nd(np.ones(6, f32)), nd(np.ones(7, f32))
    for name in ('kvx_momentum_velocity', 'kvx_momentum_deliver'):
        run = getattr(ops, name)
        with pytest.raises(mx.base.MXNetError, match=name):
            run(a, b, momentum=0.9)                     # sizes differ
        with pytest.raises(mx.base.MXNetError, match=name):
            run(a, a, momentum=-0.5)
        with pytest.raises(mx.base.MXNetError, match=name):
            run(a, a)                                   # momentum is required
        with pytest.raises(mx.base.MXNetError, match=name):
            run(mx.nd.ones(6, dtype=np.float64), a, momentum=0.9)
