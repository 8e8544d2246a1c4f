"""dist_sync_powersgd finds a NaN/Inf from its own summed rounds (void_sums.py).

A one-chunk PowerSGD key is not checked whole before round P (that check waited for
the key's backward pass); the codec checks all of the summed P, and the summed Q before
the residual is written, so a non-finite value in any worker's gradient, or a sum that
overflows, voids the step on every worker and leaves every residual and Q as it was.
Why the summed P suffices: a NaN/Inf in row i of a worker's M makes row i of its
P = M Q non-finite under IEEE arithmetic, also where Q has an all-zero row (a column of
M that is always zero gives one) and for Inf, not only NaN; the tests check that MXNet's
``dot`` keeps it, through the codec.

* Two workers simulated in one process: NaN, Inf and -Inf in the first, middle and
  last row, on a column whose Q row is zero or not, void the step on both workers,
  residuals and Q unchanged; the next step is the reference's without the void one.
* One process through the store: a finite gradient whose P overflows voids the step
  instead of spreading NaN into Q and the residual (and warns of no NaN on this
  worker); a NaN warns naming this worker's rank; a one-chunk key's plan says
  ``'sums'`` and the store never checks its whole gradient, a chunked key's still is.
* A real ps-lite job (2 workers, 1 server): every case void on both workers, state
  unchanged, the warning naming the right rank on that worker only.
"""
import json
import logging

import numpy as np
import pytest
import mxnet as mx

from kvx_ref import powersgd as ref

import kvstore_ext  # noqa: F401
from kvstore_ext import void_steps
from kvstore_ext.codecs import PowerSGDCodec
from kvstore_ext.memory import ChunkState

import powersgd_void_job as job
from test_dist_aggregate import launch
from test_powersgd import _store, close, low_rank_plus_noise, run_workers

f32 = np.float32
SHAPE, ZERO_COL, OTHER_COL = (40, 60), 7, 11
ROWS = {'first': 0, 'middle': 20, 'last': 39}


def _grads(rng, workers):
    """Gradient-like, column ZERO_COL zero: after a step Q's row ZERO_COL is zero."""
    grads = [low_rank_plus_noise(rng, SHAPE) for _ in range(workers)]
    for g in grads:
        g[:, ZERO_COL] = 0
    return grads


@pytest.mark.parametrize('row', sorted(ROWS))
@pytest.mark.parametrize('value', [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize('column', [OTHER_COL, ZERO_COL])
def test_nonfinite_gradient_voids_in_the_sums(row, value, column):
    """Worker 1's M holds ``value`` at (row, column) at step 1, column ZERO_COL's Q row
    being exactly zero: both workers' steps return NaN, flag the step void, and keep
    residual and Q bit for bit; step 2 is the reference's fed steps 0 and 2."""
    workers = 2
    codec = PowerSGDCodec(SHAPE, rank=4, seed=5)
    states = [ChunkState(mx.nd.zeros(SHAPE), {}, '0.') for _ in range(workers)]
    want = ref.PowerSGDReference(SHAPE, workers, rank=4, seed=5)
    rng = np.random.default_rng(11)
    grads = _grads(rng, workers)
    run_workers(codec, grads, states)
    want.step(grads)
    q = states[0].get('Q').asnumpy()
    assert not q[ZERO_COL].any() and q[OTHER_COL].all()        # the case holds
    kept = [(s.residual.asnumpy().copy(), s.get('Q').asnumpy().copy()) for s in states]

    bad = _grads(rng, workers)
    bad[1][ROWS[row], column] = value
    outs = run_workers(codec, bad, states)
    for w, (out, s) in enumerate(zip(outs, states)):
        assert np.isnan(out.asnumpy()).all(), w
        assert s.last['void'] is True, w
        assert np.array_equal(s.residual.asnumpy(), kept[w][0]), w
        assert np.array_equal(s.get('Q').asnumpy(), kept[w][1]), w

    grads = _grads(rng, workers)
    outs = run_workers(codec, grads, states)
    close(outs[0].asnumpy(), want.step(grads))
    for w, s in enumerate(states):
        assert s.last['void'] is False
        close(s.residual.asnumpy(), want.residual(w))


def test_overflowing_p_voids_instead_of_corrupting(caplog):
    """A finite gradient with a row aligned with Q's first column, of values near the
    float32 maximum: P's middle row overflows to Inf (the first word stays finite).
    The step is void (NaN), the residual and Q stay as they were, and since this
    worker's gradient was finite it warns of no NaN of its own; the next step is the
    reference's fed the finite steps only."""
    kv = _store(rank=4)
    want = ref.PowerSGDReference(SHAPE, 1, rank=4)
    rng = np.random.default_rng(12)
    grad = low_rank_plus_noise(rng, SHAPE)
    kv.pushpull('w', mx.nd.array(grad))
    want.step([grad])
    before = kv.key_state('w')
    huge = low_rank_plus_noise(rng, SHAPE)
    huge[20] = 3e38 * np.sign(before.chunks[0]['Q'][:, 0])
    assert np.isfinite(huge).all()
    value = mx.nd.array(huge)
    with caplog.at_level(logging.INFO, logger='kvstore_ext'):
        kv.pushpull('w', value)
    assert np.isnan(value.asnumpy()).all()
    after = kv.key_state('w')
    assert np.array_equal(after.residual, before.residual)
    assert np.array_equal(after.chunks[0]['Q'], before.chunks[0]['Q'])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any('non-finite' in r.getMessage() and 'overflowed' in r.getMessage()
               for r in caplog.records)
    grad = low_rank_plus_noise(rng, SHAPE)
    value = mx.nd.array(grad)
    kv.pushpull('w', value)
    close(value.asnumpy(), want.step([grad]))
    close(kv.key_state('w').residual, want.residual(0))


def test_nan_found_in_the_sums_warns_naming_this_worker(caplog, monkeypatch):
    """One worker, a NaN in the last row: found in the sums, not by a whole-gradient
    check (none runs), the step is void, the residual and Q stay, and the warning names
    the key and this worker's rank."""
    calls = []
    monkeypatch.setattr(void_steps, 'check_finite', lambda key, grad: calls.append(key))
    kv = _store(rank=4)
    rng = np.random.default_rng(13)
    kv.pushpull('w', mx.nd.array(low_rank_plus_noise(rng, SHAPE)))
    before = kv.key_state('w')
    grad = low_rank_plus_noise(rng, SHAPE)
    grad[-1, 3] = np.nan
    value = mx.nd.array(grad)
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        kv.pushpull('w', value)
    assert np.isnan(value.asnumpy()).all()
    after = kv.key_state('w')
    assert np.array_equal(after.residual, before.residual)
    assert np.array_equal(after.chunks[0]['Q'], before.chunks[0]['Q'])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "key 'w'" in warnings[0] and '(rank 0)' in warnings[0]
    assert calls == []


def test_whole_gradient_checked_only_when_chunked(monkeypatch):
    """A one-chunk key's plan is ``'sums'`` and the store never calls
    void_steps.check_finite on it (the wait for its backward pass); a key cut into
    chunks is still checked whole at every step (a NaN in one chunk's rows would void
    only that chunk's P)."""
    calls = []
    check = void_steps.check_finite

    def counted(key, grad):
        calls.append(key)
        return check(key, grad)
    monkeypatch.setattr(void_steps, 'check_finite', counted)
    kv = _store(chunk_size=4096)
    rng = np.random.default_rng(14)
    shapes = {'one': (96, 400), 'chunked': (600, 2000)}
    for step in range(3):
        for key, shape in shapes.items():
            kv.pushpull(key, mx.nd.array(low_rank_plus_noise(rng, shape)))
    assert len(kv.plan('one').chunks) == 1 and len(kv.plan('chunked').chunks) == 3
    assert kv.plan('one').mode == 'sums'
    assert kv.plan('chunked').mode == 'checked'
    assert calls == ['chunked'] * 3


def test_dist_nonfinite_voids_every_worker(tmp_path, job_env):
    """2 workers, 1 server: at step 1 one worker's gradient of each key is non-finite
    (first, middle, last row; NaN, Inf, -Inf; on a column whose Q row is zero) or
    overflows P. Every worker pulls NaN, keeps its residual and Q bit for bit, and
    step 2 is the reference's fed steps 0 and 2. Only the worker whose gradient held
    the value warns, naming its rank; the overflow warns nowhere."""
    workers = 2
    launch(tmp_path, job_env, workers, 1, [job.__file__, '--out', str(tmp_path)],
           timeout=150)
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    codec = PowerSGDCodec(job.SHAPE, job.PARAMS['rank'])
    for key, (bad_rank, _, _, value) in job.CASES.items():
        want = ref.PowerSGDReference(job.SHAPE, workers, rank=codec.rank)
        for step in (0, 2):
            grads = [job.gradient(w, step, key) for w in range(workers)]
            outs = [run['out/%s/%d' % (key, step)] for run in runs]
            assert np.array_equal(outs[0], outs[1]), (key, step)
            close(outs[0], want.step(grads), rel=1e-4)
            for w, run in enumerate(runs):
                close(run['res/%s/%d' % (key, step)], want.residual(w), rel=1e-4)
        for w, (run, info) in enumerate(zip(runs, infos)):
            assert not run['q/%s/0' % key][job.ZERO_COL].any()  # Q's zero row
            assert np.isnan(run['out/%s/1' % key]).all(), (key, w)
            for name in ('res', 'q'):
                assert np.array_equal(run['%s/%s/1' % (name, key)],
                                      run['%s/%s/0' % (name, key)]), (key, w, name)
            warned = [m for level, m in info['logs']
                      if level == 'WARNING' and "key '%s'" % key in m]
            if w == bad_rank and value is not None:
                assert len(warned) == 1 and '(rank %d)' % w in warned[0], (key, w, warned)
            else:
                assert warned == [], (key, w, warned)
                assert any(level == 'INFO' and "key '%s'" % key in m
                           for level, m in info['logs']), (key, w)
    for info in infos:
        assert set(info['modes'].values()) == {'sums'}
