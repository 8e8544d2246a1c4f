"""dist_sync_lgreco: L-GreCo's choice of PowerSGD ranks, in one process and in a real
2-worker ps-lite job.

The test recomputes the policy on its own: the error-compensated gradients it fed
(gradient + the residual the store held before the step), their sum over the window,
the best rank-c errors chunk by chunk from NumPy's SVD, and the cheapest combination
of ranks by brute force under the discretised budget of the default rank.
"""
import itertools
import json
import os

import numpy as np
import pytest
import mxnet as mx

import kvstore_ext  # noqa: F401
from kvstore_ext import chunking
from kvstore_ext.codecs import PowerSGDCodec
from kvstore_ext.memory import ChunkState
from kvstore_ext.schemes.lgreco import LGreCo, candidate_ranks

from test_powersgd import run_workers
from test_dist_aggregate import JOB, launch

f32 = np.float32
SHAPES = {'a': (96, 400), 'b': (60, 90), 'c': (40, 30, 3), 'bias': (40,)}
PARAMS = {'size_threshold': 0, 'chunk_size': 12800, 'adjust_freq': 4, 'window': 3}


def gradient(key, step):
    """Layers of different character: 'a' (large) nearly rank 2, 'b' (small) a steep
    spectrum on a fixed basis, 'c' noise: their errors fall differently with the rank,
    so that the cheapest ranks within the default's total error are not all 4."""
    rng = np.random.default_rng([step, sorted(SHAPES).index(key)])
    shape = SHAPES[key]
    fixed = np.random.default_rng(99)
    if key == 'a':
        low = fixed.standard_normal((96, 2)) @ fixed.standard_normal((2, 400))
        return (low + 0.05 * rng.standard_normal(shape)).astype(f32)
    if key == 'b':
        u = np.linalg.qr(fixed.standard_normal((60, 60)))[0]
        v = np.linalg.qr(fixed.standard_normal((90, 60)))[0]
        spectrum = 30 * 0.6 ** np.arange(60) * (1 + 0.1 * rng.standard_normal(60))
        return ((u * spectrum) @ v.T).astype(f32)
    return rng.standard_normal(shape).astype(f32)


def residual_before(kv, key, shape):
    """The residual the store holds for ``key`` before its next step (zeros before
    its first, or if its codec keeps none)."""
    held = kv.key_state(key).residual if key in kv.codec_plan() else None
    return np.zeros(shape, f32) if held is None else held


def assert_nothing_lost(kv, sent, total):
    """Error feedback loses nothing across re-plans: what came back for each key plus
    the residual it holds is the sum of its gradients."""
    for key in total:
        res = kv.key_state(key).residual
        held = res if res is not None else 0
        np.testing.assert_allclose(sent[key] + held, total[key], rtol=1e-4, atol=1e-3)


def expected_choice(scheme, sums, shapes=SHAPES):
    """{key: rank} the policy must pick for these summed compensated gradients."""
    keys = sorted(sums)
    table = []
    for key in keys:
        rows = shapes[key][0]
        m = sums[key].reshape(rows, -1)
        options = []
        for r in candidate_ranks(scheme.params['rank']):
            codec = PowerSGDCodec(shapes[key], r)
            chunks = chunking.split(codec, scheme.params['chunk_size'])
            if not all(c.codec.compressible() for c in chunks):
                continue
            err2 = size = 0
            for c in chunks:
                s = np.linalg.svd(m[c.start:c.stop], compute_uv=False)
                err2 += (s[r:] ** 2).sum()
                size += r * (c.codec.rows + c.codec.cols)
            options.append((r, np.sqrt(err2), size))
        table.append(options)
    return brute_force_choice(keys, table, [scheme.params['rank']] * len(keys),
                              scheme.params['buckets'])


def brute_force_choice(keys, table, defaults, buckets):
    """{key: value} of least total size whose bucketed errors fit the budget (the
    defaults' total error in ``buckets``), by trying every combination. ``table``: per
    key, [(value, error, size)]."""
    budget = sum(e for options, d in zip(table, defaults) for v, e, _ in options if v == d)
    width = budget / buckets
    best = None
    for combo in itertools.product(*table):
        used = sum(int(np.floor(e / width * (1 + 1e-12))) for _, e, _ in combo)
        if used > buckets:
            continue
        cost = (sum(s for _, _, s in combo), used)
        if best is None or cost < best[0]:
            best = (cost, {k: v for k, (v, _, _) in zip(keys, combo)})
    return best[1]


def ranks_of(kv, key):
    """The rank of every chunk of a key (None: uncompressed)."""
    return {getattr(c.codec, 'rank', None) for c in kv.plan(key).chunks}


def test_candidates_and_schedule():
    assert candidate_ranks(4) == [2, 3, 4, 6, 8]
    assert candidate_ranks(1) == [1, 2]
    with pytest.raises(ValueError):
        LGreCo(adjust_freq=4, window=5)
    scheme = LGreCo(adjust_freq=8, window=3)
    scheme.codec_for_key('w', (512, 784), f32)
    assert [s for s in range(20) if scheme.replans_at(s)] == [8, 16]
    assert [s for s in range(20) if scheme.observes('w', s, 0)] == [5, 6, 7, 13, 14, 15]
    assert not any(scheme.observes('w', s, 1) for s in range(20))     # rank 0 measures
    assert not scheme.observes('other', 7, 0)                          # not a layer
    assert LGreCo().params['adjust_freq'] == 32


def test_policy_picks_the_knapsack_ranks():
    """Over three re-plans: the ranks are the recomputed optimum, every chunk of a key
    has its key's rank, plans change only at multiples of adjust_freq, a Q whose rank
    changed starts afresh from the seeded Gaussian, and error feedback loses nothing
    across re-plans (what came back + the residual = the gradients)."""
    kv = mx.kv.create('dist_sync_lgreco')
    kv.set_gradient_compression(PARAMS)
    scheme = kv.scheme
    sums, sent, total, plans, changed = {}, {}, {}, [], 0
    for step in range(13):
        if step and step % 4 == 0:
            want = expected_choice(scheme, sums)
            sums = {}
        for key in SHAPES:
            grad = gradient(key, step)
            before = residual_before(kv, key, SHAPES[key])
            if key != 'bias' and step % 4 >= 1:
                sums[key] = sums.get(key, 0) + (grad + before).astype(np.float64)
            old_rank = ranks_of(kv, key) if key in kv.codec_plan() else None
            if step and step % 4 == 0 and key == 'a':
                # what fresh codecs of the chosen rank (no Q yet) do with this residual
                fresh = PowerSGDCodec(SHAPES[key], want[key])
                fresh_out = np.concatenate([run_workers(
                    c.codec, [grad[c.start:c.stop]],
                    [ChunkState(mx.nd.array(before[c.start:c.stop]), {}, '0.')])[0].asnumpy()
                    for c in chunking.split(fresh, PARAMS['chunk_size'])])
            value = mx.nd.array(grad)
            kv.pushpull(key, value)
            out = value.asnumpy()
            sent[key] = sent.get(key, 0) + out.astype(np.float64)
            total[key] = total.get(key, 0) + grad.astype(np.float64)
            if key == 'bias':
                assert ranks_of(kv, key) == {None}
                continue
            ranks = ranks_of(kv, key)
            assert len(ranks) == 1                       # every chunk the same rank
            if step and step % 4 == 0:
                assert ranks == {want[key]}, (step, key, ranks, want)
                q_shapes = {arrays['Q'].shape for arrays in kv.key_state(key).chunks}
                assert q_shapes == {(int(np.prod(SHAPES[key][1:])), want[key])}
                if key == 'a' and ranks != old_rank:
                    changed += 1
                    np.testing.assert_allclose(out, fresh_out, rtol=1e-5, atol=1e-5)
            elif step:
                assert ranks == old_rank                 # no change between re-plans
        plans.append(kv.codec_plan())
        assert_nothing_lost(kv, sent, total)
    # 'a' holds 3x chunk_size elements, its factors far fewer: one chunk
    assert plans[0]['a'] == 'powersgd rank 4 of 96 x 400' and len(kv.plan('a').chunks) == 1
    assert [s for s, _ in scheme.history] == [4, 8, 12]
    assert changed >= 1                          # 'a' (nearly rank 2) left rank 4
    assert any(plans[4][k] != plans[0][k] for k in ('a', 'b', 'c'))


def test_settle_rounds_are_counted_in_the_bytes():
    """comm_stats counts every byte the transport reports, the settle rounds of the
    re-plans (rank 0's choice shared with every worker) included."""
    kv = mx.kv.create('dist_sync_lgreco')
    kv.set_gradient_compression(PARAMS)
    transport = kv._transport
    seen = {'settle': [0, 0], 'other': [0, 0]}

    def counted(method):
        def wrapper(key, *args):
            results = method(key, *args)
            kind = 'settle' if key == ('__scheme__', 'settle') else 'other'
            seen[kind][0] += results[-2]
            seen[kind][1] += results[-1]
            return results
        return wrapper

    transport.exchange = counted(transport.exchange)
    transport.pushpull_plain = counted(transport.pushpull_plain)
    for step in range(9):
        for key in SHAPES:
            kv.pushpull(key, mx.nd.array(gradient(key, step)))
    stats = kv.comm_stats()
    assert seen['settle'][0] > 0 and seen['settle'][1] > 0       # two re-plans: 4, 8
    assert stats['push_bytes'] == seen['settle'][0] + seen['other'][0]
    assert stats['pull_bytes'] == seen['settle'][1] + seen['other'][1]
    assert stats['steps'] == 9


DIST_PARAMS = {'size_threshold': 100, 'chunk_size': 4096, 'adjust_freq': 2, 'window': 2}
LGRECO_JOB = os.path.join(os.path.dirname(JOB), 'lgreco_job.py')


def test_dist_two_workers_agree(tmp_path, job_env):
    """A real job, 2 workers and 1 server: every worker re-plans at the same steps to
    the same ranks, the ranks are those rank 0's own measurement gives (not all the
    default: the other worker could not have guessed them), and the workers pull
    bit-identical sums."""
    import lgreco_job as lj
    workers, steps = 2, 5
    launch(tmp_path, job_env, workers, 1, [LGRECO_JOB, '--kvstore', 'dist_sync_lgreco',
                                           '--params', json.dumps(DIST_PARAMS),
                                           '--steps', str(steps), '--out', str(tmp_path)])
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    for step in range(steps):
        assert infos[0]['plans'][str(step)] == infos[1]['plans'][str(step)], step
        for key in lj.SHAPES:
            a, b = (run['out/%s/%d' % (key, step)] for run in runs)
            assert np.array_equal(a, b), 'workers pulled different sums: %s %d' % (key, step)
    scheme = LGreCo(**DIST_PARAMS)
    layers = sorted(k for k, s in lj.SHAPES.items()
                    if isinstance(scheme.codec_for(s, f32), PowerSGDCodec))
    assert layers == ['a', 'b', 'c']
    moved = 0
    for replan in (2, 4):
        sums = {}
        for key in layers:
            for step in (replan - 2, replan - 1):      # rank 0's compensated gradients
                grad = lj.gradient(0, step, key, 0) + lj.gradient(0, step, key, 1)
                res = runs[0]['res/%s/%d' % (key, step - 1)] if step else 0
                sums[key] = sums.get(key, 0) + (grad + res).astype(np.float64)
        want = expected_choice(scheme, sums, lj.SHAPES)
        moved += sum(want[k] != scheme.params['rank'] for k in layers)
        for key in layers:
            got = infos[0]['plans'][str(replan)][key]
            assert got.startswith('powersgd rank %d of' % want[key]), (replan, key, got)
            if replan + 1 < steps:                      # kept until the next re-plan
                assert infos[0]['plans'][str(replan + 1)][key] == got
    assert moved > 0
    assert infos[0]['plans']['1'] == infos[0]['plans']['0']


def assert_resume_continues(kvstore, params, shapes, gradient, moved, tmp_path):
    """A store of ``kvstore`` resumed after a re-plan (3 steps; ``moved(scheme)``: the
    re-plan changed something) keeps the chosen values and continues bit for bit."""
    kv = mx.kv.create(kvstore)
    kv.set_gradient_compression(params)

    def run(store, steps):
        outs = []
        for step in steps:
            for key in shapes:
                value = mx.nd.array(gradient(key, step))
                store.pushpull(key, value)
                outs.append(value.asnumpy())
        return outs

    run(kv, range(3))
    assert moved(kv.scheme)
    path = str(tmp_path / 'state.kvx')
    kv.save_compression_state(path)
    resumed = mx.kv.create(kvstore)
    resumed.load_compression_state(path)
    a, b = run(kv, range(3, 6)), run(resumed, range(3, 6))
    assert resumed.codec_plan() == kv.codec_plan()
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_ranks_survive_a_checkpoint(tmp_path):
    """A store resumed after a re-plan keeps the chosen ranks and continues bit for bit
    (window 1: the next re-plan's measurement is taken after the resume)."""
    assert_resume_continues(
        'dist_sync_lgreco', dict(PARAMS, adjust_freq=2, window=1), SHAPES, gradient,
        lambda scheme: scheme.history and any(r != 4 for r in scheme.history[-1][1].values()),
        tmp_path)
