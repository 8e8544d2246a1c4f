"""dist_sync_powersgd voids a step on MXNet's engine, without waiting (codecs/powersgd.py,
"A NaN or Inf, without waiting").

No host read waits for a key's backward pass or round trip: the store checks no
gradient before round P, and the codec finds a worker's NaN/Inf in the summed P and Q
(all of each, an overflow too) on the engine, where it keeps the residual and Q and
makes the result NaN. Why the summed P suffices: a NaN/Inf in row i of a worker's M
makes row i of its P = M Q non-finite under IEEE arithmetic, also where Q has an
all-zero row (a column of M that is always zero gives one) and for Inf, not only NaN;
the tests check that MXNet's ``dot`` keeps it, through the codec. Whether this
worker's gradient was finite is a status the store reads at the key's next step.

* Two workers simulated in one process: NaN, Inf and -Inf in the first, middle and
  last row, on a column whose Q row is zero or not, void the step on both workers,
  residuals and Q unchanged, the status naming the worker; the next step is the
  reference's without the void one. Finite gradients whose Q sum overflows, P being
  finite, void the step too.
* One process through the store: a finite gradient whose P overflows voids the step
  instead of spreading NaN into Q and the residual (and warns of no NaN on this
  worker); a NaN warns naming this worker's rank; no key is checked whole and no step
  waits (the keys' plans say ``'deferred'``); a NaN in one chunk of a chunked key voids
  every chunk.
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
from kvstore_ext import chunking, void_steps
from kvstore_ext.checks import deferred_checks
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
    with deferred_checks() as statuses:
        outs = run_workers(codec, bad, states)
    assert [int(status.asscalar()) for status, _ in statuses] == [0, 1]   # worker 1's
    for w, (out, s) in enumerate(zip(outs, states)):
        assert np.isnan(out.asnumpy()).all(), w
        assert s.last['void'].asscalar() == 1, w
        assert np.array_equal(s.residual.asnumpy(), kept[w][0]), w
        assert np.array_equal(s.get('Q').asnumpy(), kept[w][1]), w

    grads = _grads(rng, workers)
    outs = run_workers(codec, grads, states)
    close(outs[0].asnumpy(), want.step(grads))
    for w, s in enumerate(states):
        assert s.last['void'].asscalar() == 0
        close(s.residual.asnumpy(), want.residual(w))


def test_overflowing_q_sum_voids_with_p_finite():
    """Column ZERO_COL of both workers' gradients (Q's row there zero, so it adds nothing
    to P) holds values near the float32 maximum with the signs of P^'s first column: P
    is finite and Q's sum overflows. The step is void on both workers all the same (NaN,
    residual and Q kept), though neither gradient held a NaN: Q's sum counts, not P's
    alone."""
    workers = 2
    codec = PowerSGDCodec(SHAPE, rank=4, seed=5)
    states = [ChunkState(mx.nd.zeros(SHAPE), {}, '0.') for _ in range(workers)]
    rng = np.random.default_rng(14)
    run_workers(codec, _grads(rng, workers), states)
    q = states[0].get('Q').asnumpy()
    assert not q[ZERO_COL].any()                                 # the case holds
    kept = [(s.residual.asnumpy().copy(), s.get('Q').asnumpy().copy()) for s in states]

    bad = _grads(rng, workers)
    p = sum((g + s.residual.asnumpy()) @ q for g, s in zip(bad, states))
    for g in bad:
        g[:, ZERO_COL] = 3e38 * np.sign(ref.orthonormalise(p)[:, 0])
    assert all(np.isfinite(g).all() and np.isfinite(g @ q).all() for g in bad)
    with deferred_checks() as statuses:
        outs = run_workers(codec, bad, states)
    assert [int(status.asscalar()) for status, _ in statuses] == [0, 0]
    for w, (out, s) in enumerate(zip(outs, states)):
        assert np.isnan(out.asnumpy()).all(), w
        assert s.last['void'].asscalar() == 1, w
        assert np.array_equal(s.residual.asnumpy(), kept[w][0]), w
        assert np.array_equal(s.get('Q').asnumpy(), kept[w][1]), w


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
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        kv.pushpull('w', value)
        assert np.isnan(value.asnumpy()).all()
        after = kv.key_state('w')      # reads the step's status
    assert np.array_equal(after.residual, before.residual)
    assert np.array_equal(after.chunks[0]['Q'], before.chunks[0]['Q'])
    assert not caplog.records
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
        assert not caplog.records     # the status is read later, not waited for
        after = kv.key_state('w')     # reads it
    assert np.array_equal(after.residual, before.residual)
    assert np.array_equal(after.chunks[0]['Q'], before.chunks[0]['Q'])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "key 'w'" in warnings[0] and '(rank 0)' in warnings[0]
    assert calls == []


def test_no_key_waits_and_a_nan_in_one_chunk_voids_every_chunk(monkeypatch, caplog):
    """Neither a one-chunk key nor a key cut into chunks is checked whole on the host
    (void_steps.check_finite: the wait for the key's backward pass); both plans say
    ``'deferred'``. A NaN in the last chunk of the chunked key voids all three chunks:
    the whole result is NaN, every chunk's residual and Q stay, one warning."""
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
    assert kv.plan('one').mode == kv.plan('chunked').mode == 'deferred'
    assert calls == []
    before = kv.key_state('chunked')
    grad = low_rank_plus_noise(rng, shapes['chunked'])
    grad[-1, -1] = np.nan
    value = mx.nd.array(grad)
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        kv.pushpull('chunked', value)
        assert np.isnan(value.asnumpy()).all()
        after = kv.key_state('chunked')
    assert np.array_equal(after.residual, before.residual)
    for a, b in zip(after.chunks, before.chunks):
        assert np.array_equal(a['Q'], b['Q'])
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert calls == []


def host_reads(monkeypatch, call):
    """The ids of the NDArrays that ``call()`` reads on the host (``asnumpy``,
    ``asscalar``, ``wait_to_read``: each waits for MXNet's engine)."""
    reads = []
    for name in ('asnumpy', 'asscalar', 'wait_to_read'):
        def counted(array, _original=getattr(mx.nd.NDArray, name)):
            reads.append(id(array))
            return _original(array)
        monkeypatch.setattr(mx.nd.NDArray, name, counted)
    try:
        call()
    finally:
        monkeypatch.undo()
    return reads


@pytest.mark.parametrize('shape, chunk_size', [((96, 400), 1 << 20), ((600, 2000), 4096)])
def test_a_step_reads_nothing_on_the_host(monkeypatch, shape, chunk_size):
    """A steady step of a PowerSGD key, one chunk or several, reads no array on the host
    (``asnumpy``, ``asscalar``, ``wait_to_read``: each waits for the engine, here for
    the key's backward pass and its rounds) but the statuses of the key's previous step,
    long done (void_steps.resolve). Its result is still the reference's."""
    kv = _store(chunk_size=chunk_size)
    chunks = chunking.split(kv.scheme.codec_for(shape, f32), chunk_size)
    want = ref.PowerSGDReference(shape, 1, bounds=[(c.start, c.stop) for c in chunks])
    rng = np.random.default_rng(15)
    for _ in range(2):
        grad = low_rank_plus_noise(rng, shape)
        kv.pushpull('w', mx.nd.array(grad))
        want.step([grad])
    pending = {id(status) for status, _ in kv._keys['w'].pending[1]}
    assert len(pending) == len(chunks)
    grad = low_rank_plus_noise(rng, shape)
    value = mx.nd.array(grad)
    reads = host_reads(monkeypatch, lambda: kv.pushpull('w', value))
    assert reads and set(reads) <= pending
    close(value.asnumpy(), want.step([grad]))


def test_dist_nonfinite_voids_every_worker(tmp_path, job_env):
    """2 workers, 1 server: at step 1 one worker's gradient of each key is non-finite
    (first, middle, last row; NaN, Inf, -Inf; on a column whose Q row is zero) or
    overflows P. Every worker pulls NaN, keeps its residual and Q bit for bit, and
    step 2 is the reference's fed steps 0 and 2. Only the worker whose gradient held
    the value warns, naming its rank; the overflow warns nowhere (no gradient held a
    NaN; the pulled NaN says the step is void)."""
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
    for info in infos:
        assert set(info['modes'].values()) == {'deferred'}
