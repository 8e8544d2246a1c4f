"""dist_sync_powersgd: the codec against the NumPy reference (python/kvx_ref/powersgd.py).

* One process: outputs, residuals and the warm-start Q of a store equal the reference's
  (to float32 rounding: MXNet's gemm and the plugin's QR against NumPy in float64),
  chunks included; several workers simulated in one process by driving their steps
  with a summing exchange; the orthonormalisation (the plugin's QR) against NumPy's,
  rank-deficient and zero input included; a low-rank gradient comes back exactly; the scheme's
  choices (1-D, small, not 2x smaller in some chunk, warm-up); bytes.
* Real ps-lite jobs (2 workers and 2 servers, 4 workers and 1 server with a warm-up
  step and rank 2): every worker pulls the same sum, bit for bit (the workers agree on
  the orthonormalised P), equal to the reference fed the same gradients, and the
  workers' residuals are the reference's; what came back plus what the residuals hold
  is the sum of the gradients.
"""
import json

import numpy as np
import pytest
import mxnet as mx

from kvx_ref import powersgd as ref

import kvstore_ext  # noqa: F401
from kvstore_ext import chunking, cost
from kvstore_ext.codecs import PowerSGDCodec
from kvstore_ext.codecs.powersgd import orthonormalise
from kvstore_ext.memory import ChunkState
from kvstore_ext.schemes import PowerSGD

from test_dist_aggregate import JOB, job, launch, worker_gradients
from array_copies import count_copies

LINK = cost.Link(cost.parse_rate('1Gbit'), 50e-6)

f32 = np.float32


def close(got, want, rel=2e-5):
    """Equal to float32 rounding, relative to the array's largest value."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got - want).max()
    assert err <= rel * scale, 'max error %g, %g of the largest value' % (err, err / scale)


def low_rank_plus_noise(rng, shape, rank=4, noise=0.1):
    """Gradient-like: ``rank`` strong directions of distinct strengths over noise, so
    that the top subspace of rank r is well separated and float32 and float64 runs
    follow the same one (in a nearly degenerate subspace rounding picks the direction)."""
    rows, cols = ref.matrix_shape(shape)
    left = np.linalg.qr(rng.standard_normal((rows, rank)))[0]
    right = np.linalg.qr(rng.standard_normal((cols, rank)))[0]
    strong = (left * (20.0 * 0.6 ** np.arange(rank))) @ right.T
    return (strong + noise * rng.standard_normal((rows, cols))).reshape(shape).astype(f32)


def test_orthonormalise_matches_numpy():
    rng = np.random.default_rng(0)
    for shape in [(300, 4), (12, 4), (5000, 1)]:
        a = rng.standard_normal(shape).astype(f32)
        got = orthonormalise(mx.nd.array(a)).asnumpy()
        close(got, ref.orthonormalise(a), rel=1e-5)            # signs included
        np.testing.assert_allclose(got.T @ got, np.eye(shape[1]), atol=1e-5)
        again = orthonormalise(mx.nd.array(a)).asnumpy()
        assert np.array_equal(got, again)                      # deterministic


def test_orthonormalise_rank_deficient_and_zero():
    """Householder gives orthonormal columns where Gram-Schmidt divides by zero."""
    a = np.zeros((50, 4), f32)
    a[:, 1] = 1.0
    a[:, 3] = 2.0                                              # rank 1
    for m in (a, np.zeros((50, 4), f32)):
        got = orthonormalise(mx.nd.array(m)).asnumpy()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got.T @ got, np.eye(4), atol=1e-5)


def _store(**params):
    kv = mx.kv.create('dist_sync_powersgd')
    kv.set_gradient_compression(dict({'size_threshold': 0}, **params))
    return kv


@pytest.mark.parametrize('shape, chunk_size, rank', [((64, 32, 5, 5), 1 << 20, 4),
                                                     ((600, 2000), 4096, 4),
                                                     ((96, 400), 1024, 1)])
def test_store_matches_reference(shape, chunk_size, rank):
    """One worker: outputs, residual and each chunk's Q over steps. The second case's
    factors (10,400 words) exceed chunk_size: it is cut into 3 chunks of 200 rows, each
    its own low-rank problem; the third's (496 words) do not: one chunk, though the
    matrix holds 37x chunk_size elements."""
    kv = _store(chunk_size=chunk_size, rank=rank)
    codec = kv.scheme.codec_for(shape, f32)
    chunks = chunking.split(codec, chunk_size)
    assert isinstance(codec, PowerSGDCodec)
    assert len(chunks) == (3 if rank * sum(ref.matrix_shape(shape)) > chunk_size else 1)
    want = ref.PowerSGDReference(shape, 1, rank=rank,
                                 bounds=[(c.start, c.stop) for c in chunks])
    rng = np.random.default_rng(1)
    for step in range(5):
        grad = low_rank_plus_noise(rng, shape, rank)
        value = mx.nd.array(grad)
        kv.pushpull('w', value)
        close(value.asnumpy(), want.step([grad]))
        close(kv.key_state('w').residual, want.residual(0))
        for i, arrays in enumerate(kv.key_state('w').chunks):
            q = arrays['Q']
            np.testing.assert_allclose(q, want.qs[i], atol=2e-5)


def run_workers(codec, grads, states):
    """The steps of several workers in one process, their rounds summed in rank order:
    what the parameter server does, without ps-lite. Returns each worker's result."""
    steps = [codec.step(mx.nd.array(g), s, len(grads), rank)
             for rank, (g, s) in enumerate(zip(grads, states))]
    requests = [next(s) for s in steps]
    while True:
        assert len({r.name for r in requests}) == 1 and all(r.kind == 'sum'
                                                          for r in requests)
        total = requests[0].array.copy()
        for r in requests[1:]:
            total += r.array
        answers = []
        for s in steps:
            try:
                answers.append(('round', s.send(total)))
            except StopIteration as done:
                answers.append(('done', done.value))
        assert len({kind for kind, _ in answers}) == 1      # the workers stay in lockstep
        if answers[0][0] == 'done':
            return [value for _, value in answers]
        requests = [value for _, value in answers]


def test_workers_simulated_match_reference():
    """Three workers whose gradients differ: every worker gets the reference's sum, its
    residual is its own error, and nothing is lost (aggregate + residuals = gradients)."""
    shape, workers = (40, 120), 3
    codec = PowerSGDCodec(shape, rank=4, seed=7)
    arrays = [{} for _ in range(workers)]
    states = [ChunkState(mx.nd.zeros(shape), arrays[w], '0.') for w in range(workers)]
    want = ref.PowerSGDReference(shape, workers, rank=4, seed=7)
    rng = np.random.default_rng(2)
    sent = total = 0
    for step in range(6):
        grads = [low_rank_plus_noise(rng, shape) * (w + 1) for w in range(workers)]
        outs = [o.asnumpy() for o in run_workers(codec, grads, states)]
        for o in outs[1:]:
            assert np.array_equal(o, outs[0])
        close(outs[0], want.step(grads))
        for w in range(workers):
            close(states[w].residual.asnumpy(), want.residual(w))
        sent, total = sent + outs[0], total + sum(g.astype(np.float64) for g in grads)
        held = sum(s.residual.asnumpy().astype(np.float64) for s in states)
        close(sent + held, total, rel=1e-5)


def test_low_rank_gradient_comes_back_exactly():
    """A rank-2 gradient lies in the span of P = M Q: rank 4 returns it in one step and
    the residual stays (almost) zero."""
    rng = np.random.default_rng(3)
    grad = (rng.standard_normal((200, 2)) @ rng.standard_normal((2, 300))).astype(f32)
    kv = _store()
    value = mx.nd.array(grad)
    kv.pushpull('w', value)
    close(value.asnumpy(), grad, rel=1e-5)
    assert np.abs(kv.key_state('w').residual).max() <= 1e-5 * np.abs(grad).max()


def test_full_rank_gradient_keeps_the_rest():
    """A full-rank gradient: the output has rank r, the rest stays in the residual."""
    rng = np.random.default_rng(4)
    grad = rng.standard_normal((100, 150)).astype(f32)
    kv = _store(rank=3)
    value = mx.nd.array(grad)
    kv.pushpull('w', value)
    assert np.linalg.matrix_rank(value.asnumpy(), tol=1e-3) == 3
    residual = kv.key_state('w').residual
    assert np.linalg.norm(residual) > 0.5 * np.linalg.norm(grad)
    close(value.asnumpy() + residual, grad, rel=1e-5)


def test_residual_written_in_place(monkeypatch):
    """Step 5 writes the new residual straight into the key's residual array (gemm's
    ``out``): a steady-state step makes no array of the matrix's size to copy over the
    residual. That copy, through ``NDArray.__setitem__``, cost more than the gemm itself
    on cnn512's fc1 and was the codec's largest avoidable cost (docs/schemes/powersgd.md,
    "Where a step's time goes"). The values stay the reference's."""
    shape, workers = (64, 800), 2
    codec = PowerSGDCodec(shape, rank=4)
    states = [ChunkState(mx.nd.zeros(shape), {}, '0.') for _ in range(workers)]
    residuals = [s.residual for s in states]
    want = ref.PowerSGDReference(shape, workers, rank=4)
    copies = []         # shapes of the arrays written by assignment or copied into
    counting = []
    setitem, copyto = mx.nd.NDArray.__setitem__, mx.nd.NDArray.copyto

    def counted_setitem(array, key, value):
        if counting:
            copies.append(array.shape)
        return setitem(array, key, value)

    def counted_copyto(array, other):
        if counting and isinstance(other, mx.nd.NDArray):   # (not to a new array)
            copies.append(other.shape)
        return copyto(array, other)
    monkeypatch.setattr(mx.nd.NDArray, '__setitem__', counted_setitem)
    monkeypatch.setattr(mx.nd.NDArray, 'copyto', counted_copyto)
    rng = np.random.default_rng(6)
    for step in range(3):
        grads = [low_rank_plus_noise(rng, shape) for _ in range(workers)]
        arrays = [mx.nd.array(g) for g in grads]
        steps = [codec.step(a, s, workers, w) for w, (a, s) in enumerate(zip(arrays, states))]
        counting[:] = [True] if step else []    # (step 0 draws Q: NumPy into an array)
        answers = [next(s) for s in steps]
        try:
            while True:
                total = answers[0].array + answers[1].array
                answers = [s.send(total) for s in steps]
        except StopIteration as done:
            out = done.value.asnumpy()
        for s in steps[1:]:
            with pytest.raises(StopIteration):
                s.send(total)
        counting[:] = []
        assert copies == [], 'the step copied arrays of shapes %s' % copies
        close(out, want.step(grads))
        for w, s in enumerate(states):
            assert s.residual is residuals[w]
            close(s.residual.asnumpy(), want.residual(w))


@pytest.mark.parametrize('shape, chunk_size', [((64, 32, 5, 5), 1 << 20), ((600, 2000), 4096)])
def test_sum_written_into_the_output(monkeypatch, shape, chunk_size):
    """A store's pushpull of a PowerSGD key: step 7's product goes straight into the
    output (``Codec.sums_into``), a chunked key's into each chunk's rows, so a steady
    step copies no array (the copy of the sum into the gradient was 9% of the codec's
    operator time on cnn512). Outputs and residuals stay the reference's."""
    kv = _store(chunk_size=chunk_size)
    chunks = chunking.split(kv.scheme.codec_for(shape, f32), chunk_size)
    want = ref.PowerSGDReference(shape, 1, bounds=[(c.start, c.stop) for c in chunks])
    copies = []
    rng = np.random.default_rng(7)
    for step in range(3):
        grad = low_rank_plus_noise(rng, shape)
        value, out = mx.nd.array(grad), mx.nd.zeros(shape)
        if step:        # (step 0 draws Q: NumPy into an array)
            count_copies(monkeypatch, copies)
        kv.pushpull('w', value, out=out)
        monkeypatch.undo()
        assert copies == [], 'the step copied arrays of shapes %s' % copies
        close(out.asnumpy(), want.step([grad]))
        assert np.array_equal(value.asnumpy(), grad)        # the input stays as it was
        close(kv.key_state('w').residual, want.residual(0))


def test_scheme_choices():
    scheme = PowerSGD()
    f = scheme.codec_for
    assert isinstance(f((64, 32, 5, 5), f32), PowerSGDCodec)             # conv
    assert f((64, 32, 5, 5), f32).describe() == 'powersgd rank 4 of 64 x 800'
    assert isinstance(f((512, 784), f32), PowerSGDCodec)                 # FC
    assert f((100000,), f32).passthrough                                 # 1-D
    assert isinstance(f((10, 512), f32), PowerSGDCodec)                  # small, pays
    assert isinstance(f((32, 1, 5, 5), f32), PowerSGDCodec)              # 228 <= 800 / 2
    assert f((512, 784), np.float16).passthrough                         # not float32
    assert f((4096, 8), f32).passthrough                                 # not 2x smaller
    # rows of 2**20 elements: every chunk is one row, never 2x smaller
    assert f((16, 1 << 20), f32).passthrough
    assert isinstance(PowerSGD(chunk_size=1 << 24).codec_for((16, 1 << 20), f32),
                      PowerSGDCodec)
    # a large FC tensor (1.6M elements, above chunk_size) is one low-rank problem:
    # its factors (14,592 words) are far below chunk_size
    chunks = chunking.split(f((512, 3136), f32), scheme.params['chunk_size'])
    assert [(c.start, c.stop, c.whole) for c in chunks] == [(0, 512, True)]
    assert chunks[0].codec.state_shapes() == {'Q': (3136, 4)}
    # size_threshold still exempts small tensors when given
    assert PowerSGD(size_threshold=32768).codec_for((10, 512), f32).passthrough
    with pytest.raises(ValueError):
        PowerSGD(rank=0)
    with pytest.raises(ValueError):
        PowerSGDCodec((5, 100), rank=0)
    assert not PowerSGDCodec((5, 100), rank=3).compressible()     # 630 > 500 / 2 floats
    assert PowerSGDCodec((5, 100), rank=2).compressible()         # 420 <= 500 / 2
    for rows, cols, rank in [(r, c, k) for r in (2, 9, 40) for c in (3, 17, 300)
                             for k in (1, 2, 4)]:
        assert PowerSGDCodec((rows, cols), rank).compressible() == \
            ref.compressible(rows, cols, rank)
    with pytest.raises(ValueError):
        PowerSGDCodec((500,), rank=2)


def test_warmup_then_compression():
    """``warmup_steps`` float32 steps (the exact sum), then a re-plan to PowerSGD."""
    kv = _store(warmup_steps=2, rank=2)
    rng = np.random.default_rng(5)
    for step in range(4):
        grad = rng.standard_normal((60, 90)).astype(f32)
        value = mx.nd.array(grad)
        kv.pushpull('w', value)
        codec = kv.plan('w').codec
        if step < 2:
            assert codec.passthrough and np.array_equal(value.asnumpy(), grad)
        else:
            assert isinstance(codec, PowerSGDCodec)
            assert np.linalg.matrix_rank(value.asnumpy(), tol=1e-3) == 2
    assert [PowerSGD(warmup_steps=2).replans_at(s) for s in range(4)] == \
        [False, False, True, False]
    assert not any(PowerSGD().replans_at(s) for s in range(4))


def test_wire_bytes():
    """Push and pull carry rank * (rows + cols) floats a step (P and Q)."""
    kv = _store()
    kv.pushpull('w', mx.nd.ones((100, 50, 3)))
    stats = kv.comm_stats()
    assert stats['raw_bytes'] == 4 * 15000
    assert stats['push_bytes'] == stats['pull_bytes'] == 4 * 4 * (100 + 150)


# cnn512 of gluon_scripts/train_mnist.py: conv1, conv2, fc1, fc2 and their biases
CNN512 = {'conv1': (32, 1, 5, 5), 'conv1_bias': (32,), 'conv2': (64, 32, 5, 5),
          'conv2_bias': (64,), 'fc1': (512, 3136), 'fc1_bias': (512,), 'fc2': (10, 512),
          'fc2_bias': (10,)}


def torch_hook_words(shape, rank):
    """Words a step of PyTorch's powerSGD_hook (default min_compression_rate 2): a
    tensor of 2 or more axes viewed as (shape[0], rest) goes as its rank-r factors,
    whole, if ``(rows + cols) * rank * 2 < rows * cols``; others go uncompressed."""
    size = int(np.prod(shape))
    if len(shape) < 2:
        return size
    rows, cols = shape[0], size // shape[0]
    return (rows + cols) * rank if (rows + cols) * rank * 2 < rows * cols else size


@pytest.mark.parametrize('rank', [1, 2, 4, 8])
def test_bytes_on_cnn512_at_most_pytorch(rank):
    """At its defaults the scheme compresses every matrix whose factors pay (the
    reference's rule, one P and Q per matrix): the cost model's bytes a step (which
    tests/test_cost_model.py holds equal to the store's comm_stats) are the
    reference's, and no more than PyTorch's hook sends on the same shapes."""
    scheme = PowerSGD(rank=rank)
    model = cost.step_cost(cost.plan(scheme, CNN512, 4), 4, 2, LINK, 0.0,
                           chunk_size=scheme.params['chunk_size'])
    want = 4 * sum(ref.step_words(s, rank) for s in CNN512.values())
    assert model.bytes_push == model.bytes_pull == want
    assert want <= 4 * sum(torch_hook_words(s, rank) for s in CNN512.values())


def test_store_bytes_follow_the_rule():
    """A real store's comm_stats, one worker, at the defaults: a small matrix that pays
    (10 x 512) and a large one (512 x 3136, above chunk_size elements) send their
    factors whole; a bias goes float32."""
    kv = mx.kv.create('dist_sync_powersgd')
    kv.set_gradient_compression({'chunk_size': 1 << 20})
    shapes = {'fc2': (10, 512), 'fc1': (512, 3136), 'fc1_bias': (512,)}
    for key, shape in shapes.items():
        kv.pushpull(key, mx.nd.ones(shape))
    stats = kv.comm_stats()
    assert stats['push_bytes'] == stats['pull_bytes'] == \
        4 * sum(ref.step_words(s, 4) for s in shapes.values())


PARAMS = {'size_threshold': 100, 'chunk_size': 1024}
DIST_CASES = [(2, 2, {}), (4, 1, {'rank': 2, 'warmup_steps': 1})]


@pytest.mark.parametrize('workers, servers, extra', DIST_CASES)
def test_dist_matches_reference(tmp_path, job_env, workers, servers, extra):
    params = dict(PARAMS, **extra)
    steps = 4
    launch(tmp_path, job_env, workers, servers, [JOB, '--kvstore', 'dist_sync_powersgd',
                                                 '--params', json.dumps(params),
                                                 '--steps', str(steps),
                                                 '--out', str(tmp_path)])
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    info = json.load(open(str(tmp_path / 'rank0.json')))
    scheme = PowerSGD(**params)
    warmup = params.get('warmup_steps', 0)
    compressed = 0
    for key, shape in job.SHAPES.items():
        codec = scheme.codec_for(shape, f32, step=warmup)
        if codec.passthrough:
            assert len(shape) == 1, key           # conv and fc are compressed
            continue
        compressed += 1
        chunks = chunking.split(codec, params['chunk_size'])
        assert len(chunks) == 1                    # factors below chunk_size: whole
        want = ref.PowerSGDReference(shape, workers, rank=codec.rank,
                                     bounds=[(c.start, c.stop) for c in chunks])
        sent = total = 0
        for step in range(steps):
            outs = [run['out/%s/%d' % (key, step)] for run in runs]
            for out in outs[1:]:
                assert np.array_equal(out, outs[0]), 'workers pulled different sums'
            grads = worker_gradients(workers, step, key)
            if step < warmup:                      # float32, summed by the server
                close(outs[0], sum(g.astype(np.float64) for g in grads), rel=1e-6)
                continue
            close(outs[0], want.step(grads), rel=1e-4)
            for w, run in enumerate(runs):
                close(run['res/%s/%d' % (key, step)], want.residual(w), rel=1e-4)
            sent = sent + outs[0]
            total = total + sum(g.astype(np.float64) for g in grads)
            held = sum(run['res/%s/%d' % (key, step)].astype(np.float64) for run in runs)
            close(sent + held, total, rel=1e-5)
    assert compressed == 2
    stats = info['stats']
    assert stats['steps'] == steps and stats['push_bytes'] < stats['raw_bytes']
