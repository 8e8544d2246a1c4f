"""DGC's momentum correction as a wrapper over a codec (codecs/momentum.py,
``MomentumCorrected``): it goes around any codec, masks only through a codec that
reports what it sent, and a re-plan keeps its velocity exactly when the wrapped codec
stays of the same kind (planning.py compares ``Codec.kind``); otherwise it hands over
what it owes (``Codec.owed``). One process; the steps
are checked against the NumPy spec (python/kvx_ref/momentum.py)."""
import numpy as np
import pytest
import mxnet as mx

from kvx_ref.momentum import momentum_fp16_step, momentum_owed, momentum_topk_step
from kvstore_ext.codecs import (FilterTopKCodec, Float16Codec, MomentumCorrected,
                                TernaryCodec)

SHAPE = (16, 8, 3, 3)


def grad(step, shape=SHAPE):
    return (np.random.default_rng(step).standard_normal(shape) * 0.1).astype(np.float32)


def test_any_codec_takes_the_correction():
    """float16 in sum mode, which no scheme corrects: wrapped, each step returns
    S - m S_prev with S the float16 sum of velocity + residual, as the spec's."""
    kv = mx.kv.create('dist_sync_fp16')
    kv.set_gradient_compression({'size_threshold': 100, 'error_feedback': 1})
    plain = kv._scheme.codec_for
    kv._scheme.codec_for = lambda *a, **k: MomentumCorrected(plain(*a, **k), 0.9,
                                                             masking=False)
    residual = velocity = delivered = None
    for step in range(5):
        g = grad(step)
        out = mx.nd.array(g)
        kv.pushpull('w', out)
        want, delivered, (residual,), (velocity,) = momentum_fp16_step(
            [g], [residual], [velocity], delivered, 0.9)
        np.testing.assert_array_equal(out.asnumpy(), want)
        state = kv.key_state('w')
        np.testing.assert_array_equal(state.residual, residual)
        np.testing.assert_array_equal(state.arrays['0.velocity'], velocity)
    codec = kv.plan('w').codec
    assert type(codec.inner) is Float16Codec and codec.describe().startswith('float16')


def test_masking_needs_a_codec_that_reports_what_it_sent():
    """The ternary codec codes every value and reports no rows: masking it is refused
    with the codec named; unmasked it is what Hylo's FC layers run."""
    with pytest.raises(ValueError, match='masking=False') as err:
        MomentumCorrected(TernaryCodec((4000,), 2.0), 0.9, masking=True)
    assert 'TernaryCodec' in str(err.value)
    assert MomentumCorrected(TernaryCodec((4000,), 2.0), 0.9, masking=False).masking is False
    with pytest.raises(ValueError, match='already'):
        MomentumCorrected(MomentumCorrected(FilterTopKCodec(SHAPE, 4)), 0.9)


def replanned_store(second):
    """Hylo (server mode, the conv top-k corrected) whose key re-plans at step 2 to
    ``second(shape)``, a codec wrapped as the first."""
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'size_threshold': 100, 'conv_rate': 0.25,
                                 'momentum': 0.9, 'momentum_correction': 'on',
                                 'aggregation': 'server', 'momentum_masking': 'off'})
    scheme = kv._scheme
    first = scheme.codec_for
    scheme.replans_at = lambda step: step == 2
    scheme.codec_for = lambda shape, dtype, step=0: (
        first(shape, dtype, step) if step < 2 else
        MomentumCorrected(second(shape), 0.9, masking=False))
    return kv


def test_a_replan_keeps_the_velocity_when_the_wrapped_kind_stays():
    """k changes from 4 to 6 filters, the wrapped codec stays a filter top-k: the
    velocity and S_prev carry over and step 2 is the spec's step from them."""
    kv = replanned_store(lambda shape: FilterTopKCodec(shape, 6))
    residual = velocity = delivered = None
    for step in range(4):
        g = grad(step)
        out = mx.nd.array(g)
        kv.pushpull('conv', out)
        k = 4 if step < 2 else 6
        want, delivered, (residual,), (velocity,) = momentum_topk_step(
            [g], [residual], [velocity], delivered, k, 0.9, masking=False)
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(kv.key_state('conv').arrays['0.velocity'], velocity,
                                   rtol=1e-6, atol=1e-7)
    assert kv.plan('conv').codec.k == 6


def test_a_replan_to_another_wrapped_kind_hands_over_and_starts_afresh():
    """The wrapped codec changes kind (filter top-k to ternary, the same shape, so the
    same state names and shapes): the old correction hands over what it owes
    (``momentum_owed``: its residual, velocity and S_prev, as a gradient) with the
    next step, and the new one starts afresh (no residual, u = grad + owed, S_prev 0,
    so the step returns S itself)."""
    kv = replanned_store(lambda shape: TernaryCodec(shape, 2.0, value='round'))
    for step in range(2):
        kv.pushpull('conv', mx.nd.array(grad(step)))
    before = kv.key_state('conv')
    owed = momentum_owed(before.residual, before.arrays['0.velocity'],
                         before.arrays['0.delivered'], 0.9, 1)
    assert np.abs(before.residual).max() > 0 and np.abs(owed).max() > 0
    g = grad(2)
    out = mx.nd.array(g)
    kv.pushpull('conv', out)
    from kvx_ref.momentum import momentum_ternary_step
    want, _, (new_residual,), (velocity,) = momentum_ternary_step(
        [(g + owed).reshape(-1)], [np.zeros(g.size, np.float32)], [None], None, 2.0, 0.9)
    np.testing.assert_allclose(out.asnumpy().reshape(-1), want, rtol=1e-5, atol=1e-6)
    after = kv.key_state('conv')
    np.testing.assert_allclose(after.arrays['0.velocity'].reshape(-1), velocity,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after.residual.reshape(-1), new_residual,
                               rtol=1e-5, atol=1e-6)
