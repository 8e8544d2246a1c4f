"""dist_sync_dad (dAD, rank-dAD): kernels against the NumPy reference (python/kvx_ref/dad.py),
the Dense capture, the exactness claim, the scheme's choices, and real ps-lite jobs.

* The outer-product payload: C++ encode and decode bit for bit against the reference,
  malformed payloads rejected with a status (never a crash), the servers'
  decode_slots.
* The capture (kvstore_ext.dad.attach): the rows recorded by backward passes multiply
  to the weight gradient MXNet computed, for flatten True/False, with and without
  activation and bias, hybridized, on two devices, with grad_req='add' over two passes;
  inference records nothing.
* The power iteration (kvstore_ext/lowrank.py) against the reference, implicit and
  explicit products alike; a gradient of rank <= r comes back exactly.
* One process: a Trainer on dist_sync_dad returns, for every parameter, what the
  gradient itself is (dAD: exact to float32 rounding; fallback keys: float32);
  rank-dAD returns the reference's factors' product; the scheme's choices; the
  capacity and gradient checks; a NaN voids the step.
* Real ps-lite jobs (2 workers x 2 servers, 4 workers x 1 server; dad, oneway,
  rankdad; hybridized): every worker pulls the same sum, equal to the sum of the
  workers' own gradients (what dist_sync returns) for dAD and to the reference
  for rank-dAD.
"""
import json

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

from kvx_ref import codecs as ref_codecs
from kvx_ref import dad as ref
from kvx_ref import wire

import kvstore_ext
import kvstore_ext.dad as dad
from kvstore_ext import chunking, lowrank
from kvstore_ext.codecs.outer import GradientMismatch, OuterCodec

from test_cpp_ops import _set, nd, ops, library_path, same_bits, status_of  # noqa: F401
from test_dist_aggregate import launch

import dad_job

f32 = np.float32


def close(got, want, rel):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    err = np.abs(got - want).max()
    assert err <= rel * scale, 'max error %g, %g of the largest value' % (err, err / scale)


# ---- the payload: C++ against the reference ------------------------------------------

def factors(rng, rows, out, inputs):
    return (rng.standard_normal((rows, out)).astype(f32),
            rng.standard_normal((rows, inputs)).astype(f32))


@pytest.mark.parametrize('rows, capacity, out, inputs', [(3, 5, 4, 7), (5, 5, 1, 1),
                                                         (12, 16, 64, 1030), (1, 1, 300, 2),
                                                         (7, 9, 10, 530)])
def test_encode_decode_match_reference(ops, rows, capacity, out, inputs):
    u, v = factors(np.random.default_rng(rows), rows, out, inputs)
    payload, status = ops.kvx_outer_encode(nd(u), nd(v), capacity=capacity)
    want, want_status = ref.outer_encode(u, v, capacity)
    assert status_of(status) == want_status == wire.OK
    assert same_bits(payload.asnumpy(), want)
    n = out * inputs
    decoded, status = ops.kvx_outer_decode(payload, shape=(n,))
    want_decoded, want_status = ref.outer_decode(want, n)
    assert status_of(status) == want_status == wire.OK
    assert same_bits(decoded.asnumpy(), want_decoded)
    close(want_decoded.reshape(out, inputs), u.T.astype(np.float64) @ v, 1e-5)
    acc = np.random.default_rng(1).standard_normal(n).astype(f32)
    acc_nd = nd(acc)
    assert status_of(ops.kvx_outer_decode_add(payload, acc_nd)) == wire.OK
    assert same_bits(acc_nd.asnumpy(), acc + want_decoded)


def test_encode_refuses_nonfinite(ops):
    u, v = factors(np.random.default_rng(0), 2, 3, 4)
    v[1, 2] = np.nan
    payload, status = ops.kvx_outer_encode(nd(u), nd(v), capacity=3)
    assert status_of(status) == ref.outer_encode(u, v, 3)[1] == wire.NONFINITE
    words = payload.asnumpy()       # void: first word NaN (cpp/ops.cc, set_encoded)
    assert np.isnan(words[0]) and not words[1:].any()


def _good():
    u, v = factors(np.random.default_rng(5), 2, 4, 6)
    return ref.outer_encode(u, v, 3)[0]


MALFORMED = [
    (_set(0, 1.0), wire.BAD_MAGIC),
    (_set(1, wire.TOPK), wire.BAD_CODEC),
    (_set(3, 25.0), wire.BAD_SIZE),
    (_set(7, 1.0), wire.BAD_SIZE),
    (_set(5, 4.0), wire.BAD_SIZE),               # k says 4 rows, the body holds 3
    (_set(5, 1.5), wire.BAD_PARAM),
    (_set(5, np.nan), wire.BAD_PARAM),
    (_set(6, 0.0), wire.BAD_PARAM),
    (_set(6, 5.0), wire.BAD_PARAM),              # 5 does not divide n = 24
    (_set(6, 8.0), wire.BAD_SIZE),               # 8 x 3: the body would be 33 words
    (_set(9, np.inf), wire.BAD_WORD),
    (_set(37, np.nan), wire.BAD_WORD),           # in the zero padding
    (lambda p: p[:-1].copy(), wire.BAD_SIZE),
]


@pytest.mark.parametrize('corrupt, status', MALFORMED)
def test_malformed_payload(ops, corrupt, status):
    bad = corrupt(_good())
    assert ref.outer_decode(bad, 24)[1] == status
    out, got = ops.kvx_outer_decode(nd(bad), shape=(24,))
    assert status_of(got) == status and not out.asnumpy().any()
    acc = np.arange(24, dtype=f32)
    acc_nd = nd(acc)
    assert status_of(ops.kvx_outer_decode_add(nd(bad), acc_nd)) == status
    assert same_bits(acc_nd.asnumpy(), acc)


def test_decode_add_skips_zero_coefficients_bit_for_bit(ops):
    """The decoder skips rows j whose coefficients for a tile of acc's rows are all zero
    (and forms each tile in registers): still the reference's sum bit for bit, with
    zeros in some rows of a tile but not others, -0 coefficients and -0 in acc."""
    rng = np.random.default_rng(5)
    rows, out, inputs = 9, 13, 70
    u, v = factors(rng, rows, out, inputs)
    u[2] = 0.0                 # a row j with no coefficient at all
    u[4, :4] = -0.0            # zero for the first tile of rows only
    u[6, 5:7] = 0.0            # zero in part of a tile
    payload = ref.outer_encode(u, v, rows + 2)[0]
    n = out * inputs
    acc = rng.standard_normal(n).astype(f32)
    acc[::7] = -0.0
    acc_nd = nd(acc)
    assert status_of(ops.kvx_outer_decode_add(nd(payload), acc_nd)) == wire.OK
    assert same_bits(acc_nd.asnumpy(), acc + ref.outer_decode(payload, n)[0])


@pytest.mark.parametrize('workers', [1, 2, 4])
def test_decode_slots(ops, workers):
    """The servers' sum of every worker's U^T V, behind garbage padding, bit for bit as
    the reference; a non-finite word names its worker and makes the sum NaN."""
    rng = np.random.default_rng(workers)
    out, inputs, capacity = 6, 50, 4
    payloads = [ref.outer_encode(*factors(rng, 1 + w % capacity, out, inputs), capacity)[0]
                for w in range(workers)]
    slots = rng.standard_normal((workers, payloads[0].size + 5)).astype(f32) * 1e3
    for w, p in enumerate(payloads):
        slots[w, :p.size] = p
    n = out * inputs
    total, status = ops.kvx_decode_slots(nd(slots), size=n + 3)
    want, want_status = ref_codecs.decode_slots(slots, n + 3)
    assert list(status.asnumpy()) == want_status == [0] * workers
    assert same_bits(total.asnumpy(), want)
    slots[-1, 20] = np.inf
    total, status = ops.kvx_decode_slots(nd(slots), size=n)
    assert status.asnumpy()[-1] == wire.BAD_WORD
    assert np.isnan(total.asnumpy()).all()


# ---- the capture ------------------------------------------------------------------------

def run_net(net, xs, ctxs, passes=1):
    for _ in range(passes):
        with autograd.record():
            losses = [(net(mx.nd.array(x, ctx=c)) ** 2).sum() for x, c in zip(xs, ctxs)]
        for loss in losses:
            loss.backward()


def captured_product(layer):
    a, d = layer.take()
    return ref.dad_gradient(a, d), a, d


@pytest.mark.parametrize('capture', ['plugin', 'python'])
@pytest.mark.parametrize('flatten, activation, use_bias, hybrid, devices, passes', [
    (True, 'relu', True, False, 1, 1),
    (True, None, False, True, 1, 1),
    (False, 'tanh', True, True, 2, 1),
    (True, 'sigmoid', True, False, 2, 2),       # grad_req='add': rows of both passes
])
def test_capture_multiplies_to_the_gradient(flatten, activation, use_bias, hybrid, devices,
                                            passes, capture):
    ctxs = [mx.cpu(i) for i in range(devices)]
    net = nn.HybridSequential()
    net.add(nn.Dense(12, activation='relu', flatten=flatten),
            nn.Dense(7, activation=activation, use_bias=use_bias, flatten=flatten))
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if passes > 1:
        net.collect_params().setattr('grad_req', 'add')
    layers = dad.attach(net, capture=capture)
    assert all(layer.plugin == (capture == 'plugin') for layer in layers)
    if hybrid:
        net.hybridize(static_alloc=True, static_shape=True)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 3, 4)).astype(f32) for _ in ctxs]
    for step in range(2):                      # a second step: the rows were taken
        if passes > 1:
            net.collect_params().zero_grad()
        run_net(net, xs, ctxs, passes)
        for layer, block in zip(layers, net):
            grad = sum(g.asnumpy() for g in block.weight.list_grad())
            product, a, d = captured_product(layer)
            rows = 5 * (1 if flatten else 3) * devices * passes
            assert a.shape[0] == d.shape[0] == rows
            assert d.shape[1] == block._units
            close(product, grad, 1e-5)
            if use_bias or block is net[0]:
                bias = sum(g.asnumpy() for g in block.bias.list_grad())
                close(d.sum(axis=0), bias, 1e-5)          # the bias: D's column sums
    net(mx.nd.array(xs[0], ctx=ctxs[0])).wait_to_read()       # inference
    mx.nd.waitall()
    assert all(layer.take() is None for layer in layers)


@pytest.mark.parametrize('capture', ['plugin', 'python'])
@pytest.mark.parametrize('hybrid', [False, True])
def test_capture_leaves_every_gradient_unchanged(capture, hybrid):
    """Three Dense layers, the first on the data (whose gradient nobody asks for): with
    the capture attached every parameter's gradient is the plain network's, so the zero
    the capture gives A adds nothing to what FullyConnected gives it."""
    def gradients(attached):
        mx.random.seed(5)
        net = nn.HybridSequential()
        net.add(nn.Dense(9, activation='relu'), nn.Dense(6, activation='tanh'), nn.Dense(4))
        net.initialize(mx.init.Xavier())
        if attached:
            dad.attach(net, capture=capture)
        if hybrid:
            net.hybridize()
        x = mx.nd.array(np.random.default_rng(1).standard_normal((7, 5)).astype(f32))
        run_net(net, [x.asnumpy()], [mx.cpu()])
        grads = [p.grad().asnumpy() for p in net.collect_params().values()]
        dad.detach(net)
        return grads
    for plain, captured in zip(gradients(False), gradients(True)):
        assert np.array_equal(plain, captured)


def test_capture_choice(monkeypatch):
    """'auto' takes the plugin's operator on a CPU-only process, the Python one when
    MXNet would ask the capture to add to A's gradient (where 'plugin' is refused: it
    would overwrite it); a wrong name is refused."""
    net = nn.HybridSequential()
    net.add(nn.Dense(4))
    net.initialize()
    assert mx.context.num_gpus() == 0
    assert dad.attach(net)[0].plugin
    dad.detach(net)
    monkeypatch.setenv('MXNET_EXEC_ENABLE_ADDTO', '1')
    with pytest.raises(ValueError, match='MXNET_EXEC_ENABLE_ADDTO'):
        dad.attach(net, capture='plugin')
    assert not dad.attach(net)[0].plugin
    dad.detach(net)
    with pytest.raises(ValueError, match='capture'):
        dad.attach(net, capture='cuda')


def test_plugin_capture_refuses_other_dtypes():
    """The plugin's capture is float32: a float64 network fails with the op's name
    instead of recording garbage (capture='python' takes any dtype)."""
    net = nn.HybridSequential()
    net.add(nn.Dense(3))
    net.initialize()
    net.cast('float64')
    dad.attach(net, capture='plugin')
    x = mx.nd.ones((2, 5), dtype='float64')
    with pytest.raises(mx.MXNetError, match='kvx_dad_capture'):
        with autograd.record():
            y = net(x)
        y.backward()
        mx.nd.waitall()
    dad.detach(net)
    layer = dad.attach(net, capture='python')[0]
    with autograd.record():
        y = net(x)
    y.backward()
    mx.nd.waitall()
    a, d = layer.take()
    close(ref.dad_gradient(a, d), net[0].weight.grad().asnumpy(), 1e-6)


def test_attach_is_idempotent_and_detach_restores():
    net = nn.HybridSequential()
    net.add(nn.Dense(4), nn.Dense(3))
    net.initialize()
    first = dad.attach(net)
    assert dad.attach(net) == first and all(l in dad.layers() for l in first)
    dad.detach(net)
    assert not any(l in dad.layers() for l in first)
    run_net(net, [np.ones((2, 5), f32)], [mx.cpu()])
    mx.nd.waitall()
    assert all(l.take() is None for l in first)


# ---- the power iteration ------------------------------------------------------------------

@pytest.mark.parametrize('rows, out, inputs, rank, iterations', [
    (6, 40, 70, 4, 1), (6, 40, 70, 2, 3), (50, 10, 12, 3, 2)])   # the last forms M
def test_power_iteration_matches_reference(rows, out, inputs, rank, iterations):
    rng = np.random.default_rng(rows + out)
    a, d = rng.standard_normal((rows, inputs)), rng.standard_normal((rows, out))
    p, q = lowrank.factors_of_product(a, d, rank, iterations, seed=3, tol=0)
    want_p, want_q = ref.power_factors(ref.dad_gradient(a, d), rank, iterations, seed=3)
    np.testing.assert_allclose(p, want_p, atol=1e-9)
    np.testing.assert_allclose(q, want_q, atol=1e-9 * np.abs(want_q).max())
    np.testing.assert_allclose(p.T @ p, np.eye(rank), atol=1e-6)     # deflation: orthonormal


def test_low_rank_gradient_comes_back_exactly():
    """D^T A of rank 2 (2 rows): rank-4 factors reproduce it (the deflated remainder is
    zero, so the last components are zero)."""
    rng = np.random.default_rng(9)
    a, d = rng.standard_normal((2, 30)), rng.standard_normal((2, 20))
    p, q = lowrank.factors_of_product(a, d, 4, 2)
    close(p @ q.T, d.T @ a, 1e-9)


def test_host_array_is_a_float32_copy():
    """The factors reach the engine through ``host_array`` (no wait for the engine's
    queue): a C-ordered float32 copy, so that the NumPy array it came from (a slice of
    the captured rows, float64 factors) may change afterwards."""
    from kvstore_ext.ops import host_array
    rows = np.arange(24, dtype=np.float64).reshape(4, 6)
    part = rows[:, 1:4]                       # not contiguous
    array = host_array(part)
    assert array.dtype == np.float32 and array.shape == (4, 3)
    want = part.astype(np.float32)
    rows[:] = -1.0
    assert np.array_equal(array.asnumpy(), want)
    same = np.ones((2, 3), np.float32)        # already float32 and contiguous: copied too
    array = host_array(same)
    same[:] = 5.0
    assert np.array_equal(array.asnumpy(), np.ones((2, 3), np.float32))
    assert host_array(np.zeros((0, 5))).shape == (0, 5)


def test_factors_with_residual_match_reference():
    """Error feedback's step (implicit operator, float32 out x in products) against the
    reference (explicit M = D^T A + R, float64); zero residual: the plain factors."""
    rng = np.random.default_rng(11)
    rows, out, inputs = 6, 40, 70
    a = rng.standard_normal((rows, inputs)).astype(f32)
    d = rng.standard_normal((rows, out)).astype(f32)
    r = (rng.standard_normal((out, inputs)) * 2).astype(f32)
    for iterations in (1, 3):
        u, v, left = lowrank.factors_with_residual(a, d, r, 4, iterations, seed=2)
        want_u, want_v, want_left = ref.rank_dad_ef(a, d, r, 4, iterations, seed=2)
        close(u, want_u, 1e-5)
        close(v, want_v, 1e-5)
        close(left, want_left, 1e-5)
        m = ref.dad_gradient(a, d) + r          # what was sent plus what is kept is M
        close(u.T.astype(np.float64) @ v + left, m, 1e-6)
    u, v, left = lowrank.factors_with_residual(a, d, np.zeros((out, inputs), f32), 4, 1)
    want_u, want_v = ref.rank_dad(a, d, 4, 1)
    close(u, want_u, 1e-5)
    close(v, want_v, 1e-5)
    close(left, ref.dad_gradient(a, d) - u.T.astype(np.float64) @ v, 1e-5)


# ---- one process: the store ------------------------------------------------------------------

def test_kv_attach_captures_the_dense_layers_for_dad_only():
    """kv.attach(net), which the training scripts call whatever the kvstore type:
    dist_sync_dad captures the network's Dense layers, so its first step sends their
    rows; another scheme leaves the network as it is."""
    net = dad_job.build_net()
    net.initialize(mx.init.Xavier())
    dense = [b for b in net if isinstance(b, nn.Dense)]
    mx.kv.create('dist_sync_hylo').attach(net)
    assert not any(l.block in dense for l in dad.layers())
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression({'size_threshold': 0})
    kv.attach(net)
    try:
        assert sorted(dense.index(l.block) for l in dad.layers() if l.block in dense) == \
            [0, 1, 2]
        trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05},
                                kvstore=kv, update_on_kvstore=False)
        run_net(net, [dad_job.batch(0, 0, 0)], [mx.cpu()])
        trainer.step(dad_job.ROWS)
        assert sum(d.startswith('dad') for d in kv.codec_plan().values()) == 2
    finally:
        dad.detach(net)


def trainer_run(params, steps=3, hybrid=False, devices=2, seed=3):
    """Per step: {param name: (own gradient, what the kvstore returned)}, and the store."""
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression(params)
    ctxs = [mx.cpu(i) for i in range(devices)]
    mx.random.seed(seed)
    net = dad_job.build_net()
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    layers = dad.attach(net)
    if hybrid:
        net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05}, kvstore=kv,
                            update_on_kvstore=False)
    history = []
    for step in range(steps):
        run_net(net, [dad_job.batch(0, step, i) for i in range(devices)], ctxs)
        own = {n: sum(g.asnumpy() for g in p.list_grad())
               for n, p in net.collect_params().items()}
        rows = {l.block.weight.name: l.peek() for l in layers}
        trainer.allreduce_grads()
        got = {n: p.list_grad()[0].asnumpy() for n, p in net.collect_params().items()}
        history.append({n: (own[n], got[n], rows.get(n)) for n in own})
        trainer.update(12)
    return history, kv, net


def dense_names(net):
    return [b.weight.name for b in net if isinstance(b, nn.Dense)][:2]


@pytest.mark.parametrize('hybrid', [False, True])
def test_dad_equals_the_gradient(hybrid):
    """The exactness claim on one worker: what dist_sync_dad returns for every parameter
    is the gradient itself (dist_sync's sum over one worker), to float32 rounding;
    Dense weights through dAD, everything else through the fallback (float32)."""
    history, kv, net = trainer_run({'chunk_size': 8192, 'size_threshold': 0}, hybrid=hybrid)
    plan = sorted(kv.codec_plan().values())
    assert plan.count('dad 12 rows of 64 x 144') == 1 and plan.count('dad 12 rows of 48 x 64') == 1
    dense = dense_names(net)
    for record in history:
        for name, (own, got, _) in record.items():
            if name in dense:
                close(got, own, 2e-6)
            else:
                assert np.array_equal(got, own), name
    stats = kv.comm_stats()
    assert stats['push_bytes'] < stats['raw_bytes'] / 2


@pytest.mark.parametrize('method', ['oneway', 'rankdad'])
def test_rank_dad_matches_reference(method):
    history, kv, net = trainer_run({'method': method, 'rank': 3, 'iterations': 2,
                                    'tol': 0.0, 'size_threshold': 0, 'error_feedback': 0})
    dense = dense_names(net)
    for record in history:
        for name in dense:
            own, got, rows = record[name]
            a, d = rows
            u, v = ref.rank_dad(a, d, 3, 2)
            want = ref.outer_decode(ref.outer_encode(u, v, 3)[0], u.shape[1] * v.shape[1])[0]
            if method == 'rankdad':         # the server factorises the sum once more
                p, q = ref.power_factors(want.reshape(u.shape[1], -1), 3, 2)
                want = (p @ q.T).astype(f32)
            close(got, want.reshape(got.shape), 1e-4)
    stats = kv.comm_stats()
    assert stats['push_bytes'] < stats['raw_bytes'] / 2
    if method == 'rankdad':
        assert stats['pull_bytes'] < stats['raw_bytes'] / 2


def test_scheme_choices_and_fallback():
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression({'fallback': 'powersgd', 'fallback.size_threshold': 100,
                                 'fallback.rank': 2})
    assert kv.scheme.fallback.params['rank'] == 2
    assert kv.scheme.params['fallback.rank'] == 2
    # a key no attached Dense layer owns is the fallback's (with no layer attached at all
    # the first plan is refused: tests/test_handover.py)
    unrelated = nn.Dense(3, in_units=2)
    dad.attach(unrelated)
    assert kv.scheme.codec_for_key(0, (64, 144), f32).describe() == 'powersgd rank 2 of 64 x 144'
    with pytest.raises(ValueError):
        kvstore_ext.SCHEMES['dad'](fallback='dad')
    with pytest.raises(ValueError):
        kvstore_ext.SCHEMES['dad'](**{'fallback.chunk_size': 4096})
    with pytest.raises(ValueError):
        kvstore_ext.SCHEMES['dad'](**{'fallback.bogus': 1})
    with pytest.raises(ValueError):
        kvstore_ext.SCHEMES['dad'](method='svd')
    # the last layer (5 x 48, 12 rows) is not 2x smaller as rows: fallback
    _, kv, _ = trainer_run({'size_threshold': 0}, steps=1)
    assert sum(d.startswith('dad') for d in kv.codec_plan().values()) == 2
    # below size_threshold (the default, 32768): every layer is the fallback's
    _, kv, _ = trainer_run({'method': 'oneway'}, steps=1)
    assert not any(d.startswith('oneway') for d in kv.codec_plan().values())
    _, kv, _ = trainer_run({'method': 'oneway', 'size_threshold': 3072}, steps=1)
    assert sum(d.startswith('oneway') for d in kv.codec_plan().values()) == 2
    # error feedback: on by default for the rank methods, never for dad (exact)
    assert sum(d.endswith(', error feedback') for d in kv.codec_plan().values()) == 2
    assert all(kv.key_state(k).residual is not None for k, d in kv.codec_plan().items()
               if d.startswith('oneway'))
    _, kv, _ = trainer_run({'method': 'oneway', 'size_threshold': 3072,
                            'error_feedback': 0}, steps=1)
    assert not any(d.endswith('error feedback') for d in kv.codec_plan().values())
    assert OuterCodec((64, 144), None, 'dad', capacity=12, error_feedback=True).describe() \
        == 'dad 12 rows of 64 x 144'
    assert not OuterCodec((64, 144), None, 'dad', capacity=12,
                          error_feedback=True).uses_residual
    codec = OuterCodec((5, 48), None, capacity=12)
    assert not codec.compressible() and OuterCodec((64, 144), None, capacity=12).compressible()


def test_fallback_follows_the_workers():
    """The store tells dad its workers; the Hylo fallback's worker-count rules ('auto'
    agreement and momentum correction) follow them, so that a fallback key at 8 workers
    plans what dist_sync_hylo plans there."""
    from kvstore_ext.codecs import AdditiveTopKCodec, MomentumCorrected
    scheme = kvstore_ext.SCHEMES['dad'](**{'fallback.aggregation': 'homomorphic',
                                           'fallback.momentum': 0.9,
                                           'fallback.size_threshold': 100})
    conv = (16, 8, 3, 3)
    assert type(scheme.codec_for(conv, f32)) is AdditiveTopKCodec
    scheme.num_workers = 8
    assert scheme.num_workers == scheme.fallback.num_workers == 8
    codec = scheme.codec_for(conv, f32)
    assert isinstance(codec, MomentumCorrected) and type(codec.inner) is AdditiveTopKCodec
    assert codec.agreement == 'round'


def test_checkpoint_restores_fallback_params(tmp_path):
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression({'method': 'oneway', 'fallback.size_threshold': 500})
    path = str(tmp_path / 's.kvx')
    kv.save_compression_state(path)
    again = mx.kv.create('dist_sync_dad')
    again.load_compression_state(path)
    assert again.scheme.params == kv.scheme.params
    assert again.scheme.fallback.params['size_threshold'] == 500


def _one_layer_store(params):
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression(dict({'size_threshold': 0}, **params))
    net = nn.Dense(40, in_units=60)
    net.initialize(mx.init.Xavier())
    layer = dad.attach(net)[0]
    return kv, net, layer


def test_more_rows_than_the_capacity_raise():
    kv, net, _ = _one_layer_store({})
    run_net(net, [np.ones((4, 60), f32)], [mx.cpu()])
    kv.pushpull(0, net.weight.grad())
    assert kv.codec_plan()[0] == 'dad 4 rows of 40 x 60'
    run_net(net, [np.ones((5, 60), f32)], [mx.cpu()])
    with pytest.raises(ValueError, match='capacity'):
        kv.pushpull(0, net.weight.grad())
    kv, net, _ = _one_layer_store({'capacity': 8})          # set: room for 8
    run_net(net, [np.ones((4, 60), f32)], [mx.cpu()])
    kv.pushpull(0, net.weight.grad())
    run_net(net, [np.ones((7, 60), f32)], [mx.cpu()])
    grad = net.weight.grad().asnumpy()
    kv.pushpull(0, net.weight.grad())
    close(net.weight.grad().asnumpy(), grad, 1e-6)


def test_a_changed_gradient_is_refused():
    """A gradient that is not D^T A (clipped, or a backward pass's rows counted twice)
    is refused, unless check_gradient=0."""
    kv, net, _ = _one_layer_store({})
    rng = np.random.default_rng(0)
    run_net(net, [rng.standard_normal((4, 60)).astype(f32)], [mx.cpu()])
    kv.pushpull(0, net.weight.grad())
    run_net(net, [rng.standard_normal((4, 60)).astype(f32)], [mx.cpu()])
    net.weight.grad()[:] *= 0.5
    with pytest.raises(GradientMismatch):
        kv.pushpull(0, net.weight.grad())
    kv, net, _ = _one_layer_store({'check_gradient': 0})
    run_net(net, [rng.standard_normal((4, 60)).astype(f32)], [mx.cpu()])
    want = net.weight.grad().asnumpy()
    net.weight.grad()[:] *= 0.5
    kv.pushpull(0, net.weight.grad())
    close(net.weight.grad().asnumpy(), want, 1e-6)     # the rows, not the changed gradient


def test_nan_voids_the_step():
    kv, net, layer = _one_layer_store({})
    x = np.ones((4, 60), f32)
    run_net(net, [x], [mx.cpu()])
    kv.pushpull(0, net.weight.grad())
    x[1, 3] = np.nan
    run_net(net, [x], [mx.cpu()])
    grad = net.weight.grad()
    kv.pushpull(0, grad)
    assert np.isnan(grad.asnumpy()).all()
    run_net(net, [np.ones((4, 60), f32)], [mx.cpu()])          # and the next step is fine
    want = net.weight.grad().asnumpy()
    kv.pushpull(0, net.weight.grad())
    close(net.weight.grad().asnumpy(), want, 1e-6)


def test_a_non_finite_gradient_voids_the_step_and_a_large_one_does_not():
    """The gradient is checked on the host, in the one pass of the probe product: NaN
    or Inf in it (the rows finite) voids the step, with the check on or off; a finite
    gradient whose probe product overflows float32 is not taken for a non-finite one,
    nor, with the check on, for a gradient off its rows."""
    x = np.ones((4, 60), f32)
    for params in ({}, {'check_gradient': 0}):
        kv, net, _ = _one_layer_store(params)
        run_net(net, [x], [mx.cpu()])
        kv.pushpull(0, net.weight.grad())
        run_net(net, [x], [mx.cpu()])
        grad = net.weight.grad()
        grad[2, 5] = np.inf
        kv.pushpull(0, grad)
        assert np.isnan(grad.asnumpy()).all(), params
    kv, net, _ = _one_layer_store({'check_gradient': 0})
    run_net(net, [x], [mx.cpu()])
    want = net.weight.grad().asnumpy()
    probe = OuterCodec((40, 60), None).probe()
    grad = net.weight.grad()
    grad[0] = mx.nd.array(3e38 * probe)          # finite; its probe product is not
    with np.errstate(over='ignore'):
        assert not np.isfinite(grad.asnumpy()[0] @ probe)
    kv.pushpull(0, grad)
    close(grad.asnumpy(), want, 1e-6)            # the rows' product, not a void step
    codec = OuterCodec((40, 60), 'layer')
    a, d = np.zeros((4, 60)), np.zeros((4, 40))
    a[0], d[0] = 1e19 * probe, 1e18              # every row 1e37 r: g r = 6e38
    big = (d.T @ a).astype(f32)
    codec.check_gradient(big, a, d)              # no error: it is D^T A
    with pytest.raises(GradientMismatch):
        codec.check_gradient(big * 0.5, a, d)


# ---- real ps-lite jobs ---------------------------------------------------------------------

DIST_CASES = [(2, 2, 'dad', False, 0), (4, 1, 'dad', True, 0), (2, 1, 'oneway', False, 0),
              (4, 2, 'rankdad', False, 0),
              (2, 1, 'oneway', False, 1), (4, 1, 'oneway', True, 1),       # error feedback
              (2, 2, 'rankdad', False, 1), (4, 2, 'rankdad', False, 1)]


def dist_rank_dad_reference(runs, i, step_count, shape, method, feedback, chunk_size=8192):
    """Per step, the sum every worker should pull for dAD layer ``i`` and each worker's
    residual after the step, by the reference fed each worker's captured rows (each
    chunk of rows on its own; rankdad: the servers' re-factorisation, with their own
    residual per chunk if ``feedback``)."""
    chunks = chunking.split(OuterCodec(shape, None, method, rank=3), chunk_size)
    worker = [np.zeros(shape, f32) for _ in runs]
    server = np.zeros(shape, f32)
    sums, residuals = [], []
    for step in range(step_count):
        total = np.zeros(shape, f32)
        for chunk in chunks:
            rows = slice(chunk.start, chunk.stop)
            part = np.zeros((chunk.stop - chunk.start) * shape[1], f32)
            for w, run in enumerate(runs):
                a = run['A/%d/%d' % (i, step)]
                d = run['D/%d/%d' % (i, step)][:, rows]
                if feedback:
                    u, v, worker[w][rows] = ref.rank_dad_ef(a, d, worker[w][rows], 3, 1,
                                                            tol=1e-3)
                else:
                    u, v = ref.rank_dad(a, d, 3, 1, tol=1e-3)
                part += ref.outer_decode(ref.outer_encode(u, v, 3)[0], part.size)[0]
            part = part.reshape((-1, shape[1]))
            if method == 'rankdad':
                u, v, left = ref.server_reply(part, 3, 1, server[rows] if feedback else None)
                if feedback:
                    server[rows] = left
                part = ref.outer_decode(ref.outer_encode(u, v, 3)[0], part.size)[0]
            total[rows] = part.reshape((-1, shape[1]))
        sums.append(total)
        residuals.append([r.copy() for r in worker])
    return sums, residuals


@pytest.mark.parametrize('workers, servers, method, hybrid, feedback', DIST_CASES)
def test_dist_matches_dist_sync_and_reference(tmp_path, job_env, workers, servers, method,
                                              hybrid, feedback):
    params = {'method': method, 'chunk_size': 8192, 'rank': 3, 'size_threshold': 0,
              'error_feedback': feedback}
    steps = 3
    launch(tmp_path, job_env, workers, servers,
           [dad_job.__file__, '--kvstore', 'dist_sync_dad', '--params', json.dumps(params),
            '--steps', str(steps), '--out', str(tmp_path)] + (['--hybridize'] if hybrid else []))
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    info = json.load(open(str(tmp_path / 'rank0.json')))
    dense = info['layers'][:2]                   # the third Dense takes the fallback
    prefix = 'dad 12 rows' if method == 'dad' else '%s rank 3' % method
    suffix = ', error feedback' if feedback else ''
    assert sum(p.startswith(prefix) and p.endswith(suffix) for p in info['plan']) == 2, \
        info['plan']
    names = sorted({k.split('/')[1] for k in runs[0] if k.startswith('sum/')})
    chunked = 0
    for name in names:
        sums = [[run['sum/%s/%d' % (name, step)] for run in runs] for step in range(steps)]
        for step in range(steps):
            for s in sums[step][1:]:
                assert np.array_equal(s, sums[step][0]), 'workers pulled different sums'
        if name not in dense or method == 'dad':
            for step in range(steps):
                dist_sync = sum(run['local/%s/%d' % (name, step)].astype(np.float64)
                                for run in runs)
                close(sums[step][0], dist_sync, 2e-6 if name in dense else 1e-6)
            continue                             # dad: the exactness claim
        i = dense.index(name)
        shape = sums[0][0].shape
        want, residuals = dist_rank_dad_reference(runs, i, steps, shape, method, feedback)
        for step in range(steps):
            close(sums[step][0], want[step], 1e-4)
        chunked += shape[0] > 56                 # dense0: two chunks
        if not feedback:
            assert not any(k.startswith('residual/') for k in runs[0])
            continue
        plain, _ = dist_rank_dad_reference(runs, i, steps, shape, method, False)
        for step in range(steps):
            for w, run in enumerate(runs):       # each worker's own residual
                close(run['residual/%s/%d' % (name, step)], residuals[step][w], 1e-4)
            if step:                             # it changes, and it is used
                for w in range(workers):
                    moved = np.abs(residuals[step][w] - residuals[step - 1][w]).max()
                    assert moved > 0.1 * np.abs(residuals[step][w]).max()
                assert np.abs(want[step] - plain[step]).max() > \
                    0.01 * np.abs(plain[step]).max()
                assert np.abs(sums[step][0] - plain[step]).max() > \
                    0.01 * np.abs(plain[step]).max()
    assert chunked == (1 if method != 'dad' else 0)
    stats = info['stats']
    assert stats['steps'] == steps
    assert stats['push_bytes'] < stats['raw_bytes']


def test_void_result_bytes_and_resume(tmp_path):
    """The contract test's cases on a dAD key (the contract test itself runs without
    ``attach``, so it sees the fallback only): another worker's NaN (a void result)
    leaves nothing behind; bytes are the codec's; a resumed store continues alike."""
    from test_scheme_contract import VoidingTransport
    kv, net, _ = _one_layer_store({})
    kv._transport = VoidingTransport(kv._transport)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((4, 60)).astype(f32) for _ in range(4)]
    outs = []
    for step, x in enumerate(xs):
        kv._transport.voiding = step == 1
        run_net(net, [x], [mx.cpu()])
        want = net.weight.grad().asnumpy()
        kv.pushpull(0, net.weight.grad())
        outs.append(net.weight.grad().asnumpy())
        if step == 1:
            assert np.isnan(outs[-1]).all()
        else:
            close(outs[-1], want, 1e-6)
    codec = kv.plan(0).codec
    assert codec.describe() == 'dad 4 rows of 40 x 60'
    stats = kv.comm_stats()
    assert stats['push_bytes'] == 4 * 4 * codec.payload_words() == 4 * 4 * (8 + 4 * 100)
    assert stats['pull_bytes'] == stats['raw_bytes'] == 4 * 4 * 2400
    path = str(tmp_path / 'dad.kvx')
    kv.save_compression_state(path)
    resumed = mx.kv.create('dist_sync_dad')
    resumed.load_compression_state(path)
    assert resumed.comm_stats() == kv.comm_stats()
    run_net(net, [xs[0]], [mx.cpu()])
    want = net.weight.grad().asnumpy()
    resumed.pushpull(0, net.weight.grad())
    close(net.weight.grad().asnumpy(), want, 1e-6)


# ---- rank-dAD with error feedback, one process -----------------------------------------------

EF_CHUNK = 4096         # dense0 (64 x 144) in three chunks of rows, dense1 (48 x 64) whole


def rank_dad_reference(method, steps_rows, shape, rank=3, iterations=1, tol=0.0,
                       feedback=True, chunk_size=EF_CHUNK):
    """The sums one worker (one process) gets for a layer over steps, and its and the
    servers' residuals after them, by the reference: per chunk of rows, a worker
    residual; rankdad also a server residual."""
    chunks = chunking.split(OuterCodec(shape, None, method, rank=rank), chunk_size)
    worker = [np.zeros((c.stop - c.start, shape[1]), f32) for c in chunks]
    server = [np.zeros((c.stop - c.start, shape[1]), f32) for c in chunks]
    sums = []
    for a, d in steps_rows:
        total = np.zeros(shape, f32)
        for i, c in enumerate(chunks):
            rows = slice(c.start, c.stop)
            if feedback:
                u, v, worker[i] = ref.rank_dad_ef(a, d[:, rows], worker[i], rank, iterations,
                                                  tol=tol)
            else:
                u, v = ref.rank_dad(a, d[:, rows], rank, iterations, tol=tol)
            part = ref.outer_decode(ref.outer_encode(u, v, rank)[0], u.shape[1] * v.shape[1])[0]
            part = part.reshape((-1, shape[1]))
            if method == 'rankdad':
                u, v, left = ref.server_reply(part, rank, iterations,
                                              server[i] if feedback else None)
                if feedback:
                    server[i] = left
                part = ref.outer_decode(ref.outer_encode(u, v, rank)[0], part.size)[0]
            total[rows] = part.reshape((-1, shape[1]))
        sums.append(total)
    return sums, np.concatenate(worker), np.concatenate(server)


def server_residual(kv, key):
    """The one-process transport's 'servers'' residual of ``key``, chunks in order."""
    parts = sorted((chunk, res.asnumpy()) for (k, chunk, _), res in
                   kv._transport._server_residuals.items() if k == key)
    return np.concatenate([p for _, p in parts]) if parts else None


@pytest.mark.parametrize('method', ['oneway', 'rankdad'])
def test_error_feedback_matches_reference(method):
    """Four steps of a Trainer with error_feedback=1: every dAD sum equals the
    reference's, which carries each chunk's residual from step to step (and, rankdad,
    the servers'); the residuals the store keeps equal the reference's; the residual
    changes every step and is used (the sums differ from rank-dAD without it); nothing
    is lost: pulled sums plus the residuals equal the sum of the gradients."""
    steps = 4
    history, kv, net = trainer_run({'method': method, 'rank': 3, 'error_feedback': 1,
                                    'size_threshold': 0, 'chunk_size': EF_CHUNK},
                                   steps=steps)
    dense = dense_names(net)
    plan = kv.codec_plan()
    assert sum(p == '%s rank 3 of 64 x 144, error feedback' % method
               for p in plan.values()) == 1, plan
    keys = {layer.block.weight.name: key for key, layer in kv.scheme._bound.items()}
    for name in dense:
        key = keys[name]
        steps_rows = [record[name][2] for record in history]
        shape = history[0][name][0].shape
        sums, worker, server = rank_dad_reference(method, steps_rows, shape)
        plain, _, _ = rank_dad_reference(method, steps_rows, shape, feedback=False)
        for step, record in enumerate(history):
            got = record[name][1]
            close(got, sums[step], 1e-4)
            if step:                       # the residual is used: not rank-dAD's sum
                assert np.abs(sums[step] - plain[step]).max() > 1e-2 * np.abs(plain[step]).max()
        assert len(kv.plan(key).chunks) == (3 if shape[0] == 64 else 1)
        held = kv.key_state(key).residual
        close(held, worker, 1e-4)
        assert np.abs(worker).max() > 0.1 * np.abs(sums[-1]).max()
        kept = held.astype(np.float64)
        if method == 'rankdad':         # one worker: the servers' rank-3 factors of a
            # rank-3 sum leave rounding only (the 2- and 4-worker jobs leave more)
            err = np.abs(server_residual(kv, key).reshape(shape) - server).max()
            assert err <= 1e-4 * np.abs(sums[-1]).max()
            kept = kept + server_residual(kv, key).reshape(shape)
        else:
            assert server_residual(kv, key) is None
        pulled = sum(record[name][1].astype(np.float64) for record in history)
        gradients = sum(ref.dad_gradient(*rows) for rows in steps_rows)
        close(pulled + kept, gradients, 1e-5)


def test_error_feedback_residual_changes_each_step():
    """The worker's residual after each step equals the reference's, and moves."""
    kv, net, layer = _one_layer_store({'method': 'oneway', 'rank': 2, 'error_feedback': 1})
    rng = np.random.default_rng(8)
    residual = np.zeros((40, 60), f32)
    for step in range(3):
        run_net(net, [rng.standard_normal((5, 60)).astype(f32)], [mx.cpu()])
        mx.nd.waitall()                            # the capture has run
        rows = layer.peek()
        kv.pushpull(0, net.weight.grad())
        u, v, new = ref.rank_dad_ef(*rows, residual, 2, 1, tol=1e-3)
        got = kv.key_state(0).residual
        close(got, new, 1e-5)
        assert np.abs(new - residual).max() > 0.1 * np.abs(new).max()
        residual = new


def _ef_store_run(kv, net, xs):
    outs = []
    for x in xs:
        run_net(net, [x], [mx.cpu()])
        kv.pushpull(0, net.weight.grad())
        outs.append(net.weight.grad().asnumpy())
    return outs


@pytest.mark.parametrize('method', ['oneway', 'rankdad'])
def test_error_feedback_checkpoint(tmp_path, method):
    """The residuals (the worker's and, rankdad, the servers') are saved and restored:
    a resumed store continues bit for bit; one that starts afresh does not."""
    params = {'method': method, 'rank': 2, 'error_feedback': 1, 'chunk_size': 1024}
    kv, net, _ = _one_layer_store(params)
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((5, 60)).astype(f32) for _ in range(4)]
    _ef_store_run(kv, net, xs[:2])
    path = str(tmp_path / 'ef.kvx')
    kv.save_compression_state(path)
    resumed = mx.kv.create('dist_sync_dad')
    resumed.load_compression_state(path)
    fresh = mx.kv.create('dist_sync_dad')
    fresh.set_gradient_compression(dict({'size_threshold': 0}, **params))
    a = _ef_store_run(kv, net, xs[2:])
    b = _ef_store_run(resumed, net, xs[2:])
    c = _ef_store_run(fresh, net, xs[2:])
    assert len(kv.plan(0).chunks) == 3
    for x, y, z in zip(a, b, c):
        assert np.array_equal(x, y)
        assert not np.allclose(x, z, rtol=1e-3, atol=1e-6)
    assert np.array_equal(kv.key_state(0).residual, resumed.key_state(0).residual)
    if method == 'rankdad':
        assert np.array_equal(server_residual(kv, 0), server_residual(resumed, 0))


@pytest.mark.parametrize('method, chunk_size, void_at', [
    ('oneway', 1 << 20, 2), ('oneway', 1 << 20, 0),     # one chunk: the codec finds it;
    ('rankdad', 1024, 2), ('rankdad', 1024, 0)])        # at step 0 and with chunks: the store
def test_error_feedback_void_step(method, chunk_size, void_at):
    """A NaN in the input (gradient and rows) voids the step: the sum is NaN, the
    worker's and the servers' residuals stay as they were, the voided step's rows are
    dropped, and the steps after continue as the reference without the voided step.
    A void result (another worker's NaN) leaves the worker's residual as it was too
    (oneway only: the one-process VoidingTransport voids the result after its
    'servers' re-encoded the sum, so their residual moves, which real servers, seeing
    a void slot, do not: server.py's _reencode)."""
    from test_scheme_contract import VoidingTransport
    kv, net, layer = _one_layer_store({'method': method, 'rank': 2, 'error_feedback': 1,
                                       'chunk_size': chunk_size})
    kv._transport = VoidingTransport(kv._transport)
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((5, 60)).astype(f32) for _ in range(5)]
    xs[void_at] = xs[void_at].copy()
    xs[void_at][2, 7] = np.nan
    counted, outs, residuals = [], [], []
    for step, x in enumerate(xs):
        kv._transport.voiding = step == 3 and method == 'oneway'   # another worker's NaN
        run_net(net, [x], [mx.cpu()])
        mx.nd.waitall()                            # the capture has run
        rows = layer.peek()
        kv.pushpull(0, net.weight.grad())
        outs.append(net.weight.grad().asnumpy())
        residuals.append((kv.key_state(0).residual, server_residual(kv, 0)))
        if step == void_at or kv._transport.voiding:
            assert np.isnan(outs[-1]).all()
            if step:
                assert np.array_equal(residuals[-1][0], residuals[-2][0])
                if method == 'rankdad':
                    assert np.array_equal(residuals[-1][1], residuals[-2][1])
            else:
                assert not residuals[-1][0].any()
        else:
            counted.append((step, rows))
        assert layer.take() is None                # no rows left for the next step
    assert np.isfinite(residuals[-1][0]).all()
    sums, worker, server = rank_dad_reference(method, [r for _, r in counted], (40, 60),
                                              rank=2, tol=1e-3, chunk_size=chunk_size)
    for (step, _), want in zip(counted, sums):
        close(outs[step], want, 1e-4)
    close(residuals[-1][0], worker, 1e-4)
    if method == 'rankdad':
        err = np.abs(residuals[-1][1].reshape(40, 60) - server).max()
        assert err <= 1e-4 * np.abs(sums[-1]).max()
