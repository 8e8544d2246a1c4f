"""dist_sync_lgreco_hylo: L-GreCo's choice of Hylo's knobs (conv filter counts, FC
threshold scales), in one process and in real 2-worker ps-lite jobs, both aggregation
modes.

The errors the scheme measures are held to the NumPy reference codecs (what
``topk_encode`` and ``ternary_encode`` leave in the residual); the choice is held to
a recomputation of the test's own: the compensated gradients it fed, summed over the
window, the errors from plain float64 formulas (top-k by ``topk_select``, the ternary
rule written out), and the cheapest combination by brute force under the
discretised budget of Hylo's defaults.
"""
import json
import math
import os

import numpy as np
import pytest
import mxnet as mx

import kvstore_ext  # noqa: F401
import kvx_ref.codecs as ref
from kvstore_ext import chunking
from kvstore_ext.codecs import (FilterTopKCodec, TernaryCodec, AdditiveTopKCodec,
                                AdditiveTernaryCodec)
from kvstore_ext.schemes.lgreco_hylo import LGreCoHylo

from test_dist_aggregate import JOB, launch
from test_lgreco import (assert_nothing_lost, assert_resume_continues,
                         brute_force_choice, residual_before)

f32 = np.float32
SHAPES = {'a': (64, 8, 3, 3), 'b': (40, 12, 3, 3), 'fc': (90, 100), 'bias': (40,)}
PARAMS = {'size_threshold': 1000, 'chunk_size': 3000, 'adjust_freq': 4, 'window': 3}


def gradient(key, step):
    """'a': energy in 6 fixed filters; 'b': noise; 'fc': heavy tails (Student t)."""
    rng = np.random.default_rng([step, sorted(SHAPES).index(key)])
    shape = SHAPES[key]
    if key == 'a':
        g = 0.05 * rng.standard_normal(shape)
        g[[2, 7, 11, 30, 41, 60]] += 1.0
        return g.astype(f32)
    if key == 'fc':
        return (0.1 * rng.standard_t(3, shape)).astype(f32)
    return rng.standard_normal(shape).astype(f32)


# -- the test's own recomputation -------------------------------------------------------
def own_error(codec, part):
    """Frobenius norm of what ``codec`` (one chunk) loses on ``part`` (float64)."""
    if isinstance(codec, (FilterTopKCodec, AdditiveTopKCodec)):
        rows = part.reshape(part.shape[0], -1)
        scores = (rows ** 2).sum(axis=1)
        unsent = np.setdiff1d(np.arange(rows.shape[0]), ref.topk_select(scores, codec.k))
        return math.sqrt(scores[unsent].sum())
    x = part.reshape(-1)
    t = codec.scale * np.abs(x).mean()
    mask = np.abs(x) >= t
    v = 2 * t if codec.value == 'round' else t
    return float(np.linalg.norm(x - np.sign(x) * v * mask))


def option_table(scheme, shape, summed):
    """[(value, error, size)]: every candidate compressing >= 2x (and the default)."""
    default = scheme.layer_default(shape, f32)
    out = []
    for value in scheme.candidates(shape):
        codec = scheme.codec_with(shape, f32, value)
        chunks = chunking.split(codec, scheme.params['chunk_size'])
        size = sum(w for c in chunks for _, _, w, _ in c.codec.wire_words(1))
        if value != default and 2 * size > summed.size:
            continue
        whole = summed.reshape((shape[0], -1)) if len(shape) >= 3 else summed.reshape(-1)
        err = math.sqrt(sum(own_error(c.codec, whole[c.start:c.stop]) ** 2 for c in chunks))
        out.append((value, err, size))
    return out


def expected_choice(scheme, sums, shapes=SHAPES):
    """{key: value} by brute force over every combination of candidates."""
    keys = sorted(sums)
    table = [option_table(scheme, shapes[k], sums[k]) for k in keys]
    defaults = [scheme.layer_default(shapes[k], f32) for k in keys]
    return brute_force_choice(keys, table, defaults, scheme.params['buckets'])


def values_of(kv, key):
    """Each chunk's knob: k (conv), scale (FC), None (float32)."""
    return [getattr(c.codec, 'k', getattr(c.codec, 'scale', None))
            for c in kv.plan(key).chunks]


# -- candidates, defaults, errors -------------------------------------------------------
def test_candidates_and_defaults():
    at_threshold = LGreCoHylo(size_threshold=4608, aggregation='server')
    # 64 x 8 x 3 x 3 = 4608 weights, at the threshold: rate 0.3, ceil(19.2) = 20 filters;
    # candidates ceil(64 x 0.3 x {0.5, 0.75, 1, 1.5, 2}) = ceil(9.6, 14.4, 19.2, 28.8, 38.4)
    assert at_threshold.layer_default((64, 8, 3, 3), f32) == 20
    assert at_threshold.candidates((64, 8, 3, 3)) == [10, 15, 20, 29, 39]
    # homomorphic (the default): the rate doubled, 0.6: ceil(38.4) = 39, capped at 64
    assert LGreCoHylo(size_threshold=4608).layer_default((64, 8, 3, 3), f32) == 39
    assert LGreCoHylo(size_threshold=4608).candidates((64, 8, 3, 3)) == [20, 29, 39, 58, 64]
    # rate 0.6 on 8 filters: ceil(2.4, 3.6, 4.8, 7.2, 9.6), capped at all 8
    assert LGreCoHylo(conv_rate=0.6).candidates((8, 200, 3, 3)) == [3, 4, 5, 8]
    scheme = LGreCoHylo(**PARAMS)
    assert scheme.layer_default((90, 100), f32) == 2.0             # Hylo's fc_scale
    assert scheme.candidates((90, 100)) == [1.0, 1.5, 2.0, 3.0, 4.0]
    assert LGreCoHylo(fc_scale=1.0).candidates((90, 100)) == [0.5, 0.75, 1.0, 1.5, 2.0]
    assert scheme.layer_default((40,), f32) is None                 # below the threshold
    assert LGreCoHylo(knobs='conv').layer_default((512, 3136), f32) is None
    assert LGreCoHylo(knobs='fc').layer_default((64, 32, 5, 5), f32) is None
    assert LGreCoHylo(fc_threshold=0.01).layer_default((512, 3136), f32) is None
    with pytest.raises(ValueError):
        LGreCoHylo(adjust_freq=4, window=5)
    # before the first re-plan: exactly uniform Hylo's plan
    hylo = mx.kv.create('dist_sync_hylo')
    hylo.set_gradient_compression({k: v for k, v in PARAMS.items()
                                   if k in ('size_threshold', 'chunk_size')})
    ours = mx.kv.create('dist_sync_lgreco_hylo')
    ours.set_gradient_compression(PARAMS)
    for kv in (hylo, ours):
        for key in SHAPES:
            kv.pushpull(key, mx.nd.array(gradient(key, 0)))
    assert ours.codec_plan() == hylo.codec_plan()


@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_errors_and_sizes_match_the_reference(aggregation):
    """Each candidate's error is the norm of the residual the NumPy reference encoder
    leaves (chunk by chunk); its size what the reference payloads hold."""
    scheme = LGreCoHylo(aggregation=aggregation, **PARAMS)
    for key in ('a', 'b', 'fc'):
        shape, acc = SHAPES[key], gradient(key, 3)
        options = scheme.layer_options(shape, acc.astype(np.float64))
        assert len(options) >= 3
        for value, error, size in options:
            chunks = chunking.split(scheme.codec_with(shape, f32, value), PARAMS['chunk_size'])
            assert len(chunks) > 1                      # chunked: each chunk on its own
            lost = words = 0.0
            for c in chunks:
                part = c.view(acc) if len(shape) >= 3 else acc.reshape(-1)[c.start:c.stop]
                zeros = np.zeros_like(part)
                if len(shape) >= 3:
                    payload, residual, status = ref.topk_encode(part, zeros, c.codec.k)
                    words += (payload.size if aggregation == 'server'    # + agreement
                              else c.codec.k * c.codec.filter_size + c.codec.shape[0])
                else:
                    # Hylo's FC default: codes worth 2t ('round'); homomorphic
                    # agreement: two words (sum|acc| and max|acc|, the cap)
                    payload, residual, status = ref.ternary_encode(part, zeros, value,
                                                                   value='round')
                    words += (payload.size if aggregation == 'server'
                              else ref.sum_words(part.size, 1) + 2)
                assert status == ref.OK
                lost += float((residual.astype(np.float64) ** 2).sum())
            np.testing.assert_allclose(error, math.sqrt(lost), rtol=1e-5)
            assert size == words, (key, value)


# -- the policy in one process ----------------------------------------------------------
def test_momentum_correction_is_measured_on_the_velocity():
    """With DGC's momentum correction the conv codec compresses velocity + residual
    (u = m u + grad), and that is what the scheme measures, not grad + residual."""
    kv = mx.kv.create('dist_sync_lgreco_hylo')
    kv.set_gradient_compression(dict(PARAMS, momentum=0.9, momentum_correction='on'))
    want, plain = 0, 0
    for step in range(4):
        grad = gradient('a', step)
        if step >= 1:       # the window: steps 1-3 before the re-plan at 4
            velocity = np.concatenate([arrays['velocity']
                                       for arrays in kv.key_state('a').chunks])
            before = residual_before(kv, 'a', SHAPES['a'])
            want = want + ((f32(0.9) * velocity + grad) + before).astype(np.float64)
            plain = plain + (grad + before).astype(np.float64)
        kv.pushpull('a', mx.nd.array(grad))
    assert len(kv.plan('a').chunks) == 2
    got = kv.scheme._sums['a']
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.abs(got - plain).max() > 0.1


@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_policy_picks_the_brute_force_choice(aggregation):
    """Over three re-plans: the knobs are the brute-force optimum of the test's own
    recomputation, every chunk of a key has its key's value, plans change only at
    multiples of adjust_freq, error feedback loses nothing across re-plans, and the
    choice moved away from the defaults."""
    kv = mx.kv.create('dist_sync_lgreco_hylo')
    kv.set_gradient_compression(dict(PARAMS, aggregation=aggregation))
    scheme = kv.scheme
    sums, sent, total, plans = {}, {}, {}, []
    for step in range(13):
        if step and step % 4 == 0:
            want = expected_choice(scheme, sums)
            sums = {}
        for key in SHAPES:
            grad = gradient(key, step)
            before = residual_before(kv, key, SHAPES[key])
            if key != 'bias' and step % 4 >= 1:
                sums[key] = sums.get(key, 0) + (grad + before).astype(np.float64)
            old = values_of(kv, key) if key in kv.codec_plan() else None
            value = mx.nd.array(grad)
            kv.pushpull(key, value)
            sent[key] = sent.get(key, 0) + value.asnumpy().astype(np.float64)
            total[key] = total.get(key, 0) + grad.astype(np.float64)
            if key == 'bias':
                assert values_of(kv, key) == [None]
                continue
            codec = scheme.codec_with(SHAPES[key], f32, want[key]) if step >= 4 else None
            if step and step % 4 == 0:
                assert kv.plan(key).codec.same_as(codec), (step, key, want)
            elif step:
                assert values_of(kv, key) == old            # no change between re-plans
        plans.append(kv.codec_plan())
        assert_nothing_lost(kv, sent, total)
    assert [s for s, _ in scheme.history] == [4, 8, 12]
    defaults = {k: scheme.layer_default(SHAPES[k], f32) for k in ('a', 'b', 'fc')}
    assert any(scheme.history[0][1][k] != defaults[k] for k in defaults)
    kinds = (AdditiveTopKCodec, AdditiveTernaryCodec) if aggregation == 'homomorphic' \
        else (FilterTopKCodec, TernaryCodec)
    assert all(isinstance(c.codec, kinds) for k in ('a', 'b', 'fc')
               for c in kv.plan(k).chunks)
    assert scheme.state() == {'choice': {'s:' + k: v
                                         for k, v in scheme.history[-1][1].items()}}


def test_changes_are_logged(caplog):
    kv = mx.kv.create('dist_sync_lgreco_hylo')
    kv.set_gradient_compression(PARAMS)
    with caplog.at_level('INFO', logger='kvstore_ext'):
        for step in range(5):
            for key in SHAPES:
                kv.pushpull(key, mx.nd.array(gradient(key, step)))
    lines = [r.getMessage() for r in caplog.records if 'L-GreCo' in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith('L-GreCo at step 4, Hylo knobs: ')
    moved = {k for k, v in kv.scheme.history[0][1].items()
             if v != kv.scheme.layer_default(SHAPES[k], f32)}
    assert moved and all(("%s: " % k) in lines[0] for k in moved)


def test_choice_survives_a_checkpoint(tmp_path):
    """A store resumed after a re-plan keeps the chosen knobs and continues bit for bit
    (window 1: the next re-plan's measurement is taken after the resume)."""
    assert_resume_continues(
        'dist_sync_lgreco_hylo', dict(PARAMS, adjust_freq=2, window=1), SHAPES, gradient,
        lambda scheme: any(v != scheme.layer_default(SHAPES[k], f32)
                           for k, v in scheme.history[-1][1].items()), tmp_path)


# -- a real job -------------------------------------------------------------------------
DIST_PARAMS = {'size_threshold': 100, 'chunk_size': 1024, 'adjust_freq': 2, 'window': 2}
LGRECO_HYLO_JOB = os.path.join(os.path.dirname(JOB), 'lgreco_hylo_job.py')


@pytest.mark.parametrize('aggregation', ['server', 'homomorphic'])
def test_dist_two_workers_agree(tmp_path, job_env, aggregation):
    """A real job, 2 workers and 1 server: every worker re-plans at the same steps to
    the same knobs, which are those rank 0's own measurement gives (not all Hylo's
    defaults: the other worker could not have guessed them), and the workers pull
    bit-identical sums."""
    import lgreco_hylo_job as lj
    workers, steps = 2, 5
    params = dict(DIST_PARAMS, aggregation=aggregation)
    launch(tmp_path, job_env, workers, 1, [LGRECO_HYLO_JOB, '--kvstore',
                                           'dist_sync_lgreco_hylo', '--params',
                                           json.dumps(params), '--steps', str(steps),
                                           '--out', str(tmp_path)])
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    for step in range(steps):
        assert infos[0]['plans'][str(step)] == infos[1]['plans'][str(step)], step
        for key in lj.SHAPES:
            a, b = (run['out/%s/%d' % (key, step)] for run in runs)
            assert np.array_equal(a, b), 'workers pulled different sums: %s %d' % (key, step)
    scheme = LGreCoHylo(**params)
    layers = sorted(k for k, s in lj.SHAPES.items()
                    if scheme.layer_default(s, f32) is not None)
    assert layers == ['a', 'b', 'fc']
    moved = 0
    for replan in (2, 4):
        sums = {}
        for key in layers:
            for step in (replan - 2, replan - 1):      # rank 0's compensated gradients
                grad = lj.gradient(0, step, key, 0) + lj.gradient(0, step, key, 1)
                res = runs[0]['res/%s/%d' % (key, step - 1)] if step else 0
                sums[key] = sums.get(key, 0) + (grad + res).astype(np.float64)
        want = expected_choice(scheme, sums, lj.SHAPES)
        moved += sum(want[k] != scheme.layer_default(lj.SHAPES[k], f32) for k in layers)
        for key in layers:
            got = infos[0]['plans'][str(replan)][key]
            assert got == scheme.codec_with(lj.SHAPES[key], f32, want[key]).describe(), \
                (replan, key, got, want)
            if replan + 1 < steps:                      # kept until the next re-plan
                assert infos[0]['plans'][str(replan + 1)][key] == got
    assert moved > 0
    assert infos[0]['plans']['1'] == infos[0]['plans']['0']


def test_warmup_is_hylos():
    """Through Hylo's dense warm-up the plans are uniform Hylo's, step by step (chosen
    values apply only after it)."""
    params = dict(PARAMS, warmup_steps=2)
    hylo = mx.kv.create('dist_sync_hylo')
    hylo.set_gradient_compression({k: v for k, v in params.items()
                                   if k not in ('adjust_freq', 'window')})
    ours = mx.kv.create('dist_sync_lgreco_hylo')
    ours.set_gradient_compression(params)
    assert ours.scheme.steady_step() == 2
    plans = []
    for step in range(4):
        for kv in (hylo, ours):
            for key in SHAPES:
                kv.pushpull(key, mx.nd.array(gradient(key, step)))
        assert ours.codec_plan() == hylo.codec_plan(), step
        plans.append(ours.codec_plan()['a'])
    # the default (homomorphic) doubles the layer-adaptive rate: 18 filters, not 9
    assert plans[:2] == ['fp32', 'fp32'] and plans[2] == plans[3] and \
        plans[3].startswith('top 18 of 64')     # float32 (steps 0, 1), then compressed
