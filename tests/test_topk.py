"""Element top-k (dist_sync_topk): the C++ operators against the NumPy reference
(python/kvx_ref/codecs.py), bit for bit, on awkward tensors, above 2**16 and above 2**24
elements, malformed payloads and the servers' decode_slots; then the codec and scheme."""
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'python'))

from kvx_ref import codecs as ref  # noqa: E402
from kvx_ref import wire  # noqa: E402

import mxnet as mx  # noqa: E402

from test_cpp_ops import (KINDS, _set, assert_decode_slots, assert_rejected, grad_residual,  # noqa: E402,F401
                          library_path, make, nd, ops,
                          same_bits, status_of)

f32 = np.float32


def check_encode(ops, grad, residual, k):
    n = grad.size
    want, want_res, want_status = ref.element_topk_encode(grad, residual, k)
    res_nd = nd(residual)
    payload, status = ops.kvx_element_topk_encode(nd(grad), res_nd, k=k)
    assert status_of(status) == want_status == wire.OK
    got = payload.asnumpy()
    assert same_bits(got, want), (grad.shape, k)
    assert same_bits(res_nd.asnumpy(), want_res)
    want_out, st = ref.element_topk_decode(got, n)
    assert st == wire.OK
    out, status = ops.kvx_element_topk_decode(nd(got), shape=(n,))
    assert status_of(status) == wire.OK
    assert same_bits(out.asnumpy(), want_out)
    # error feedback loses nothing: decoded + new residual == acc
    assert np.array_equal(want_out + want_res.reshape(-1), (grad + residual).reshape(-1))
    acc = make((n,), 'randn', 5)
    acc_nd = nd(acc)
    assert status_of(ops.kvx_element_topk_decode_add(nd(got), acc_nd)) == wire.OK
    assert np.array_equal(acc_nd.asnumpy(), acc + want_out)
    return got


@pytest.mark.parametrize('shape', [(1,), (7,), (3, 5), (16, 3, 3, 3), (1000,), (2 ** 16 + 3,)])
@pytest.mark.parametrize('kind', KINDS)
def test_encode_decode(ops, shape, kind):
    n = int(np.prod(shape))
    grad, residual = grad_residual(shape, kind, 30 + n)
    for k in sorted({1, max(1, n // 100), max(1, n // 3), n}):
        check_encode(ops, grad, residual, k)


def test_ties_go_to_the_lower_index(ops):
    grad = np.array([1, -3, 3, 0, 2, -2], f32)
    payload = check_encode(ops, grad, np.zeros(6, f32), 3)
    assert list(payload) == [wire.MAGIC, wire.ELEMENT_TOPK, wire.VERSION, 6, 0, 3, 0, 6,
                             1, -3, 2, 3, 4, 2]


def test_above_2_pow_24_elements(ops):
    """Indices from 2**24 on take two words."""
    n = (1 << 24) + 37
    grad = np.zeros(n, f32)
    spikes = [0, 12345, (1 << 23) + 1, (1 << 24) - 1, 1 << 24, n - 1]
    grad[spikes] = [3, -3, -3, -3, 3, 4]
    residual = np.zeros(n, f32)
    residual[::997] = 0.25
    payload = check_encode(ops, grad, residual, 10)
    assert ref.element_topk_index_words(n) == 2
    assert list(payload[-3:]) == [36, 1, 4]              # index n - 1 = 2**24 + 36
    out, _ = ref.element_topk_decode(payload, n)
    assert set(spikes) <= set(np.nonzero(out)[0])


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf, 'overflow'])
def test_nonfinite(ops, bad):
    grad, residual = grad_residual((6, 5), 'randn', 50)
    if bad == 'overflow':      # grad and residual finite, acc = grad + residual is not
        grad[3, 2], residual[3, 2] = 3e38, 3e38
    else:
        grad[3, 2] = bad
    res_nd = nd(residual)
    payload, status = ops.kvx_element_topk_encode(nd(grad), res_nd, k=4)
    assert status_of(status) == ref.element_topk_encode(grad, residual, 4)[2] == wire.NONFINITE
    assert same_bits(res_nd.asnumpy(), residual)
    words = payload.asnumpy()       # void: first word NaN (cpp/ops.cc, set_encoded)
    assert np.isnan(words[0]) and not words[1:].any()


def _good():
    grad, residual = grad_residual((40,), 'randn', 60)
    payload = ref.element_topk_encode(grad, residual, 4)[0]
    assert payload.size == 16
    return payload


def _swap(p):
    p = p.copy()
    p[8], p[10] = p[10], p[8]
    return p


MALFORMED = [
    (_set(0, 1.0), wire.BAD_MAGIC),
    (_set(2, 0.0), wire.BAD_VERSION),
    (_set(1, wire.ADACOMP), wire.BAD_CODEC),
    (_set(3, 41.0), wire.BAD_SIZE),
    (_set(7, 6.0), wire.BAD_SIZE),
    (lambda p: np.concatenate([p, np.zeros(2, f32)]), wire.BAD_SIZE),
    (_set(5, 3.0), wire.BAD_PARAM),          # count disagrees with the body
    (_set(5, 0.0), wire.BAD_PARAM),
    (_set(5, np.nan), wire.BAD_PARAM),
    (_set(5, np.inf), wire.BAD_PARAM),
    (_set(5, 4.5), wire.BAD_PARAM),
    (_set(6, 1.0), wire.BAD_PARAM),
    (_set(8, 0.5), wire.BAD_WORD),
    (_set(8, -2.0), wire.BAD_WORD),
    (_set(8, np.nan), wire.BAD_WORD),
    (_set(8, 2.0 ** 24), wire.BAD_WORD),
    (_set(9, np.nan), wire.BAD_WORD),        # a value no encoder sends
    (_set(11, np.inf), wire.BAD_WORD),
    (_set(10, 40.0), wire.BAD_INDEX),
    (lambda p: _set(10, p[8])(p), wire.BAD_INDEX),   # repeated index
    (_swap, wire.BAD_INDEX),
]


@pytest.mark.parametrize('corrupt,status', MALFORMED)
def test_malformed_payload(ops, corrupt, status):
    bad = corrupt(_good())
    assert ref.element_topk_decode(bad, 40)[1] == status
    assert_rejected(ops, 'element_topk', bad, 40, status)


@pytest.mark.parametrize('workers', [1, 2, 5])
def test_decode_slots(ops, workers):
    shape, n = (12, 3, 3, 3), 324
    rng = np.random.default_rng(workers)
    payloads = [ref.element_topk_encode(rng.standard_normal(shape).astype(f32),
                                        np.zeros(shape, f32), 17)[0] for _ in range(workers)]
    assert_decode_slots(ops, np.stack(payloads), n, bad_word=8)


def test_invalid_attrs(ops):
    g, r = nd(np.ones((4, 3), f32)), nd(np.zeros((4, 3), f32))
    for attrs in [dict(k=0), dict(k=13), dict(), dict(k=2, bin=3)]:
        with pytest.raises(mx.base.MXNetError):
            for out in ops.kvx_element_topk_encode(g, r, **attrs):
                out.wait_to_read()


# ---- the codec and the scheme ------------------------------------------------------------

def test_codec_k_and_describe():
    from kvstore_ext.codecs import ElementTopKCodec
    from kvstore_ext.schemes import TopK
    scheme = TopK()
    conv = scheme.codec_for((64, 32, 5, 5), np.float32)
    # k = ceil(ratio * n) at the default ratio 0.02 (docs/decisions/topk-ratio.md)
    assert scheme.params['ratio'] == 0.02
    assert isinstance(conv, ElementTopKCodec) and conv.k == 1024
    assert conv.payload_words() == 8 + 2 * 1024
    assert scheme.codec_for((100,), np.float32).passthrough
    assert scheme.codec_for((64, 32, 5, 5), np.float16).passthrough
    assert conv.chunk(0, 1001).k == 21                   # ceil(0.02 * 1001)
    assert TopK(ratio=1.0, size_threshold=0).codec_for((7,), np.float32).k == 7
    assert TopK(ratio=1e-9, size_threshold=0).codec_for((7,), np.float32).k == 1
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError):
            TopK(ratio=bad)


def test_codec_encode_matches_reference():
    from kvstore_ext.schemes import TopK
    grad, residual = grad_residual((64, 1000), 'randn', 3)
    codec = TopK(ratio=0.02).codec_for(grad.shape, np.float32)
    res_nd = nd(residual)
    payload = codec.encode(nd(grad), res_nd)
    want, want_res, _ = ref.element_topk_encode(grad, residual, codec.k)
    assert same_bits(payload.asnumpy(), want)
    assert same_bits(res_nd.asnumpy(), want_res)
    decoded = codec.decode(payload).asnumpy()
    assert same_bits(decoded.reshape(-1), ref.element_topk_decode(want, grad.size)[0])


@pytest.mark.parametrize('momentum', [0.0, 0.9])
def test_sparsity_warmup_decays_k_and_keeps_the_state(momentum):
    """DGC's warm-up: k follows warmup_ratio * (ratio / warmup_ratio) ** (step / N) down
    to ratio, re-planned every step; the residual (and the velocity) carry over the
    re-plans: with momentum each step equals the spec's step at that step's k, without
    it what came back plus the residual is every gradient so far."""
    import math
    import kvstore_ext  # noqa: F401  (registers dist_sync_topk)
    from kvx_ref.momentum import momentum_element_topk_step
    n_steps, ratio, start, size = 4, 0.01, 0.25, 3000
    kv = mx.kv.create('dist_sync_topk')
    kv.set_gradient_compression({'size_threshold': 100, 'ratio': ratio, 'momentum': momentum,
                                 'warmup_steps': n_steps, 'warmup_ratio': start})
    rng = np.random.default_rng(3)
    residual = velocity = delivered = None
    sent_total, grad_total = np.zeros(size), np.zeros(size)
    ks = []
    for step in range(7):
        g = rng.standard_normal((60, 50)).astype(f32)
        out = mx.nd.array(g)
        kv.pushpull('fc', out)
        fraction = start * (ratio / start) ** (step / n_steps) if step < n_steps else ratio
        ks.append(math.ceil(size * fraction - 1e-9))
        assert kv.plan('fc').codec.k == ks[-1], (step, kv.codec_plan())
        got = out.asnumpy().reshape(-1)
        if momentum:
            want, delivered, (residual,), (velocity,) = momentum_element_topk_step(
                [g.reshape(-1)], [residual], [velocity], delivered, ks[-1], momentum)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        else:
            assert np.count_nonzero(got) == ks[-1]
            sent_total += got
            grad_total += g.reshape(-1)
            held = kv.key_state('fc').residual.reshape(-1)
            np.testing.assert_allclose(sent_total + held, grad_total, atol=1e-4)
    assert ks[0] == 750 and ks == sorted(ks, reverse=True) and ks[-3:] == [30] * 3
