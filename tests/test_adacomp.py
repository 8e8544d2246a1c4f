"""AdaComp: the C++ operators against the NumPy reference (python/kvx_ref/codecs.py),
bit for bit, on awkward tensors, above 2**16 and above 2**24 elements, malformed
payloads and the servers' decode_slots; then the codec and scheme classes."""
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


def trim(payload):
    """The payload without the slot's padding (what decode_slots hands a decoder)."""
    return payload[:wire.HEADER_WORDS + int(payload[7])]


def check_encode(ops, grad, residual, bin_len, capacity):
    n = grad.size
    want, want_res, want_status = ref.adacomp_encode(grad, residual, bin_len, capacity)
    res_nd = nd(residual)
    payload, status = ops.kvx_adacomp_encode(nd(grad), res_nd, bin=bin_len, capacity=capacity)
    assert status_of(status) == want_status == wire.OK
    got = payload.asnumpy()
    assert same_bits(got, want), (grad.shape, bin_len, capacity)
    assert same_bits(res_nd.asnumpy(), want_res)
    body = trim(got)
    want_out, st = ref.adacomp_decode(body, n)
    assert st == wire.OK
    out, status = ops.kvx_adacomp_decode(nd(body), shape=(n,))
    assert status_of(status) == wire.OK
    assert same_bits(out.asnumpy(), want_out)
    acc = make((n,), 'randn', 5)
    acc_nd = nd(acc)
    assert status_of(ops.kvx_adacomp_decode_add(nd(body), acc_nd)) == wire.OK
    assert np.array_equal(acc_nd.asnumpy(), acc + want_out)
    return got


@pytest.mark.parametrize('shape', [(1,), (7,), (3, 5), (16, 3, 3, 3), (1000,), (2 ** 16 + 3,)])
@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('bin_len', [1, 50, 500])
def test_encode_decode(ops, shape, kind, bin_len):
    n = int(np.prod(shape))
    grad, residual = grad_residual(shape, kind, 20 + bin_len)
    for capacity in sorted({1, max(1, n // 40), n}):   # overflow, tight, never full
        check_encode(ops, grad, residual, bin_len, capacity)


def test_capacity_keeps_largest(ops):
    """Over capacity the largest |H| go, ties to the lower index; the rest stays."""
    grad = np.array([1, 0, 0, 0, 0, -1], f32)
    residual = np.array([0.5, -2, 1, 0, 0, 0], f32)
    payload = check_encode(ops, grad, residual, 3, 2)
    assert list(payload) == [wire.MAGIC, wire.ADACOMP, wire.VERSION, 6, 0, 1.5, 2, 2, 0, 3]
    full = check_encode(ops, grad, residual, 3, 6)
    assert list(trim(full)[8:]) == [0, 3, 11]


def test_above_2_pow_24_elements(ops):
    """Indices beyond 2**23 (codes beyond 2**24) take two words an entry."""
    n = (1 << 24) + 37
    grad = np.zeros(n, f32)
    spikes = [0, 12345, (1 << 23) + 1, (1 << 24) - 1, 1 << 24, n - 1]
    grad[spikes] = [3, -3, -3, -3, 3, 3]
    residual = np.zeros(n, f32)
    residual[::997] = 0.25
    payload = check_encode(ops, grad, residual, 500, 5000)
    assert ref.adacomp_entry_words(n) == 2
    out, _ = ref.adacomp_decode(trim(payload), n)
    assert set(spikes) <= set(np.nonzero(out)[0])


@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf, 'overflow'])
def test_nonfinite(ops, bad):
    grad, residual = grad_residual((6, 5), 'randn', 50)
    if bad == 'overflow':      # G finite, H = G + grad is not
        grad[3, 2], residual[3, 2] = 2e38, 0
    else:
        grad[3, 2] = bad
    res_nd = nd(residual)
    payload, status = ops.kvx_adacomp_encode(nd(grad), res_nd, bin=7, capacity=10)
    assert status_of(status) == ref.adacomp_encode(grad, residual, 7, 10)[2] == wire.NONFINITE
    assert same_bits(res_nd.asnumpy(), residual)
    words = payload.asnumpy()       # void: first word NaN (cpp/ops.cc, set_encoded)
    assert np.isnan(words[0]) and not words[1:].any()


def _good():
    grad, residual = grad_residual((40,), 'randn', 60)
    payload = trim(ref.adacomp_encode(grad, residual, 10, 40)[0])
    assert payload[6] >= 3
    return payload


def _swap(p):
    p = p.copy()
    p[8], p[9] = p[9], p[8]
    return p


def _other_sign(p):
    """A second entry for the first entry's index."""
    p = p.copy()
    p[9] = p[8] + 1 - 2 * (p[8] % 2)
    return p


MALFORMED = [
    (_set(0, 1.0), wire.BAD_MAGIC),
    (_set(2, 0.0), wire.BAD_VERSION),
    (_set(1, wire.TOPK), wire.BAD_CODEC),
    (_set(3, 41.0), wire.BAD_SIZE),
    (_set(7, 1.0), wire.BAD_SIZE),
    (lambda p: np.concatenate([p, np.zeros(1, f32)]), wire.BAD_SIZE),   # padding kept
    (_set(5, np.nan), wire.BAD_PARAM),
    (_set(5, np.inf), wire.BAD_PARAM),
    (_set(5, -1.0), wire.BAD_PARAM),
    (_set(6, 1.5), wire.BAD_PARAM),
    (_set(6, np.nan), wire.BAD_PARAM),
    (_set(6, 41.0), wire.BAD_PARAM),
    (lambda p: _set(6, p[6] - 1)(p), wire.BAD_PARAM),
    (_set(8, 0.5), wire.BAD_WORD),
    (_set(8, -2.0), wire.BAD_WORD),
    (_set(8, np.nan), wire.BAD_WORD),
    (_set(8, 2.0 ** 24), wire.BAD_WORD),
    (_set(9, 80.0), wire.BAD_INDEX),
    (_swap, wire.BAD_INDEX),
    (_other_sign, wire.BAD_INDEX),
]


@pytest.mark.parametrize('corrupt,status', MALFORMED)
def test_malformed_payload(ops, corrupt, status):
    bad = corrupt(_good())
    assert ref.adacomp_decode(bad, 40)[1] == status
    assert_rejected(ops, 'adacomp', bad, 40, status)


def _slots(payloads, slot_words, seed=7):
    """Payloads behind garbage padding, as worker pushes arrive at a server."""
    out = np.random.default_rng(seed).standard_normal((len(payloads), slot_words)) * 1e3
    out = out.astype(f32)
    for w, p in enumerate(payloads):
        out[w, :p.size] = p
    return out


@pytest.mark.parametrize('workers', [1, 2, 5])
def test_decode_slots(ops, workers):
    shape, n = (12, 3, 3, 3), 324
    rng = np.random.default_rng(workers)
    payloads = [trim(ref.adacomp_encode(rng.standard_normal(shape).astype(f32),
                                        np.zeros(shape, f32), 50, 40)[0])
                for _ in range(workers)]
    assert_decode_slots(ops, _slots(payloads, ref.adacomp_entry_words(n) * 40 + 8), n,
                        bad_word=8)


def test_invalid_attrs(ops):
    g, r = nd(np.ones((4, 3), f32)), nd(np.zeros((4, 3), f32))
    for attrs in [dict(bin=0, capacity=2), dict(bin=5, capacity=13), dict(bin=5, capacity=0),
                  dict(bin=5), dict(capacity=3), dict(bin=5, capacity=3, k=1)]:
        with pytest.raises(mx.base.MXNetError):
            for out in ops.kvx_adacomp_encode(g, r, **attrs):
                out.wait_to_read()


# ---- the codec and the scheme ------------------------------------------------------------

def test_codec_capacity_and_describe():
    from kvstore_ext.codecs import AdaCompCodec
    from kvstore_ext.schemes import AdaComp
    scheme = AdaComp()
    conv = scheme.codec_for((64, 32, 5, 5), np.float32)
    fc = scheme.codec_for((512, 1024), np.float32)
    assert isinstance(conv, AdaCompCodec) and conv.bin == 50
    assert isinstance(fc, AdaCompCodec) and fc.bin == 500
    assert conv.capacity == int(np.ceil(3.0 * 51200 / 50))
    assert fc.payload_words() == 8 + 3 * -(-524288 // 500)
    assert scheme.codec_for((100,), np.float32).passthrough
    assert scheme.codec_for((64, 32, 5, 5), np.float16).passthrough
    chunk = fc.chunk(0, 1000)
    assert chunk.bin == 500 and chunk.capacity == 6
    small = AdaComp(bin_fc=10, max_per_bin=0.5, size_threshold=0).codec_for((7,), np.float32)
    assert small.capacity == 1
    with pytest.raises(ValueError):
        AdaComp(bin_conv=0)
    with pytest.raises(ValueError):
        AdaComp(max_per_bin=0)


def test_codec_encode_matches_reference():
    from kvstore_ext.schemes import AdaComp
    grad, residual = grad_residual((64, 1000), 'randn', 3)
    codec = AdaComp().codec_for(grad.shape, np.float32)
    res_nd = nd(residual)
    payload = codec.encode(nd(grad), res_nd)
    want, want_res, _ = ref.adacomp_encode(grad, residual, codec.bin, codec.capacity)
    assert same_bits(payload.asnumpy(), want)
    assert same_bits(res_nd.asnumpy(), want_res)
    decoded = codec.decode(payload).asnumpy()
    assert same_bits(decoded.reshape(-1), ref.adacomp_decode(trim(want), grad.size)[0])
