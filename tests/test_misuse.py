"""Misuse of the API in one process (rank 0 of 1): every case gets one clear error
that names what is wrong, or is answered as MXNet answers it.

kvstore type names (kvstore_ext/names.py), list forms of the calls (calls.py),
parameters (params.py), float64 keys, zero-size and row_sparse arrays (sparse.py),
compression_params of the wrong type, and malformed state files (state_file.py).
The same under the launcher: tests/test_dist_misuse.py."""
import json

import numpy as np
import pytest
import mxnet as mx

import kvstore_ext
from kvstore_ext.schemes.base import COMMON_PARAMS

CTXS = [mx.cpu(0), mx.cpu(1)]


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def hylo(**params):
    kv = mx.kv.create('dist_sync_hylo')
    if params:
        kv.set_gradient_compression(params)
    return kv


def one_step(trainer, net, x):
    with mx.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(1)


# -- kvstore type names -------------------------------------------------------------

@pytest.mark.parametrize('name, closest', [('dist_sync_hyloo', 'dist_sync_hylo'),
                                           ('DIST_SYNC_HYL0', 'dist_sync_hylo'),
                                           ('dist_synch', 'dist_sync'),
                                           ('dist_sync_hylo ', 'dist_sync_hylo')])
def test_mistyped_dist_type_raises_with_the_closest_names(name, closest):
    """MXNet would make a plain dist store of any name containing 'dist'."""
    with pytest.raises(ValueError, match="unknown kvstore type %r .*did you mean '%s'"
                       % (name, closest)):
        mx.kv.create(name)


def test_gluon_trainer_with_a_mistyped_type_raises():
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                               kvstore='dist_sync_hyloo')
    with pytest.raises(ValueError, match="did you mean 'dist_sync_hylo'"):
        one_step(trainer, net, mx.nd.ones((2, 4)))


def test_other_names_reach_mxnet_as_before(monkeypatch):
    """MXNet's own non-dist names (and its typo fallback to 'local'), names of any
    registered store, and kvstore_ext's in any case are created as before."""
    for name in ('local', 'device', 'Local', 'locl'):
        assert isinstance(mx.kv.create(name), mx.kv.KVStore)
    assert mx.kv.create('Dist_Sync_Hylo').type == 'dist_sync_hylo'

    class MyDistStore(mx.kv.KVStoreBase):
        pass
    # what KVStoreBase.register does, undone after the test (the registry is global)
    monkeypatch.setitem(mx.kv.KVStoreBase.kv_registry, 'mydiststore', MyDistStore)
    assert type(mx.kv.create('mydiststore')).__name__ == 'MyDistStore'


# -- list forms of pushpull and broadcast --------------------------------------------

@pytest.mark.parametrize('name, params, shape', [
    ('dist_sync_none', {}, (6,)),
    ('dist_sync_hylo', {}, (6,)),                                     # uncompressed
    ('dist_sync_hylo', {'size_threshold': 1, 'aggregation': 'server'}, (40, 30)),
    ('dist_sync_2bit', {}, (40, 30)),
])
def test_repeated_key_in_pushpull_is_one_round_of_the_sum(name, params, shape):
    """MXNet (local and dist_sync) groups a call's values by key: one round of
    sum(a + b), written into both outs. Held to MXNet's local store for the exact
    sums and to a twin store given both values as devices for compressed ones."""
    a, b, c = rand(shape, 1), rand(shape, 2), rand(shape, 3)
    kv = mx.kv.create(name)
    kv.set_gradient_compression(params)
    twin = mx.kv.create(name)
    twin.set_gradient_compression(params)
    outs = [mx.nd.zeros(shape) for _ in range(3)]
    kv.pushpull(['w', 'v', 'w'], [mx.nd.array(a), mx.nd.array(c), mx.nd.array(b)], out=outs)
    expect = mx.nd.zeros(shape)
    twin.pushpull('w', [mx.nd.array(a), mx.nd.array(b)], out=expect)
    assert np.array_equal(outs[0].asnumpy(), expect.asnumpy())
    assert np.array_equal(outs[2].asnumpy(), expect.asnumpy())
    assert kv.comm_stats()['steps'] == 1
    if name == 'dist_sync_none' or shape == (6,):
        local = mx.kv.create('local')
        local.init('w', mx.nd.zeros(shape))
        louts = [mx.nd.zeros(shape), mx.nd.zeros(shape)]
        local.pushpull(['w', 'w'], [mx.nd.array(a), mx.nd.array(b)], out=louts)
        for o, lo in zip((outs[0], outs[2]), louts):
            np.testing.assert_allclose(o.asnumpy(), lo.asnumpy(), rtol=1e-6)


def test_repeated_key_in_place():
    kv = mx.kv.create('dist_sync_none')
    a, b = mx.nd.array(rand((5,), 1)), mx.nd.array(rand((5,), 2))
    expect = a.asnumpy() + b.asnumpy()
    kv.pushpull([3, 3], [a, b])
    for v in (a, b):
        np.testing.assert_allclose(v.asnumpy(), expect, rtol=1e-6)


def test_lists_of_different_lengths_are_refused():
    kv = mx.kv.create('dist_sync_none')
    one, two = [mx.nd.ones((2,))], [mx.nd.ones((2,)), mx.nd.ones((2,))]
    with pytest.raises(ValueError, match='pushpull: 2 keys but 1 values'):
        kv.pushpull([0, 1], one, out=two)
    with pytest.raises(ValueError, match='pushpull: 2 keys but 1 outs'):
        kv.pushpull([0, 1], two, out=one)
    with pytest.raises(ValueError, match='pushpull: 1 keys but 2 values'):
        kv.pushpull([0], two)
    with pytest.raises(ValueError, match='broadcast: 2 keys but 1 outs'):
        kv.broadcast([0, 1], two, out=one)
    assert kv.comm_stats()['steps'] == 0


# -- parameters ----------------------------------------------------------------------

def _float_params():
    for name, scheme in sorted(kvstore_ext.SCHEMES.items()):
        for pname, p in sorted(dict(COMMON_PARAMS, **scheme.PARAMS).items()):
            if p.kind in ('float', 'int'):
                yield name, pname


@pytest.mark.parametrize('scheme, param', list(_float_params()))
def test_non_finite_numbers_are_refused_when_set(scheme, param):
    """Every scheme's numeric parameters: NaN and infinities are refused at
    set_gradient_compression, not at the first pushpull (or never)."""
    kv = mx.kv.create('dist_sync_' + scheme)
    for bad, message in ((float('inf'), 'must be finite'), (float('-inf'), 'must be finite'),
                         (float('nan'), 'must not be NaN')):
        with pytest.raises(ValueError, match='%s %s' % (param, message)):
            kv.set_gradient_compression({param: bad})


@pytest.mark.parametrize('value', [0.0, -1.0, 1e-30, 0.009])
def test_fc_scale_below_its_smallest_sensible_value_is_refused(value):
    with pytest.raises(ValueError, match='fc_scale must be >= 0.01'):
        hylo(fc_scale=value)
    assert hylo(fc_scale=0.01).scheme.params['fc_scale'] == 0.01


# -- float64 and float16 keys ----------------------------------------------------------

@pytest.mark.parametrize('params', [{}, {'size_threshold': 1}])
@pytest.mark.parametrize('dtype', ['float64', 'float16'])
def test_float64_and_float16_keep_their_precision(dtype, params):
    """Such keys travel uncompressed in their own dtype: summed here as MXNet's local
    store sums them (float64 exactly: no rounding through float32)."""
    values = np.array([1e15 + 1, 1 + 2 ** -40, -3.0, 0.1], dtype=dtype)
    other = np.array([1.0, 2 ** -40, 1e-8, 0.2], dtype=dtype)
    kv = hylo(**params)
    local = mx.kv.create('local')
    local.init('x', mx.nd.zeros((4,), dtype=dtype))
    ours = [mx.nd.array(values, dtype=dtype, ctx=c) for c in CTXS]
    theirs = [mx.nd.array(values, dtype=dtype, ctx=CTXS[0]),
              mx.nd.array(other, dtype=dtype, ctx=CTXS[1])]
    ours[1] = mx.nd.array(other, dtype=dtype, ctx=CTXS[1])
    kv.pushpull('x', ours)
    local.pushpull('x', theirs)
    for o, t in zip(ours, theirs):
        assert o.dtype == np.dtype(dtype)
        assert np.array_equal(o.asnumpy(), t.asnumpy())
    if dtype == 'float64':
        assert ours[0].asnumpy()[0] == 1e15 + 2


# -- zero-size and row_sparse arrays, compression_params of the wrong type -------------

def test_zero_size_arrays_are_refused_naming_the_key():
    empty = mx.nd.array(np.zeros((0, 3), np.float32))
    for call in (lambda kv: kv.pushpull('e', empty),
                 lambda kv: kv.init('e', empty),
                 lambda kv: kv.broadcast('e', empty, out=empty)):
        for name in ('dist_sync_hylo', 'dist_sync_thc'):
            kv = mx.kv.create(name)
            kv.set_gradient_compression({'size_threshold': 0})
            with pytest.raises(ValueError, match=r"key 'e': zero-size array \(shape \(0, 3\)\)"):
                call(kv)


def _row_sparse(shape=(4, 3)):
    return mx.nd.sparse.row_sparse_array(
        (mx.nd.ones((2, shape[1])), mx.nd.array([0, 2], dtype='int64')), shape=shape)


def test_module_style_row_sparse_push_is_refused_naming_the_key_and_the_way_out():
    kv = mx.kv.create('dist_sync_hylo')
    kv.init('embed_weight', mx.nd.zeros((4, 3)))
    with pytest.raises(TypeError, match="key 'embed_weight': row_sparse arrays .*"
                                        r"sparse_grad=False.*kvstore='dist_sync'"):
        kv.push('embed_weight', _row_sparse())
    with pytest.raises(TypeError, match="key 'embed_weight': row_sparse"):
        kv.pushpull('embed_weight', [mx.nd.zeros((4, 3)), _row_sparse()])
    with pytest.raises(TypeError, match="key 'embed_weight': row_sparse"):
        kv.pushpull('embed_weight', mx.nd.zeros((4, 3)), out=_row_sparse())
    with pytest.raises(TypeError, match="key 'other': row_sparse"):
        kv.pushpull('other', _row_sparse())
    assert kv.comm_stats()['steps'] == 0


def test_gluon_sparse_grad_embedding_is_refused_naming_the_parameter():
    net = mx.gluon.nn.Embedding(10, 4, sparse_grad=True)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                               kvstore='dist_sync_hylo')
    with pytest.raises(TypeError, match=r"Gluon parameter key '.*weight': row_sparse .*"
                                        r"sparse_grad=False"):
        one_step(trainer, net, mx.nd.array([1, 2, 3]))
    dense = mx.gluon.nn.Embedding(10, 4)            # the way out: compressed as usual
    dense.initialize()
    trainer = mx.gluon.Trainer(dense.collect_params(), 'sgd', {'learning_rate': 0.1},
                               kvstore='dist_sync_hylo')
    one_step(trainer, dense, mx.nd.array([1, 2, 3]))
    assert trainer._kvstore.comm_stats()['steps'] == 1


def test_compression_params_as_a_json_string_are_refused():
    """MXNet's kvstores take a dict; a string is refused with the fix, not parsed."""
    with pytest.raises(TypeError, match=r'compression_params must be a dict.*json\.loads'):
        mx.kv.create('dist_sync_hylo').set_gradient_compression('{"size_threshold": 5}')
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                               kvstore='dist_sync_hylo',
                               compression_params=json.dumps({'size_threshold': 5}))
    with pytest.raises(TypeError, match='compression_params must be a dict'):
        one_step(trainer, net, mx.nd.ones((2, 4)))


# -- state files ---------------------------------------------------------------------

def saved_state(tmp_path):
    """A store after two steps and the path of its saved state."""
    kv = hylo(size_threshold=1, conv_rate=0.2)
    for s in range(2):
        kv.pushpull('fc', mx.nd.array(rand((60, 20), s)))
        kv.pushpull(3, mx.nd.array(rand((24, 8, 3, 3), s)))
    path = str(tmp_path / 'state.kvx')
    kv.save_compression_state(path)
    return kv, path


def rewrite(path, edit):
    arrays = mx.nd.load(path)
    edited = edit(arrays)
    mx.nd.save(path, edited if isinstance(edited, list) else arrays)


def meta_bytes(text):
    return mx.nd.array(np.frombuffer(text.encode(), np.uint8), dtype=np.uint8)


def with_meta(arrays, **changes):
    meta = json.loads(arrays['__meta__'].asnumpy().tobytes().decode())
    meta.update(changes)
    for name in [k for k, v in changes.items() if v is None]:
        del meta[name]
    arrays['__meta__'] = meta_bytes(json.dumps(meta))


def nan_residual(arrays):
    res = arrays['residual@s:fc'].asnumpy()
    res[3, 4] = np.nan
    arrays['residual@s:fc'] = mx.nd.array(res)


CORRUPTIONS = {
    'list': (lambda a: list(a.values()), r'unnamed list of \d+ arrays'),
    'no meta': (lambda a: a.pop('__meta__') is None, "no '__meta__' entry"),
    'bad json': (lambda a: a.update(__meta__=meta_bytes('{"type": "dist_sync_hylo",')),
                 "'__meta__' is not valid JSON"),
    'json list': (lambda a: a.update(__meta__=meta_bytes('[1, 2]')), 'not a JSON object'),
    'meta of floats': (lambda a: a.update(__meta__=mx.nd.ones((3,))),
                       "'__meta__' is not a byte string"),
    'no params': (lambda a: with_meta(a, params=None), "field 'params' is missing"),
    'rank as text': (lambda a: with_meta(a, rank='0'), "field 'rank' is '0', not an integer"),
    'bad stats': (lambda a: with_meta(a, stats={'raw_bytes': -1}), "field 'stats' needs"),
    'bad key': (lambda a: a.update({'residual@x:fc': a.pop('residual@s:fc')}),
                "array 'residual@x:fc' names key 'x:fc'"),
    'bad param': (lambda a: with_meta(a, params={'size_threshold': 1, 'fc_scale': -1.0}),
                  'parameters or scheme state do not fit hylo: .*fc_scale must be'),
    'nan residual': (nan_residual, "state 'residual' of key 'fc' holds non-finite values"),
}


@pytest.mark.parametrize('kind', sorted(CORRUPTIONS))
def test_malformed_state_file_is_refused_and_nothing_is_loaded(tmp_path, kind):
    kv, path = saved_state(tmp_path)
    edit, message = CORRUPTIONS[kind]
    rewrite(path, edit)
    fresh = hylo(size_threshold=7)
    with pytest.raises(ValueError, match=r"compression state file '%s': .*%s" % (path, message)):
        fresh.load_compression_state(path)
    assert fresh.scheme.params['size_threshold'] == 7
    assert fresh.comm_stats()['steps'] == 0 and not fresh._restored


def test_garbage_after_the_magic_bytes_is_refused(tmp_path):
    """A file cut short, or with the right magic number and garbage after it: MXNet's
    loader fails deep in C++ (vector::_M_default_append); one ValueError instead."""
    _, path = saved_state(tmp_path)
    data = open(path, 'rb').read()
    for name, body in (('garbage', data[:16] + b'\xff' * 64), ('cut', data[:len(data) // 2])):
        bad = str(tmp_path / name)
        with open(bad, 'wb') as f:
            f.write(body)
        with pytest.raises(ValueError, match=r"compression state file '%s': MXNet cannot read "
                                             r"it" % bad):
            hylo().load_compression_state(bad)


def test_a_state_file_still_round_trips(tmp_path):
    kv, path = saved_state(tmp_path)
    resumed = mx.kv.create('dist_sync_hylo')
    resumed.load_compression_state(path)
    assert resumed.scheme.params == kv.scheme.params
    a, b = mx.nd.array(rand((60, 20), 9)), mx.nd.array(rand((60, 20), 9))
    kv.pushpull('fc', a)
    resumed.pushpull('fc', b)
    assert np.array_equal(a.asnumpy(), b.asnumpy())
