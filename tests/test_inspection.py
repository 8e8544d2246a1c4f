"""``kv.plan(key)`` and ``kv.key_state(key)``: a key's plan and state, read-only, in
one process (rank 0 of 1), held to what the store sends and computes."""
import dataclasses

import numpy as np
import pytest
import mxnet as mx


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def store(name, **params):
    kv = mx.kv.create(name)
    if params:
        kv.set_gradient_compression(params)
    return kv


def test_plan_of_a_compressed_key_matches_what_a_step_sends():
    """The plan's bytes are what the store's own counters record for a step; its
    description is codec_plan's."""
    kv = store('dist_sync_topk', ratio=0.01)
    shape = (300, 200)
    kv.pushpull('fc', mx.nd.array(rand(shape, 1)))
    before = kv.comm_stats()
    kv.pushpull('fc', mx.nd.array(rand(shape, 2)))
    after = kv.comm_stats()
    plan = kv.plan('fc')
    assert (plan.key, plan.scheme, plan.shape, plan.dtype, plan.layer) == \
        ('fc', 'topk', shape, np.dtype(np.float32), 'dense')
    assert plan.compressed and plan.error_feedback
    assert plan.description == kv.codec_plan()['fc'] == plan.codec.describe()
    assert [c.codec for c in plan.chunks] == [plan.codec]
    assert plan.bytes_pushed == after['push_bytes'] - before['push_bytes']
    assert plan.bytes_pulled == after['pull_bytes'] - before['pull_bytes']
    assert plan.bytes_pushed < 4 * 300 * 200


@pytest.mark.parametrize('dtype', [np.float32, np.float64, np.float16])
def test_plan_of_an_uncompressed_key(dtype):
    kv = store('dist_sync_hylo')
    value = mx.nd.array(rand((7, 3), 1), dtype=dtype)
    before = kv.comm_stats()
    kv.pushpull(3, value)
    after = kv.comm_stats()
    plan = kv.plan(3)
    assert plan.dtype == np.dtype(dtype) and plan.layer == 'dense'
    assert not plan.compressed and not plan.error_feedback and plan.mode == 'plain'
    assert plan.bytes_pushed == after['push_bytes'] - before['push_bytes']
    assert plan.bytes_pulled == after['pull_bytes'] - before['pull_bytes']


def test_plan_of_chunks_and_layer_kinds():
    kv = store('dist_sync_hylo', size_threshold=1, chunk_size=1024)
    kv.pushpull('conv', mx.nd.array(rand((40, 3, 5, 5), 1)))
    kv.pushpull('bias', mx.nd.array(rand((40,), 2)))
    conv = kv.plan('conv')
    assert conv.layer == 'conv' and kv.plan('bias').layer == 'vector'
    assert len(conv.chunks) > 1
    assert conv.chunks[0].start == 0 and conv.chunks[-1].stop == 40
    assert all(a.stop == b.start for a, b in zip(conv.chunks, conv.chunks[1:]))
    assert conv.mode in ('checked', 'deferred')


def test_a_key_declared_but_not_stepped_has_no_plan_yet():
    kv = store('dist_sync_topk')
    kv.init('w', mx.nd.zeros((300, 200)))
    plan = kv.plan('w')
    assert plan.shape == (300, 200) and plan.codec is None and plan.chunks == ()
    state = kv.key_state('w')
    assert state.steps == 0 and state.residual is None and state.arrays == {}


@pytest.mark.parametrize('key', ['fc2_weight', 17, '1', True])
def test_unknown_key_raises_naming_it(key):
    kv = store('dist_sync_topk')
    kv.pushpull('fc', mx.nd.array(rand((300, 200), 1)))
    kv.pushpull(1, mx.nd.array(rand((3,), 1)))
    for call in (kv.plan, kv.key_state):
        with pytest.raises(KeyError, match=repr(key)):
            call(key)


def test_key_state_holds_the_residual_and_counts_steps():
    """One worker's top-k sends some entries of grad + residual: what it did not send
    is the residual, so out + residual == grad + the previous residual, exactly."""
    kv = store('dist_sync_topk', ratio=0.05)
    previous = np.zeros((300, 200), np.float32)
    for step in range(3):
        grad = rand((300, 200), step)
        out = mx.nd.zeros((300, 200))
        kv.pushpull('fc', mx.nd.array(grad), out=out)
        state = kv.key_state('fc')
        assert state.steps == step + 1
        assert np.array_equal(out.asnumpy() + state.residual, grad + previous)
        assert np.array_equal(state.arrays['residual'], state.residual)
        previous = state.residual


def test_key_state_holds_the_momentum_per_chunk():
    kv = store('dist_sync_topk', ratio=0.05, momentum=0.9, chunk_size=1024,
               size_threshold=1)
    kv.pushpull('fc', mx.nd.array(rand((60, 50), 1)))
    state = kv.key_state('fc')
    count = len(kv.plan('fc').chunks)
    assert count > 1 and len(state.chunks) == count == len(state.last)
    for i, arrays in enumerate(state.chunks):
        assert np.array_equal(arrays['velocity'], state.arrays['%d.velocity' % i])


def test_returned_arrays_are_copies():
    """Writing into what key_state returned changes nothing: the next step of the
    store equals a twin store's, whose state nobody touched."""
    kv, twin = (store('dist_sync_topk', ratio=0.05, momentum=0.9) for _ in range(2))
    for s in (kv, twin):
        s.pushpull('fc', mx.nd.array(rand((300, 200), 1)))
    state = kv.key_state('fc')
    state.residual[:] = 1e6
    for array in state.arrays.values():
        array[...] = 1e6
    for arrays in state.chunks:
        for array in arrays.values():
            array[...] = 1e6
    state.arrays.clear()
    again = kv.key_state('fc')
    assert np.abs(again.residual).max() < 1e6 and set(again.arrays) > {'residual'}
    outs = [mx.nd.zeros((300, 200)) for _ in range(2)]
    for s, out in zip((kv, twin), outs):
        s.pushpull('fc', mx.nd.array(rand((300, 200), 2)), out=out)
    assert np.array_equal(outs[0].asnumpy(), outs[1].asnumpy())
    assert np.array_equal(kv.key_state('fc').residual, twin.key_state('fc').residual)


def test_plan_and_state_are_read_only():
    kv = store('dist_sync_topk')
    kv.pushpull('fc', mx.nd.array(rand((300, 200), 1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        kv.plan('fc').codec = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        kv.key_state('fc').residual = None


def test_key_state_reads_a_deferred_step_first(caplog):
    """A server-mode key's NaN step is read when its state is inspected, as before a
    save: the residual is what the void step left (unchanged), and the warning is
    logged then, not at the next step."""
    kv = store('dist_sync_hylo', size_threshold=1, aggregation='server')
    kv.pushpull('w', mx.nd.array(rand((3000,), 1)))
    assert kv.plan('w').mode == 'deferred'
    held = kv.key_state('w').residual
    bad = rand((3000,), 2)
    bad[5] = np.nan
    kv.pushpull('w', mx.nd.array(bad))
    assert 'non-finite' not in caplog.text
    assert np.array_equal(kv.key_state('w').residual, held)
    assert "key 'w': non-finite gradient" in caplog.text
