"""The contract every registered scheme meets, tested over the registry: a scheme is
tested here by being registered (kvstore_ext.SCHEMES), with its default parameters.

In one process (rank 0 of 1), over several steps of layer-shaped gradients:
* every output has the tensor's shape and is finite;
* error feedback loses nothing: what came back plus what stays in the residuals equals
  the sum of the gradients (the memory is applied, not only kept);
* the byte counters agree with the codecs' own sizes (``Codec.wire_words``);
* the state survives a checkpoint: a resumed store continues bit for bit;
* a NaN voids the step (the sum is NaN) and leaves the residual as it was;
* a void result (another worker's NaN) leaves no NaN in the state: later steps are
  finite again.

Every scheme with a momentum parameter (DGC's momentum correction, codecs/momentum.py)
is also tested with it at 0.9, as the training scripts set it (``<type>:<name>=0.9``):
its velocity and delivered sum must survive a checkpoint and a NaN like the residual.
Its output is ``S - m S_prev``, not the sent sum, so the error-feedback identity is
not asked of it (tests/test_momentum_correction.py checks it against its spec).
"""
import numpy as np
import pytest
import mxnet as mx

import kvstore_ext
from kvstore_ext import chunking

SHAPES = {'conv': (64, 64, 3, 3), 'fc': (256, 300), 'bias': (64,), 'wide': (70000,)}
STEPS = 4


def grad(key, step):
    rng = np.random.default_rng([step, sorted(SHAPES).index(key)])
    return (rng.standard_normal(SHAPES[key]) * 0.01).astype(np.float32)


def residuals(kv):
    """Every residual of the store, worker side and (one process) server side."""
    held = {k: kv.key_state(k).residual for k in kv.codec_plan()}
    out = {k: res for k, res in held.items() if res is not None}
    for (key, _, _), res in getattr(kv._transport, '_server_residuals', {}).items():
        out[key] = out.get(key, 0) + res.asnumpy().reshape(SHAPES[key])
    return out


def run(kv, steps):
    outs = {k: [] for k in SHAPES}
    for step in steps:
        for key in SHAPES:
            value = mx.nd.array(grad(key, step))
            kv.pushpull(key, value)
            outs[key].append(value.asnumpy())
    return outs


def momentum_variants():
    """'<type>:<param>=0.9' for every momentum parameter of every scheme (with
    ',<prefix>momentum_correction=on' and ',<prefix>fc_momentum_correction=on' where the
    scheme, or dad's fallback, applies it by worker count: this store has one worker)."""
    out = []
    for scheme in sorted(kvstore_ext.SCHEMES):
        params = kvstore_ext.SCHEMES[scheme]().params
        for p in params:
            if p == 'momentum' or p.endswith('.momentum'):
                prefix = p[:-len('momentum')]
                forced = ''.join(',%s%s=on' % (prefix, q)
                                 for q in ('momentum_correction', 'fc_momentum_correction')
                                 if prefix + q in params)
                out.append('dist_sync_%s:%s=0.9%s' % (scheme, p, forced))
    return out


@pytest.fixture(params=['dist_sync_' + s for s in sorted(kvstore_ext.SCHEMES)]
                + momentum_variants())
def name(request):
    return request.param


def create(name):
    """The store of a fixture name, with the parameters it names (numbers, or words)."""
    kvstore, _, settings = name.partition(':')
    kv = mx.kv.create(kvstore)
    if kvstore == 'dist_sync_dad':
        # dAD refuses a run with no Dense layer attached; this one owns none of the keys,
        # so every key here takes the fallback (test_dad.py tests dAD's own keys)
        import kvstore_ext.dad
        kv.unrelated_dense = mx.gluon.nn.Dense(3, in_units=2)
        kvstore_ext.dad.attach(kv.unrelated_dense)
    if settings:
        params = dict(setting.split('=') for setting in settings.split(','))
        kv.set_gradient_compression({p: v if v.isalpha() else float(v)
                                     for p, v in params.items()})
    return kv


def test_outputs_and_error_feedback(name):
    kv = create(name)
    outs = run(kv, range(STEPS))
    kept = residuals(kv)
    for key, shape in SHAPES.items():
        assert all(o.shape == shape and np.isfinite(o).all() for o in outs[key])
        if ':' in name:         # a momentum correction returns S - m S_prev
            continue
        total = sum(grad(key, s) for s in range(STEPS))
        came_back = sum(outs[key])
        np.testing.assert_allclose(came_back + kept.get(key, 0), total, rtol=1e-4,
                                   atol=1e-4, err_msg='%s %s' % (name, key))


def test_bytes_match_the_codecs(name):
    kv = create(name)
    run(kv, range(2))
    pushed = pulled = first_round = 0
    for key in kv.codec_plan():
        for chunk in kv.plan(key).chunks:
            for _, kind, up, down in chunk.codec.wire_words(1):
                pushed, pulled = pushed + 4 * up, pulled + 4 * down
            if getattr(chunk.codec, 'carries', False):    # the first step agrees by a round
                first_round += 4 * chunk.codec.agreement_words
    stats = kv.comm_stats()
    assert stats['push_bytes'] == 2 * pushed + first_round
    assert stats['pull_bytes'] == 2 * pulled + first_round
    assert stats['raw_bytes'] == 2 * sum(4 * int(np.prod(s)) for s in SHAPES.values())


def test_state_survives_a_checkpoint(name, tmp_path):
    kv = create(name)
    run(kv, range(2))
    path = str(tmp_path / 'state.kvx')
    kv.save_compression_state(path)
    resumed = create(name)
    resumed.load_compression_state(path)
    assert resumed.comm_stats() == kv.comm_stats()
    a, b = run(kv, range(2, 4)), run(resumed, range(2, 4))
    for key in SHAPES:
        for x, y in zip(a[key], b[key]):
            assert np.array_equal(x, y), (name, key)


def test_nan_voids_the_step_and_keeps_the_residual(name):
    kv = create(name)
    run(kv, range(1))
    before = residuals(kv)
    for key in ('conv', 'fc', 'wide'):
        g = grad(key, 5)
        g.reshape(-1)[-1] = np.nan
        value = mx.nd.array(g)
        kv.pushpull(key, value)
        if kv.plan(key).codec.passthrough:   # float32 as it is: dist_sync's NaN + x
            assert np.isnan(value.asnumpy().reshape(-1)[-1])
        else:
            assert np.isnan(value.asnumpy()).all(), (name, key)
    after = residuals(kv)
    assert sorted(before) == sorted(after)
    for key in before:
        assert np.array_equal(before[key], after[key]), (name, key)


class VoidingTransport:
    """The local transport, except that while ``voiding`` every round's result is NaN:
    what a worker sees when another worker's gradient was non-finite."""

    def __init__(self, inner):
        self.inner, self.voiding = inner, False

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def exchange(self, key, requests):
        results, pushed, pulled = self.inner.exchange(key, requests)
        if self.voiding:
            results = [mx.nd.full(r.shape, np.nan, dtype=r.dtype) for r in results]
        return results, pushed, pulled


def test_a_void_result_spoils_no_state(name):
    """Another worker voided step 1: this worker's sum is NaN, and nothing it keeps
    (residual, agreed statistics, factors) may carry the NaN into steps 2 and 3."""
    kv = create(name)
    kv._transport = VoidingTransport(kv._transport)
    run(kv, range(1))
    kv._transport.voiding = True
    voided = run(kv, range(1, 2))
    kv._transport.voiding = False
    later = run(kv, range(2, 4))
    for key in SHAPES:
        if kv.plan(key).mode != 'plain':
            assert np.isnan(voided[key][0]).all(), (name, key)
        assert all(np.isfinite(o).all() for o in later[key]), (name, key)
    for key in kv.codec_plan():
        for state_name, array in kv.key_state(key).arrays.items():
            assert np.isfinite(array).all(), (name, key, state_name)


def test_chunks_cover_every_element(name):
    """Large tensors are cut so that every element belongs to exactly one chunk."""
    kvstore, _, setting = name.partition(':')
    extra = {setting.partition('=')[0]: 0.9} if setting else {}
    scheme = kvstore_ext.SCHEMES[kvstore[len('dist_sync_'):]](chunk_size=4096, **extra)
    for shape in SHAPES.values():
        codec = scheme.codec_for(shape, np.float32)
        marks = mx.nd.zeros(shape)
        for chunk in chunking.split(codec, 4096):
            view = chunk.view(marks)
            view += 1
        assert (marks.asnumpy() == 1).all()
