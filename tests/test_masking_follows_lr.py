"""Hylo's conv masking that follows the learning rate (``momentum_masking='lr'`` with
``store.follow_learning_rate``): a sent filter's velocity is masked while the rate is at
least 0.8 of its peak so far and kept below, against the NumPy spec
(python/kvx_ref/momentum.py); full masking when the rate is not
known or does not change; the peak survives a checkpoint; the scripts make the store
follow their trainer."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import mxnet as mx

from kvx_ref.momentum import momentum_topk_step
from kvstore_ext.codecs import (AdditiveTopKCodec, FilterTopKCodec, HighRateMasking,
                                MomentumCorrected)

SHAPE = (16, 8, 3, 3)
K = 4
PARAMS = {'size_threshold': 100, 'conv_rate': 0.25, 'momentum': 0.9,
          'momentum_correction': 'on',     # 'auto' corrects from 8 workers; these have 1
          'momentum_masking': 'lr'}
# a schedule that rises (warm-up), decays, comes back and reaches 0
RATES = [0.02, 0.1, 0.1, 0.05, 0.09, 0.01, 0.0, 0.07, 0.1]


def masks(lr, peak):
    """The rule: a sent filter's velocity is zeroed while lr >= 0.8 peak, kept below."""
    return lr >= 0.8 * peak


def grad(step):
    return (np.random.default_rng(step).standard_normal(SHAPE) * 0.1).astype(np.float32)


def store(**extra):
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(dict(PARAMS, **extra))
    return kv


class Rate:
    """A learning rate the test sets between steps (what an optimizer's schedule does)."""

    def __init__(self, value):
        self.value = value

    def __call__(self):
        return self.value


def velocity_of(kv):
    return kv.key_state('conv').arrays['0.velocity']


@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_steps_follow_the_rate_as_the_reference(aggregation):
    """One worker (homomorphic: agreed by a round, so the agreed filters are its own
    top-k): a step masks the sent filters' velocity while the rate is high."""
    rate = Rate(RATES[0])
    kv = store(aggregation=aggregation, agreement='conv_round')
    kv.follow_learning_rate(rate)
    residual = velocity = delivered = None
    peak = 0.0
    for step, lr in enumerate(RATES):
        rate.value = lr
        peak = max(peak, lr)
        g = grad(step)
        out = mx.nd.array(g)
        kv.pushpull('conv', out)
        want, delivered, (residual,), (velocity,) = momentum_topk_step(
            [g], [residual], [velocity], delivered, K, 0.9, masks(lr, peak))
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(velocity_of(kv), velocity, rtol=1e-6, atol=1e-7)
        if aggregation == 'server':
            np.testing.assert_array_equal(kv.key_state('conv').residual, residual)
    codec = kv.plan('conv').chunks[0].codec
    assert isinstance(codec, MomentumCorrected)
    assert type(codec.inner) is (FilterTopKCodec if aggregation == 'server'
                                 else AdditiveTopKCodec)
    assert isinstance(codec.masking, HighRateMasking)
    assert codec.describe().endswith('masking follows the learning rate')


@pytest.mark.parametrize('fraction, masked', [(0.9, True), (0.8, True), (0.75, False),
                                               (0.25, False)])
def test_a_decayed_rate_keeps_the_sent_filters_velocity(fraction, masked):
    """Near the peak rate a sent filter loses its velocity (DGC's masking), below 0.8
    of it keeps all of it; an unsent filter always keeps it."""
    rate = Rate(0.1)
    kv = store()
    kv.follow_learning_rate(rate)
    kv.pushpull('conv', mx.nd.array(grad(0)))
    before = velocity_of(kv)
    rate.value = 0.1 * fraction
    g = grad(1)
    kv.pushpull('conv', mx.nd.array(g))
    u = (0.9 * before + g).reshape(SHAPE[0], -1)
    after = velocity_of(kv).reshape(SHAPE[0], -1)
    kept = np.isclose(after, u, rtol=1e-6, atol=1e-7).all(axis=1)
    zeroed = (after == 0).all(axis=1)
    assert (zeroed.sum(), kept.sum()) == ((K, SHAPE[0] - K) if masked else (0, SHAPE[0]))


@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_a_constant_rate_masks_exactly_as_always(aggregation):
    """A constant schedule (the short runs) leaves 'lr' bit-identical to masking at every
    step (what 'lr' does when it follows no rate, and what the removed 'on' did)."""
    on = store(aggregation=aggregation)
    follows = store(aggregation=aggregation)
    follows.follow_learning_rate(lambda: 0.05)
    for step in range(5):
        a, b = mx.nd.array(grad(step)), mx.nd.array(grad(step))
        on.pushpull('conv', a)
        follows.pushpull('conv', b)
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    np.testing.assert_array_equal(velocity_of(on), velocity_of(follows))


def test_lr_the_default_without_a_rate_masks_fully_and_says_so_and_off_never(caplog):
    kv = store()
    with caplog.at_level('WARNING', logger='kvstore_ext'):
        kv.pushpull('conv', mx.nd.array(grad(0)))
    assert kv.plan('conv').chunks[0].codec.masking is True
    assert "does not follow the optimizer's learning rate" in caplog.text
    default = mx.kv.create('dist_sync_hylo')
    default.set_gradient_compression({k: v for k, v in PARAMS.items()
                                      if k != 'momentum_masking'})
    default.follow_learning_rate(lambda: 0.05)
    default.pushpull('conv', mx.nd.array(grad(0)))
    assert isinstance(default.plan('conv').chunks[0].codec.masking, HighRateMasking)
    off = store(momentum_masking='off')
    off.follow_learning_rate(lambda: 0.05)
    off.pushpull('conv', mx.nd.array(grad(0)))
    assert off.plan('conv').chunks[0].codec.masking is False


def test_masking_on_is_removed_with_the_reason():
    """'on' equalled 'lr' at a constant rate and cost the long run: passing it names
    why it went and what to use."""
    with pytest.raises(ValueError, match=r"momentum_masking='on' was removed: .*constant "
                                         r"learning rate.*use instead: "
                                         r"momentum_masking='lr'"):
        store(momentum_masking='on')


def test_follows_an_optimizers_schedule_and_a_trainer():
    """The optimizer's ``learning_rate`` follows its lr_scheduler; masking stops once
    it falls below 0.8 of the peak so far (a cosine over 10 updates: after 2)."""
    schedule = mx.lr_scheduler.CosineScheduler(max_update=10, base_lr=0.1, final_lr=0)
    sgd = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, lr_scheduler=schedule)
    kv = store()
    kv.follow_learning_rate(sgd)
    masking = kv.scheme.masking()
    steps = []
    for update in range(11):
        sgd.num_update = update
        steps.append(masking())
    assert steps == [True] * 3 + [False] * 8
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.2})
    kv = store()
    kv.follow_learning_rate(trainer)
    masking = kv.scheme.masking()
    assert masking() is True
    trainer.set_learning_rate(0.15)
    assert masking() is False
    trainer.set_learning_rate(0.18)     # a schedule that comes back masks again
    assert masking() is True


@pytest.mark.parametrize('source, error', [
    (object(), TypeError), ('0.1', TypeError), (lambda: 'fast', TypeError),
    (lambda: float('nan'), ValueError), (lambda: -0.1, ValueError),
    (lambda: float('inf'), ValueError)])
def test_refuses_what_gives_no_learning_rate(source, error):
    kv = store()
    with pytest.raises(error, match='follow_learning_rate'):
        kv.follow_learning_rate(source)
    assert kv.scheme.learning_rate is None


def test_refused_after_the_first_pushpull():
    kv = store()
    kv.pushpull('conv', mx.nd.array(grad(0)))
    with pytest.raises(RuntimeError, match='before the first pushpull'):
        kv.follow_learning_rate(lambda: 0.1)


def test_a_bad_rate_during_training_or_none_masks_fully():
    assert HighRateMasking()() is True
    rate = Rate(0.1)
    masking = HighRateMasking(rate)
    assert masking() is True
    for bad in (float('nan'), float('inf'), -0.1):
        rate.value = bad
        assert masking() is True
    rate.value = 0.05
    assert masking() is False and masking.peak == 0.1


@pytest.mark.parametrize('follow_first', [True, False])
def test_checkpoint_keeps_the_peak(tmp_path, follow_first):
    """Resumed after the rate has decayed, the masking still measures it against the
    peak before the save, and steps as the run that went on."""
    rate = Rate(0.1)
    kv = store()
    kv.follow_learning_rate(rate)
    for step in range(3):
        kv.pushpull('conv', mx.nd.array(grad(step)))
        rate.value = 0.1 / (step + 2)
    path = str(tmp_path / 'state.kvx')
    kv.save_compression_state(path)
    resumed = store()
    if follow_first:
        resumed.follow_learning_rate(rate)
        resumed.load_compression_state(path)
    else:
        resumed.load_compression_state(path)
        resumed.follow_learning_rate(rate)
    for step in range(3, 6):
        a, b = mx.nd.array(grad(step)), mx.nd.array(grad(step))
        kv.pushpull('conv', a)
        resumed.pushpull('conv', b)
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        rate.value = 0.1 / (step + 2)
    np.testing.assert_array_equal(velocity_of(kv), velocity_of(resumed))
    assert resumed.scheme.masking().peak == 0.1


@pytest.mark.parametrize('script, flags', [
    ('train_mnist.py', ['--log-interval', '0', '--num-batches', '20']),
    ('train_mnist_module.py', ['--num-batches', '20'])])
def test_the_scripts_make_the_store_follow_their_optimizer(tmp_path, script, flags):
    """The Gluon script (one process) hands the store its trainer, the Module script its
    module's optimizer: the conv codec's masking follows the cosine schedule."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          'gluon_scripts', script)
    summary = tmp_path / 'summary.json'
    env = dict(os.environ)
    env.pop('DMLC_ROLE', None)
    proc = subprocess.run(
        [sys.executable, script, '--kvstore', 'dist_sync_hylo', '--num-epochs', '2',
         '--lr-mode', 'cosine', '--compression-params',
         '{"momentum_correction": "on"}',
         '--summary-json', str(summary)] + flags,
        capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    plan = json.loads(summary.read_text())['codec_plan']
    conv = [d for d in plan.values() if d.startswith('top')]
    assert conv and all(d.endswith('masking follows the learning rate') for d in conv), plan


def test_lgreco_over_hylo_saves_the_peak_with_its_choice():
    """L-GreCo's policy over Hylo keeps its layer choice and Hylo's masking peak."""
    kv = mx.kv.create('dist_sync_lgreco_hylo')
    kv.set_gradient_compression(PARAMS)
    kv.follow_learning_rate(lambda: 0.1)
    kv.pushpull('conv', mx.nd.array(grad(0)))
    state = kv.scheme.state()
    assert state['lr_peak'] == 0.1 and 'choice' in state
    again = mx.kv.create('dist_sync_lgreco_hylo')
    again.set_gradient_compression(PARAMS)
    again.scheme.restore(state)
    assert again.scheme.state() == state


def test_dads_fallback_hylo_follows_the_rate():
    """dAD hands the followed rate to its fallback scheme (Hylo), as it does its
    workers."""
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression(dict({'fallback.' + k: v for k, v in PARAMS.items()},
                                     **{'fallback.aggregation': 'server'}))
    kv.follow_learning_rate(lambda: 0.1)
    import kvstore_ext.dad       # dAD refuses a run with no Dense layer attached
    unrelated = mx.gluon.nn.Dense(3, in_units=2)
    kvstore_ext.dad.attach(unrelated)
    kv.pushpull('conv', mx.nd.array(grad(0)))
    codec = kv.plan('conv').chunks[0].codec
    assert isinstance(codec, MomentumCorrected) and isinstance(codec.masking,
                                                                HighRateMasking)
    assert type(codec.inner) is FilterTopKCodec
    assert kv.scheme.state() == {'lr_peak': 0.1}
