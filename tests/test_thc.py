"""dist_sync_thc: the C++ operators against the NumPy reference (python/kvx_ref/thc.py),
bit for bit, on awkward tensors; the float32 sums of n workers' packed codes are exact
integers in any order; the stochastic rounding is unbiased (a statistical bound that a
1% bias fails); malformed sums are rejected; the codec, the scheme, one process through
the store; and real ps-lite jobs of 2 and 4 workers, every worker's pull equal to the
reference fed the same gradients."""
import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'python'))

from kvx_ref import thc as ref  # noqa: E402
from kvx_ref import wire  # noqa: E402

import mxnet as mx  # noqa: E402

import kvstore_ext  # noqa: E402,F401
from kvstore_ext import chunking  # noqa: E402
from kvstore_ext.codecs import ThcCodec  # noqa: E402
from kvstore_ext.codecs import thc as thc_codec  # noqa: E402
from kvstore_ext.schemes import Thc  # noqa: E402

from test_cpp_ops import (KINDS, grad_residual, library_path, make, nd, ops,  # noqa: E402,F401
                          same_bits, status_of)
from test_dist_aggregate import JOB, job, launch, worker_gradients  # noqa: E402

f32 = np.float32
P = dict(levels=16, clamp=2.5, seed=3, block=1024)


def ref_args(p=P):
    return p['levels'], p['clamp'], p['seed']


def norm_round(ops, grads, residuals):
    """Every worker's slot from the op (checked against the reference), summed."""
    workers = len(grads)
    total = np.zeros(workers, f32)
    for w, (g, r) in enumerate(zip(grads, residuals)):
        slots, status = ops.kvx_thc_norm(nd(g), nd(r), rank=w, num_workers=workers)
        want, want_status = ref.norm_slots(g, r, w, workers)
        assert status_of(status) == want_status == wire.OK
        assert same_bits(slots.asnumpy(), want)
        total += want
    return total


def ref_step(grads, residuals, norms, step, p=P):
    """The reference's job: (words of each worker, new residuals, their float32 sum,
    decoded sum)."""
    words, new_res = [], []
    for w, (g, r) in enumerate(zip(grads, residuals)):
        wd, res, status = ref.encode(g, r, norms, w, p['levels'], p['clamp'], p['seed'], step,
                                     p['block'])
        assert status == wire.OK
        words.append(wd)
        new_res.append(res)
    total = np.zeros_like(words[0])
    for wd in words:
        total += wd
    out, status = ref.decode_sum(total, norms, p['levels'], p['clamp'], p['seed'], step,
                                 p['block'], grads[0].size)
    assert status == wire.OK
    return words, new_res, total, out.reshape(grads[0].shape)


# ---- the kernels, bit for bit ---------------------------------------------------------

SHAPES = [(1,), (7,), (255,), (257,), (3, 5), (16, 3, 3, 3), (1000,), (5000,)]


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kind', KINDS)
def test_rotate_matches_reference(ops, shape, kind):
    x = make(shape, kind, 3)
    m = ref.norm(x)
    norms = np.array([m * f32(0.5), m], f32)      # M = the larger
    z, status = ops.kvx_thc_rotate(nd(x), nd(norms), seed=5, step=9, block=256)
    want = ref.rotate(x, m, 5, 9, 256)
    assert status_of(status) == wire.OK and same_bits(z.asnumpy(), want)
    back, status = ops.kvx_thc_unrotate(z, nd(norms), seed=5, step=9, block=256, shape=shape)
    assert status_of(status) == wire.OK
    assert same_bits(back.asnumpy().reshape(-1), ref.unrotate(want, m, 5, 9, 256, x.size))
    if m > 0 and np.isfinite(m):
        err = np.abs(back.asnumpy().astype(np.float64) - x).max()
        assert err <= 1e-5 * float(m)


@pytest.mark.parametrize('workers', [1, 3, 16])
@pytest.mark.parametrize('levels', [2, 16, 255])
def test_quantize_matches_reference(ops, workers, levels):
    z = (make((3000,), 'randn', 4) * f32(1.5)).astype(f32)
    z[:10] = [50, -50, 2.5, -2.5, 0, 3e38, -3e38, 1e30, -1e-30, 2.4999]
    for rank in (0, workers - 1):
        words, status = ops.kvx_thc_quantize(nd(z), levels=levels, clamp=2.5, seed=11, step=4,
                                             rank=rank, num_workers=workers)
        codes = ref.quantize(z, levels, 2.5, ref.dither(11, 4, rank, z.size))
        want = ref.pack(codes, ref.sum_base(levels, workers))
        assert status_of(status) == wire.OK and same_bits(words.asnumpy(), want)
        assert codes.min() >= 0 and codes.max() <= levels - 1
        assert codes[0] == levels - 1 and codes[1] == 0         # clamped to the end levels
        values, status = ops.kvx_thc_dequantize(words, levels=levels, clamp=2.5,
                                                num_workers=workers, summed=1, size=z.size)
        assert status_of(status) == wire.OK
        assert same_bits(values.asnumpy(), ref.level_sum(codes, levels, 2.5, 1))
    for bad_value in (np.nan, np.inf):       # no code for a NaN (rotate never makes one)
        bad = z.copy()
        bad[7] = bad_value
        words, status = ops.kvx_thc_quantize(nd(bad), levels=levels, clamp=2.5, seed=11,
                                             step=4, rank=0, num_workers=workers)
        assert status_of(status) == wire.NONFINITE


# every kind on the small shapes; 70000 elements (several blocks and a padded tail)
# with 4 workers only for Gaussian data, to keep the test fast
STEP_CASES = [(shape, kind, workers)
              for shape in [(1,), (300,), (16, 3, 3, 3), (5000,), (70000,)]
              for kind in KINDS for workers in (1, 2, 4)
              if not (workers == 4 and shape[0] == 70000 and kind != 'randn')]


@pytest.mark.parametrize('shape, kind, workers', STEP_CASES)
def test_step_matches_reference(ops, shape, kind, workers):
    """Norm round, every worker's encode (words and residual), the float32 sum of the
    words in shuffled orders (exact integers, the packing of the summed codes) and the
    decode: ops equal to the reference bit for bit."""
    data = [grad_residual(shape, kind, 10 * w + 1) for w in range(workers)]
    grads, residuals = [g for g, _ in data], [r for _, r in data]
    norms = norm_round(ops, grads, residuals)
    words, new_res, total, out = ref_step(grads, residuals, norms, 7)
    for w in range(workers):
        res = nd(residuals[w])
        got, status = ops.kvx_thc_encode(nd(grads[w]), res, nd(norms), rank=w, step=7, **P)
        assert status_of(status) == wire.OK
        assert same_bits(got.asnumpy(), words[w]) and same_bits(res.asnumpy(), new_res[w])
    # exact integer sums, whatever order the server adds in
    base = ref.sum_base(P['levels'], workers)
    d = ref.padded_size(grads[0].size, P['block'])
    exact = sum(wd.astype(np.int64) for wd in words)
    assert exact.max() < 2 ** 24
    for order in (range(workers), reversed(range(workers))):
        acc = np.zeros_like(total)
        for w in order:
            acc += words[w]
        assert np.array_equal(acc.astype(np.int64), exact)
    codes = sum(ref.unpack(wd, base, d) for wd in words)
    assert np.array_equal(ref.unpack(total, base, d), codes)
    got, status = ops.kvx_thc_decode_sum(nd(total), nd(norms), step=7, shape=shape, **P)
    assert status_of(status) == wire.OK and same_bits(got.asnumpy(), out)
    # error feedback: the workers' losses add up to what the sum misses
    if kind in ('randn', 'ints'):
        accs = [g + r for g, r in zip(grads, residuals)]
        own = sum(a.astype(np.float64) - r for a, r in zip(accs, new_res))
        scale = max(1.0, float(np.abs(sum(accs)).max()))
        np.testing.assert_allclose(own, out, atol=1e-5 * scale)


def test_encode_rejects_nan_and_bad_norms(ops):
    grad, residual = grad_residual((2000,), 'randn', 5)
    norms = nd(np.array([40.0, 41.0], f32))
    for bad in (np.nan, np.inf):
        g = grad.copy()
        g[-1] = bad
        slots, status = ops.kvx_thc_norm(nd(g), nd(residual), rank=0, num_workers=2)
        assert status_of(status) == wire.NONFINITE
        res = nd(residual)
        words, status = ops.kvx_thc_encode(nd(g), res, norms, rank=0, step=0, **P)
        assert status_of(status) == wire.NONFINITE
        assert same_bits(res.asnumpy(), residual) and not words.asnumpy().any()
    for bad_norms in ([np.nan, 1.0], [-1.0, 1.0]):
        res = nd(residual)
        _, status = ops.kvx_thc_encode(nd(grad), res, nd(np.array(bad_norms, f32)), rank=0,
                                       step=0, **P)
        assert status_of(status) == wire.BAD_PARAM and same_bits(res.asnumpy(), residual)


def test_decode_rejects_malformed_sums(ops):
    """Every worker-side check of a summed payload: zeros and a status (never a crash);
    a wrong length fails the call (shape inference), as for the other sum decoders."""
    n, workers = 3000, 2
    data = [grad_residual((n,), 'randn', w) for w in range(workers)]
    grads, residuals = [g for g, _ in data], [r for _, r in data]
    norms = norm_round(ops, grads, residuals)
    _, _, total, _ = ref_step(grads, residuals, norms, 0)
    limit = float(ref.sum_base(16, workers)) ** 4                       # 31**4
    for word, status in [(-1.0, wire.BAD_WORD), (0.5, wire.BAD_WORD), (limit, wire.BAD_WORD),
                         (np.nan, wire.BAD_WORD), (np.inf, wire.BAD_WORD),
                         (limit - 1, wire.OK)]:
        bad = total.copy()
        bad[17] = word
        out, got = ops.kvx_thc_decode_sum(nd(bad), nd(norms), step=0, shape=(n,), **P)
        want, want_status = ref.decode_sum(bad, norms, *ref_args(), 0, P['block'], n)
        assert status_of(got) == want_status == status
        assert same_bits(out.asnumpy(), want)
        if status != wire.OK:
            assert not out.asnumpy().any()
    for bad_norms in ([np.nan, 1.0], [1.0, -1.0], [np.inf, 0.0]):
        out, got = ops.kvx_thc_decode_sum(nd(total), nd(np.array(bad_norms, f32)), step=0,
                                          shape=(n,), **P)
        assert status_of(got) == wire.BAD_PARAM and not out.asnumpy().any()
    with pytest.raises(mx.base.MXNetError):
        ops.kvx_thc_decode_sum(nd(total[:-1]), nd(norms), step=0, shape=(n,), **P)[0] \
            .wait_to_read()
    with pytest.raises(mx.base.MXNetError):            # a base beyond 2**24
        ops.kvx_thc_decode_sum(nd(total), nd(norms), step=0, shape=(n,),
                               **dict(P, levels=2 ** 24))[0].wait_to_read()


def test_stochastic_rounding_is_unbiased(ops):
    """One worker, T large enough that nothing is clamped: over K steps (fresh signs and
    dither each), the mean decoded contribution must be x. Bounds, each at 5 standard
    errors (estimated from the samples): every element; the projection on x (a scale
    bias); the chi-square of all 256 elements. A 1% scale bias fails them."""
    n, steps = 256, 1500
    p = dict(P, clamp=8.0, block=256)
    x = make((n,), 'randn', 21)
    zero = nd(np.zeros(n, f32))
    norms = nd(np.array([ref.norm(x)], f32))
    samples = np.empty((steps, n))
    largest = 0.0
    for step in range(steps):
        z, _ = ops.kvx_thc_rotate(nd(x), norms, seed=p['seed'], step=step, block=256)
        largest = max(largest, float(np.abs(z.asnumpy()).max()))
        words, status = ops.kvx_thc_encode(nd(x), zero.copy(), norms, rank=0, step=step, **p)
        out, status = ops.kvx_thc_decode_sum(words, norms, step=step, shape=(n,), **p)
        samples[step] = out.asnumpy()
    assert largest < p['clamp']                       # no clamping: E[decoded] = x exactly
    mean, se = samples.mean(axis=0), samples.std(axis=0, ddof=1) / np.sqrt(steps)
    assert (se > 0).all()

    def biased(target):
        """The three statistics of mean - target, in standard errors."""
        t = (mean - target) / se
        projection = ((mean - target) * x).sum() / np.sqrt((se ** 2 * x ** 2).sum())
        chi2 = ((t ** 2).sum() - n) / np.sqrt(2 * n)
        return np.abs(t).max(), abs(projection), chi2

    element, projection, chi2 = biased(x)
    assert element < 5.0 and projection < 5.0 and chi2 < 5.0, (element, projection, chi2)
    element, projection, chi2 = biased(x * 1.01)
    assert projection > 5.0 and chi2 > 5.0, (element, projection, chi2)
    # and the noise is what 16 levels give: about (2T/15)^2 / 6 a coordinate
    noise = (samples - x).var() / ((2 * 8.0 / 15) ** 2 / 6 * float(ref.norm(x)) ** 2 / n)
    assert 0.5 < noise < 1.5, noise


# ---- codec, scheme, store --------------------------------------------------------------

def test_scheme_and_codec():
    scheme = Thc()
    codec = scheme.codec_for((512, 3136), np.float32)
    assert isinstance(codec, ThcCodec) and codec.levels == 16 and codec.clamp == 2.5
    assert scheme.codec_for((100,), np.float32).passthrough
    assert scheme.codec_for((512, 3136), np.float16).passthrough
    assert scheme.codec_for((32768,), np.float32).name == 'thc'
    with pytest.raises(ValueError):
        Thc(block=1000)
    with pytest.raises(ValueError):
        Thc(levels=1)
    with pytest.raises(ValueError):
        Thc(clamp=0)
    with pytest.raises(ValueError):
        Thc(q=16)
    # words: 8 bits an element for 2-4 workers at q = 16, 6 codes a word for one
    assert thc_codec.blocks(70000, 65536) == ref.blocks(70000, 65536)
    for n in (1, 255, 300, 40000, 70000):
        for workers in (1, 2, 4, 8):
            assert thc_codec.sum_words(n, 65536, 16, workers) == \
                ref.sum_words(n, 65536, 16, workers)
    assert codec.wire_words(4) == [('norm', 'sum', 4, 4),
                                   ('payload', 'sum', 512 * 3136 // 4, 512 * 3136 // 4)]
    with pytest.raises(ValueError):
        thc_codec.sum_words(10, 65536, 1025, 2 ** 14 + 1)


def test_store_matches_reference():
    """One process (rank 0 of 1) through the store: outputs, residuals and the step
    count over steps, bit for bit; chunks have their own norm and step count."""
    kv = mx.kv.create('dist_sync_thc')
    params = dict(P, size_threshold=0, chunk_size=1024)
    kv.set_gradient_compression(params)
    shape = (3000,)
    codec = Thc(**params).codec_for(shape, np.float32)
    chunks = chunking.split(codec, 1024)
    assert len(chunks) == 3
    residual = np.zeros(shape, f32)
    rng = np.random.default_rng(2)
    for step in range(4):
        grad = (rng.standard_normal(shape) * 0.1).astype(f32)
        value = mx.nd.array(grad)
        kv.pushpull('w', value)
        expect = np.zeros(shape, f32)
        for chunk in chunks:
            g, r = chunk.view(grad), chunk.view(residual)
            norms, _ = ref.norm_slots(g, r, 0, 1)
            _, new_res, _, out = ref_step([g], [r], norms, step)
            r[...] = new_res[0]
            chunk.view(expect)[...] = out
        assert same_bits(value.asnumpy(), expect), step
        assert same_bits(kv._keys['w'].residual.asnumpy(), residual), step
    for state in kv._keys['w'].chunk_states:
        assert state.get('step').asscalar() == 4
    stats = kv.comm_stats()
    # 6 codes a word for one worker (chunks of 1000 pad to 1024: 171 words), plus one
    # norm word a chunk and step
    assert [c.codec.size for c in chunks] == [1000] * 3
    assert stats['push_bytes'] == stats['pull_bytes'] == 4 * 4 * 3 * (171 + 1)


# ---- real ps-lite jobs ---------------------------------------------------------------------

DIST_PARAMS = {'size_threshold': 100, 'chunk_size': 1024, 'block': 256}
DIST_STEPS = 3


@pytest.mark.parametrize('workers, servers', [(2, 1), (4, 2)])
def test_dist_matches_reference(tmp_path, job_env, workers, servers):
    """Every worker pulls the same sums, equal bit for bit to the reference fed the same
    gradients (norm round, encode of every worker, float32 sum, decode), chunk by chunk
    and step by step; residuals too; and both directions are compressed."""
    launch(tmp_path, job_env, workers, servers,
           [JOB, '--kvstore', 'dist_sync_thc', '--params', json.dumps(DIST_PARAMS),
            '--steps', str(DIST_STEPS), '--out', str(tmp_path)], timeout=180)
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    assert sorted(i['rank'] for i in infos) == list(range(workers))
    scheme = Thc(**DIST_PARAMS)
    p = dict(P, block=DIST_PARAMS['block'], seed=0)
    compressed = 0
    for key, shape in job.SHAPES.items():
        codec = scheme.codec_for(shape, np.float32)
        residuals = [np.zeros(shape, f32) for _ in range(workers)]
        for step in range(DIST_STEPS):
            outs = [run['out/%s/%d' % (key, step)] for run in runs]
            for out in outs[1:]:
                assert same_bits(out, outs[0]), 'workers pulled different sums'
            grads = worker_gradients(workers, step, key)
            if codec.passthrough:
                np.testing.assert_allclose(outs[0], sum(grads), rtol=1e-6, atol=1e-6)
                continue
            compressed += 1
            expect = np.zeros(shape, f32)
            for chunk in chunking.split(codec, DIST_PARAMS['chunk_size']):
                g = [chunk.view(x) for x in grads]
                r = [chunk.view(x) for x in residuals]
                norms = sum(ref.norm_slots(gw, rw, w, workers)[0]
                            for w, (gw, rw) in enumerate(zip(g, r)))
                _, new_res, _, out = ref_step(g, r, norms, step, p)
                for rw, nr in zip(r, new_res):
                    rw[...] = nr
                chunk.view(expect)[...] = out
            assert same_bits(outs[0], expect), (key, step)
            for w, run in enumerate(runs):
                assert same_bits(run['res/%s/%d' % (key, step)], residuals[w]), (key, step, w)
    assert compressed == 3 * DIST_STEPS                     # conv, fc, wide; bias is float32
    stats = infos[0]['stats']
    assert stats['push_bytes'] < stats['raw_bytes'] / 3
    assert stats['pull_bytes'] < stats['raw_bytes'] / 3
