"""DGC's momentum correction (``momentum`` > 0, codecs/momentum.py, a wrapper over the
codec: ``MomentumCorrected``): Hylo's conv top-k,
Hylo's FC ternary (the velocity coded, never masked), dist_sync_topk's element top-k
and dist_sync_adacomp (codecs/adacomp.py)
against its NumPy spec (python/kvx_ref/momentum.py), in one process; and the claim the
codec makes: an SGD optimizer with momentum m fed its output moves the weights by
exactly -lr times the sum of the sent velocities (DGC's update)."""
import numpy as np
import pytest
import mxnet as mx

from kvx_ref.momentum import momentum_topk_step
from kvstore_ext.codecs import (AdaCompCodec, AdditiveTernaryCodec, AdditiveTopKCodec,
                                ElementTopKCodec, FilterTopKCodec, MomentumCorrected,
                                TernaryCodec)
from kvstore_ext.codecs.base import innermost


def corrected(codec, plain):
    """True if ``codec`` is ``plain``'s kind wrapped with the momentum correction."""
    return isinstance(codec, MomentumCorrected) and type(codec.inner) is plain

SHAPE = (16, 8, 3, 3)
FC_SHAPE = (48, 40)
# server mode unless a test asks for the homomorphic one (Hylo's default)
PARAMS = {'size_threshold': 100, 'conv_rate': 0.25, 'momentum': 0.9,
          'momentum_correction': 'on',     # 'auto' corrects from 8 workers; these have 1
          'aggregation': 'server'}


def grad(step, shape=SHAPE):
    return (np.random.default_rng(step).standard_normal(shape) * 0.1).astype(np.float32)


def store(**extra):
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(dict(PARAMS, **extra))
    return kv


def masked(masking):
    """The store parameters of a masking: 'always' is the default 'lr' with no learning
    rate followed (it masks at every step), 'off' never masks."""
    return {'momentum_masking': 'off'} if masking == 'off' else {}


@pytest.mark.parametrize('chunk_size, masking', [(1 << 20, 'always'), (1 << 20, 'off'),
                                                (1024, 'always')])
def test_server_steps_match_the_reference(chunk_size, masking):
    kv = store(chunk_size=chunk_size, **masked(masking))
    k = 4
    residual = velocity = delivered = None
    for step in range(5):
        g = grad(step)
        out = mx.nd.array(g)
        kv.pushpull('conv', out)
        if chunk_size == 1 << 20:
            want, delivered, (residual,), (velocity,) = momentum_topk_step(
                [g], [residual], [velocity], delivered, k, 0.9, masking == 'always')
            np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(kv.key_state('conv').residual, residual)
            kept = kv.key_state('conv').arrays['0.velocity']
            np.testing.assert_allclose(kept, velocity, rtol=1e-6, atol=1e-7)
    codec = kv.plan('conv').chunks[0].codec
    assert corrected(codec, FilterTopKCodec) and codec.momentum == 0.9
    assert codec.masking == (masking == 'always')
    if chunk_size == 1024:      # 1,152 elements: 2 chunks of 8 filters, 2 sent each
        assert len(kv.plan('conv').chunks) == 2
        assert [c.codec.k for c in kv.plan('conv').chunks] == [2, 2]


@pytest.mark.parametrize('masking', ['always', 'off'])
def test_what_factor_masking_costs_a_filter_sent_every_step(masking):
    """The price of DGC's masking (why 'auto' corrects only from 8 workers): a filter
    whose steady gradient wins the top-k every step is sent every step. Masked, its
    velocity is zeroed each time and S carries the gradient alone (plain SGD's step);
    unmasked, S grows to grad / (1 - m), momentum SGD's step."""
    kv = store(**masked(masking))
    m, steps = 0.9, 30
    steady = np.zeros(SHAPE, np.float32)
    steady[0] = 1.0
    for step in range(steps):
        g = steady + grad(step) * 0.01
        kv.pushpull('conv', mx.nd.array(g))
    delivered = kv.key_state('conv').arrays['0.delivered'][0]
    want = 1.0 if masking == 'always' else (1 - m ** steps) / (1 - m)
    np.testing.assert_allclose(delivered.mean(), want, rtol=0.05)


def check_sgd_on_output(kv, key, shape, reference, steps=6):
    """Weights moved by MXNet's SGD (momentum 0.9) fed the store's output equal weights
    moved by plain SGD fed S, the sum of what was sent: ``reference(codec, grad,
    residual, velocity, S_prev)`` is the spec's step, which gives S."""
    lr, m = 0.1, 0.9
    with_momentum = mx.nd.zeros(shape)
    plain = np.zeros(int(np.prod(shape)), np.float32)
    sgd = mx.optimizer.SGD(learning_rate=lr, momentum=m)
    state = sgd.create_state(0, with_momentum)
    residual = velocity = delivered = None
    for step in range(steps):
        g = grad(step, shape)
        out = mx.nd.array(g)
        kv.pushpull(key, out)
        sgd.update(0, with_momentum, out, state)
        _, delivered, (residual,), (velocity,) = reference(
            kv.plan(key).chunks[0].codec, g, residual, velocity, delivered)
        plain -= lr * delivered.reshape(-1)
        np.testing.assert_allclose(with_momentum.asnumpy().reshape(-1), plain, rtol=1e-5,
                                   atol=1e-6)


def test_sgd_momentum_on_the_output_applies_the_sent_velocities():
    """Hylo's conv top-k: the weights move by -lr S (DGC's update)."""
    check_sgd_on_output(store(), 'conv', SHAPE, lambda codec, g, r, u, d: momentum_topk_step(
        [g], [r], [u], d, 4, 0.9))


@pytest.mark.parametrize('agreement', ['previous', 'conv_round'])
def test_homomorphic_steps_match_the_reference(agreement):
    """One worker: the agreed filters are its own top-k, so the spec holds as is."""
    kv = store(aggregation='homomorphic', agreement=agreement)
    residual = velocity = delivered = None
    for step in range(5):
        g = grad(step)
        out = mx.nd.array(g)
        kv.pushpull('conv', out)
        if agreement == 'conv_round' or step == 0:
            want, delivered, (residual,), (velocity,) = momentum_topk_step(
                [g], [residual], [velocity], delivered, 4, 0.9)
            np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6, atol=1e-7)
        else:       # agreed on the previous step's statistic: other filters, still sums up
            assert np.isfinite(out.asnumpy()).all()
    assert corrected(kv.plan('conv').chunks[0].codec, AdditiveTopKCodec)


# each layer kind's setting and its codecs, which the correction wraps
# (server, homomorphic)
CORRECTED = {'conv': ('momentum_correction', SHAPE, (FilterTopKCodec, AdditiveTopKCodec)),
             'fc': ('fc_momentum_correction', FC_SHAPE,
                    (TernaryCodec, AdditiveTernaryCodec))}


@pytest.mark.parametrize('layer', sorted(CORRECTED))
@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_auto_correction_from_eight_workers(aggregation, layer):
    """momentum_correction='auto' (the default) corrects the conv top-k from 8 workers
    on, and fc_momentum_correction='auto' the FC ternary (its velocity coded); below,
    plain error feedback; 'on' and 'off' hold at any worker count; momentum 0 turns
    either off whatever the setting."""
    from kvstore_ext.schemes import Hylo
    setting_name, shape, plain_codecs = CORRECTED[layer]
    plain = plain_codecs[aggregation == 'homomorphic']
    got = {}
    for setting in ('auto', 'on', 'off'):
        scheme = Hylo(aggregation=aggregation, size_threshold=100, momentum=0.9,
                      **{setting_name: setting})
        for workers in (1, 4, 7, 8, 64):
            scheme.num_workers = workers
            codec = scheme.codec_for(shape, np.float32)
            assert type(innermost(codec)) is plain  # the layer's codec, corrected or not
            got[setting, workers] = corrected(codec, plain)
    assert got == {('auto', 1): False, ('auto', 4): False, ('auto', 7): False,
                   ('auto', 8): True, ('auto', 64): True,
                   **{('on', w): True for w in (1, 4, 7, 8, 64)},
                   **{('off', w): False for w in (1, 4, 7, 8, 64)}}
    assert Hylo().params[setting_name] == 'auto'
    scheme = Hylo(aggregation=aggregation, size_threshold=100, momentum=0.0,
                  **{setting_name: 'on'})
    scheme.num_workers = 8
    assert type(scheme.codec_for(shape, np.float32)) is plain


@pytest.mark.parametrize('mode, plain', [({}, AdditiveTopKCodec),
                                         ({'aggregation': 'server'}, FilterTopKCodec)])
def test_off_by_default(mode, plain):
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(dict({'size_threshold': 100}, **mode))
    kv.pushpull('conv', mx.nd.array(grad(0)))
    assert type(kv.plan('conv').chunks[0].codec) is plain
    with pytest.raises(ValueError, match='momentum'):
        store(momentum=1.0)
    with pytest.raises(ValueError, match='momentum'):
        MomentumCorrected(FilterTopKCodec(SHAPE, 4), momentum=0.0)


# each layer kind with its correction on: (key, shape, the store's extra parameters)
LAYERS = {'conv': ('conv', SHAPE, {}),
          'fc': ('fc', FC_SHAPE, {'fc_momentum_correction': 'on'})}


@pytest.mark.parametrize('bad_value', [np.nan, np.inf])
@pytest.mark.parametrize('layer', sorted(LAYERS))
@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_nan_step_keeps_velocity_and_residual(aggregation, layer, bad_value):
    key, shape, extra = LAYERS[layer]
    kv = store(aggregation=aggregation, **extra)
    kv.pushpull(key, mx.nd.array(grad(0, shape)))
    before = kv.key_state(key).arrays
    bad = grad(1, shape)
    bad.reshape(-1)[7] = bad_value
    out = mx.nd.array(bad)
    kv.pushpull(key, out)
    assert np.isnan(out.asnumpy()).all()
    after = kv.key_state(key).arrays     # server mode: the encoder's status read first
    assert sorted(before) == sorted(after) and any('velocity' in n for n in after)
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    assert kv.key_state(key).residual is not None
    # the next step continues as if the NaN step had not happened
    clean = store(aggregation=aggregation, **extra)
    clean.pushpull(key, mx.nd.array(grad(0, shape)))
    a, b = mx.nd.array(grad(2, shape)), mx.nd.array(grad(2, shape))
    kv.pushpull(key, a)
    clean.pushpull(key, b)
    np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


@pytest.mark.parametrize('layer', sorted(LAYERS))
@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_checkpoint_keeps_velocity_and_delivered(tmp_path, aggregation, layer):
    key, shape, extra = LAYERS[layer]
    kv = store(aggregation=aggregation, **extra)
    for step in range(2):
        kv.pushpull(key, mx.nd.array(grad(step, shape)))
    path = str(tmp_path / 'state.kvx')
    kv.save_compression_state(path)
    names = sorted(kv.key_state(key).arrays)
    assert any('velocity' in n for n in names) and any('delivered' in n for n in names)
    resumed = store(aggregation=aggregation, **extra)
    resumed.load_compression_state(path)
    for step in range(2, 4):
        a, b = mx.nd.array(grad(step, shape)), mx.nd.array(grad(step, shape))
        kv.pushpull(key, a)
        resumed.pushpull(key, b)
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_follow_hands_over_the_optimizers_momentum():
    """The kvstore does not see the optimizer: ``kv.follow`` (what the scripts call, and
    what a Trainer or Module calling the store finds by itself: tests/test_handover.py)
    gives every scheme parameter named ``momentum`` the momentum of SGD or NAG, unless
    the user set it; other optimizers hand over none."""
    def followed(scheme, params, optimizer):
        kv = mx.kv.create('dist_sync_' + scheme)
        kv.set_gradient_compression(params)
        kv.follow(optimizer)
        return {k: v for k, v in kv.scheme.params.items() if k.endswith('momentum')}

    sgd = mx.optimizer.SGD(momentum=0.9)
    assert followed('hylo', {}, sgd) == {'momentum': 0.9}
    assert followed('hylo', {'momentum': 0.0}, sgd) == {'momentum': 0.0}
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'aggregation': 'server'})
    kv.follow(sgd)
    assert kv.scheme.params['aggregation'] == 'server' and kv.scheme.params['momentum'] == 0.9
    assert followed('topk', {}, sgd) == {'momentum': 0.9}
    assert followed('adacomp', {}, sgd) == {'momentum': 0.9}
    assert followed('adacomp', {'momentum': 0}, sgd) == {'momentum': 0}
    assert followed('thc', {}, sgd) == {}
    assert followed('dad', {}, sgd)['fallback.momentum'] == 0.9
    assert followed('dad', {'fallback': 'thc'}, sgd) == {}
    assert followed('hylo', {}, mx.optimizer.NAG(momentum=0.8)) == {'momentum': 0.8}
    assert followed('hylo', {}, mx.optimizer.Adam()) == {'momentum': 0.0}
    assert followed('hylo', {}, mx.optimizer.SGD(momentum=0.0)) == {'momentum': 0.0}


def reference_chunks(plan):
    """Per chunk of a key: [first element, codec, residual, velocity, S_prev], the
    spec's state (None before the first step)."""
    return [[c.start * c.codec.chunk_layout()[1], c.codec, None, None, None]
            for c in plan.chunks]


def push_fc(kv, step, shape, chunks):
    """One pushpull of key 'fc' with ``grad(step, shape)``: (gradient, out, the key's
    plan, the spec's chunks, made at the first step)."""
    g = grad(step, shape)
    out = mx.nd.array(g)
    kv.pushpull('fc', out)
    plan = kv.plan('fc')
    return g, out, plan, chunks or reference_chunks(plan)


def replay_chunks(g, chunks, reference):
    """The spec's sum of one step, chunk by chunk: ``reference(i, codec, piece,
    residual, velocity, S_prev)`` returns (sum, S, (residual,), (velocity,)); the
    chunks' spec state is updated in place."""
    want = np.zeros(g.size, np.float32)
    flat = g.reshape(-1)
    for i, part in enumerate(chunks):
        start, codec, residual, velocity, delivered = part
        piece = flat[start:start + codec.size]
        got, part[4], (part[2],), (part[3],) = reference(i, codec, piece, residual,
                                                         velocity, delivered)
        want[start:start + codec.size] = got
    return want


@pytest.mark.parametrize('chunk_size', [1 << 20, 1024])
def test_element_topk_steps_match_the_reference(chunk_size):
    """dist_sync_topk with momentum: each chunk's steps as the spec's."""
    from kvx_ref.momentum import momentum_element_topk_step
    kv = mx.kv.create('dist_sync_topk')
    kv.set_gradient_compression({'size_threshold': 100, 'ratio': 0.05, 'momentum': 0.9,
                                 'chunk_size': chunk_size})
    shape = (48, 40)
    chunks = None
    for step in range(5):
        g, out, state, chunks = push_fc(kv, step, shape, chunks)
        want = replay_chunks(g, chunks, lambda i, codec, piece, residual, velocity, delivered:
                             momentum_element_topk_step([piece], [residual], [velocity],
                                                        delivered, codec.k, 0.9))
        np.testing.assert_allclose(out.asnumpy().reshape(-1), want, rtol=1e-6, atol=1e-7)
    assert all(corrected(c.codec, ElementTopKCodec) for c in state.chunks)
    assert len(state.chunks) == (2 if chunk_size == 1024 else 1)


def test_padding_index_masks_nothing(monkeypatch):
    """A sent index equal to the row count stands for nothing sent (a fixed-size
    payload's unused entries): the steps stay the spec's."""
    from kvx_ref.momentum import momentum_element_topk_step
    original = ElementTopKCodec.sent_rows

    def padded(self, payload):
        sent = original(self, payload)
        pad = mx.nd.full((3,), self.chunk_layout()[0], dtype=sent.dtype)
        return mx.nd.concat(pad[:1], sent, pad[1:], dim=0)

    monkeypatch.setattr(ElementTopKCodec, 'sent_rows', padded)
    kv = mx.kv.create('dist_sync_topk')
    kv.set_gradient_compression({'size_threshold': 100, 'ratio': 0.05, 'momentum': 0.9})
    shape = (48, 40)
    residual = velocity = delivered = None
    for step in range(4):
        g = grad(step, shape)
        out = mx.nd.array(g)
        kv.pushpull('fc', out)
        kv_k = kv.plan('fc').chunks[0].codec.k
        want, delivered, (residual,), (velocity,) = momentum_element_topk_step(
            [g.reshape(-1)], [residual], [velocity], delivered, kv_k, 0.9)
        np.testing.assert_allclose(out.asnumpy().reshape(-1), want, rtol=1e-6, atol=1e-7)
        kept = kv.key_state('fc').arrays['0.velocity'].reshape(-1)
        np.testing.assert_allclose(kept, velocity, rtol=1e-6, atol=1e-7)
    assert (velocity == 0).sum() >= kv_k      # the masking did act


def adacomp_store(**extra):
    kv = mx.kv.create('dist_sync_adacomp')
    kv.set_gradient_compression(dict({'size_threshold': 100, 'bin_fc': 40,
                                      'momentum': 0.9}, **extra))
    return kv


@pytest.mark.parametrize('chunk_size, max_per_bin, masking', [
    (1 << 20, 30.0, True), (1 << 20, 30.0, False), (1 << 20, 3.0, True), (1024, 30.0, True)])
def test_adacomp_steps_match_the_reference(chunk_size, max_per_bin, masking):
    """dist_sync_adacomp with momentum: each chunk's output, residual and velocity as
    the spec's (kvx_ref/momentum.py momentum_adacomp_step), with the slot partly used
    (max_per_bin 30, bins of 40) and full (3: the overflow rule), one chunk and two;
    masking off through the codec (the scheme always masks)."""
    from kvx_ref.momentum import momentum_adacomp_step
    kv = adacomp_store(chunk_size=chunk_size, max_per_bin=max_per_bin)
    if not masking:
        plan = kv._scheme.codec_for
        kv._scheme.codec_for = lambda *a, **k: (lambda c: MomentumCorrected(
            c.inner, c.momentum, masking=False))(plan(*a, **k))
    shape = (48, 40)
    chunks = None
    fill = set()
    for step in range(6):
        g, out, state, chunks = push_fc(kv, step, shape, chunks)

        def reference(i, codec, piece, residual, velocity, delivered):
            sent = int(kv.key_state('fc').last[i]['sent'].item())
            fill.add('full' if sent == codec.capacity else 'partly' if sent else 'empty')
            return momentum_adacomp_step([piece], [residual], [velocity], delivered,
                                         codec.bin, codec.capacity, 0.9, masking)

        want = replay_chunks(g, chunks, reference)
        for i, part in enumerate(chunks):
            kept = kv.key_state('fc').arrays['%d.velocity' % i].reshape(-1)
            np.testing.assert_allclose(kept, part[3], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(out.asnumpy().reshape(-1), want, rtol=1e-6, atol=1e-7)
        residual = kv.key_state('fc').residual.reshape(-1)
        np.testing.assert_allclose(residual, np.concatenate([p[2] for p in chunks]),
                                   rtol=1e-6, atol=1e-7)
    assert all(corrected(c.codec, AdaCompCodec) and c.codec.masking == masking
               for c in state.chunks)
    assert len(state.chunks) == (2 if chunk_size == 1024 else 1)
    assert fill == ({'full'} if max_per_bin < 10 else {'partly'}), fill


@pytest.mark.parametrize('n', [5000, (1 << 23) + 37])
def test_adacomp_sent_indices(n):
    """The codec reads the elements sent from its payload as the spec does, one-word
    entries and two-word entries (above 2**23 elements), the slot's unused entries
    standing for nothing (index n)."""
    from kvx_ref import codecs as ref
    codec = AdaCompCodec((n,), 500, 3.0)
    rng = np.random.default_rng(n)
    g = np.zeros(n, np.float32)
    hot = rng.choice(n, 8 if n < 1 << 20 else 300, replace=False)
    hot[0] = n - 1                              # the last element: the largest code
    g[hot] = rng.standard_normal(hot.size).astype(np.float32)
    payload, _, status = ref.adacomp_encode(g, np.zeros(n, np.float32), 500, codec.capacity)
    assert status == 0 and payload.size == codec.payload_words()
    count = int(payload[6])
    assert 0 < count < codec.capacity
    got = codec.sent_rows(mx.nd.array(payload, dtype=np.float32)).asnumpy()
    want = np.flatnonzero(ref.adacomp_decode(payload[:8 + int(payload[7])], n)[0])
    assert got.dtype == np.int64 and got.size == codec.capacity
    np.testing.assert_array_equal(got[:count], want)
    assert (got[count:] == n).all() and n - 1 in got[:count]


def test_adacomp_sent_indices_of_a_void_payload_name_nothing():
    """A void payload (the encoder met a NaN: first word NaN, the rest zeros) sends
    nothing: every slot entry reads as n."""
    codec = AdaCompCodec((5000,), 500, 3.0)
    payload = np.zeros(codec.payload_words(), np.float32)
    payload[0] = np.nan
    got = codec.sent_rows(mx.nd.array(payload, dtype=np.float32)).asnumpy()
    assert got.dtype == np.int64 and (got == 5000).all()


@pytest.mark.parametrize('n', [5000, (1 << 24) + 37])
def test_element_topk_sent_indices(n):
    """The codec reads the elements sent from its payload as the spec does, one-word
    and two-word indices (above 2**24 elements)."""
    from kvx_ref import codecs as ref
    codec = ElementTopKCodec((n,), 0.0001 if n > 1 << 20 else 0.01)
    rng = np.random.default_rng(n)
    g = rng.standard_normal(n).astype(np.float32)
    g[n - 1] = 100.0                            # the last element: the largest index
    payload, _, status = ref.element_topk_encode(g, np.zeros(n, np.float32), codec.k)
    assert status == 0 and payload.size == codec.payload_words()
    got = codec.sent_rows(mx.nd.array(payload, dtype=np.float32)).asnumpy()
    want = np.flatnonzero(ref.element_topk_decode(payload, n)[0])
    assert got.dtype == np.int64 and got.size == codec.k
    np.testing.assert_array_equal(got, want)
    assert n - 1 in got


@pytest.mark.parametrize('op_name, attrs', [
    ('kvx_element_topk_sent', {'n': 100, 'k': 5}), ('kvx_adacomp_sent', {'n': 100, 'capacity': 5})])
def test_sent_ops_reject_a_payload_of_another_size(op_name, attrs):
    from kvstore_ext.ops import op
    with pytest.raises(mx.base.MXNetError, match='is not the'):
        op(op_name)(mx.nd.zeros((9,)), **attrs).wait_to_read()


def test_adacomp_sgd_momentum_on_the_output_applies_the_sent_velocities():
    from kvx_ref.momentum import momentum_adacomp_step
    check_sgd_on_output(adacomp_store(), 'fc', (48, 40),
                        lambda codec, g, r, u, d: momentum_adacomp_step(
                            [g.reshape(-1)], [r], [u], d, codec.bin, codec.capacity, 0.9))


def test_adacomp_momentum_off_by_default():
    kv = mx.kv.create('dist_sync_adacomp')
    kv.set_gradient_compression({'size_threshold': 100})
    kv.pushpull('fc', mx.nd.array(grad(0, (48, 40))))
    assert type(kv.plan('fc').chunks[0].codec) is AdaCompCodec
    with pytest.raises(ValueError, match='momentum'):
        adacomp_store(momentum=1.0)
    with pytest.raises(ValueError, match='momentum'):
        MomentumCorrected(AdaCompCodec((5000,), 500, 3.0), momentum=0.0)


def fc_store(**extra):
    return store(**LAYERS['fc'][2], **extra)


@pytest.mark.parametrize('chunk_size', [1 << 20, 1024])
def test_fc_server_steps_match_the_reference(chunk_size):
    """Hylo's FC ternary coding the velocity: each chunk's steps as the spec's, the
    velocity never masked."""
    from kvx_ref.momentum import momentum_ternary_step
    kv = fc_store(chunk_size=chunk_size)
    chunks = None
    for step in range(5):
        g, out, state, chunks = push_fc(kv, step, FC_SHAPE, chunks)
        want = replay_chunks(g, chunks, lambda i, codec, piece, residual, velocity, delivered:
                             momentum_ternary_step([piece], [residual], [velocity],
                                                   delivered, 2.0, 0.9))
        np.testing.assert_allclose(out.asnumpy().reshape(-1), want, rtol=1e-6, atol=1e-7)
        for i, part in enumerate(chunks):
            kept = kv.key_state('fc').arrays['%d.velocity' % i].reshape(-1)
            np.testing.assert_allclose(kept, part[3], rtol=1e-6, atol=1e-7)
    assert all(corrected(c.codec, TernaryCodec) for c in state.chunks)
    assert len(state.chunks) == (2 if chunk_size == 1024 else 1)
    assert 'no masking' in state.chunks[0].codec.describe()


def test_fc_sgd_momentum_on_the_output_applies_the_sent_velocities():
    """The FC ternary: S is the sum of the sent (never masked) velocities."""
    from kvx_ref.momentum import momentum_ternary_step
    check_sgd_on_output(fc_store(), 'fc', FC_SHAPE,
                        lambda codec, g, r, u, d: momentum_ternary_step(
                            [g.reshape(-1)], [r], [u], d, 2.0, 0.9))
