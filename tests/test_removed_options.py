"""Options measured not to work are removed (params.Removed): passing one raises one
ValueError that names it, says why it went and what to use; a state file written with
one is refused on load with that message; the former defaults, which every state file
recorded, still load."""
import json

import mxnet as mx
import numpy as np
import pytest

import kvstore_ext  # noqa: F401  (registers the kvstore types)
from kvstore_ext import params as P
from kvstore_ext.schemes import DAD, Hylo, LGreCoHylo

# (parameter, value, words of its reason, words of its replacement)
REMOVED = [
    ('fc_value', 't', "MXNet's 2-bit rule", 'drop fc_value'),
    ('fc_value', 'mean', 'lost 3.7 points', 'drop fc_value'),
    ('conv_warmup_steps', 16, 'hylo_conv_warmup_8w.json', 'warmup_steps'),
    ('agreement', 'round', 'round trip a step', "agreement='auto'"),
    ('compress_layers', 'fc', 'diagnostic', 'dist_sync_none'),
    ('compress_layers', 'conv', 'diagnostic', 'dist_sync_none'),
    ('momentum_masking', 'on', 'constant learning rate', "momentum_masking='lr'"),
]


@pytest.mark.parametrize('name, value, why, instead', REMOVED)
def test_passing_a_removed_option_raises_the_reason_and_the_replacement(name, value, why,
                                                                       instead):
    for make in (lambda **p: Hylo(**p), lambda **p: LGreCoHylo(**p),
                 lambda **p: DAD(**{'fallback.' + k: v for k, v in p.items()})):
        with pytest.raises(ValueError) as raised:
            make(**{name: value})
        text = str(raised.value)
        assert '%s=%r was removed' % (name, value) in text, text
        assert why in text and 'use instead: ' in text and instead in text, text


def test_the_store_refuses_one_with_the_reason():
    kv = mx.kv.create('dist_sync_hylo')
    with pytest.raises(ValueError, match=r"hylo: fc_value='t' was removed: .*use instead"):
        kv.set_gradient_compression({'fc_value': 't'})


def test_former_defaults_are_accepted_and_dropped():
    """What every state file recorded: fc_value 'round', conv_warmup_steps 0,
    compress_layers 'all'. They meant what always holds now."""
    scheme = Hylo(fc_value='round', conv_warmup_steps=0, compress_layers='all')
    assert not {'fc_value', 'conv_warmup_steps', 'compress_layers'} & set(scheme.params)
    assert scheme.params == Hylo().params


def test_removed_names_are_no_longer_declared():
    spec = Hylo().param_specs()
    assert not {'fc_value', 'conv_warmup_steps', 'compress_layers'} & set(spec)
    assert spec['agreement'].choices == ('auto', 'previous', 'conv_round')
    assert spec['momentum_masking'].choices == ('lr', 'off')


def _state_file(tmp_path, params):
    """A state file of a Hylo store, its recorded parameters replaced by ``params``
    (what an older version wrote)."""
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'size_threshold': 1})
    kv.pushpull('w', mx.nd.array(np.arange(40, dtype=np.float32).reshape(8, 5)))
    path = str(tmp_path / 'state.kvx')
    kv.save_compression_state(path)
    arrays = mx.nd.load(path)
    meta = json.loads(arrays['__meta__'].asnumpy().tobytes().decode('utf-8'))
    meta['params'].update(params)
    arrays['__meta__'] = mx.nd.array(np.frombuffer(json.dumps(meta).encode('utf-8'),
                                                   np.uint8), dtype=np.uint8)
    mx.nd.save(path, arrays)
    return path


def test_a_state_file_with_a_removed_option_is_refused_with_the_reason(tmp_path):
    path = _state_file(tmp_path, {'conv_warmup_steps': 16})
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'size_threshold': 1})
    with pytest.raises(ValueError, match=r"state.kvx.*conv_warmup_steps=16 was removed: "
                                         r".*use instead"):
        kv.load_compression_state(path)


def test_a_state_file_with_the_former_defaults_loads(tmp_path):
    path = _state_file(tmp_path, {'fc_value': 'round', 'conv_warmup_steps': 0,
                                  'compress_layers': 'all', 'momentum_masking': 'lr'})
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'size_threshold': 1})
    kv.load_compression_state(path)
    assert 'fc_value' not in kv.scheme.params


def test_validate_removed_generic():
    """The mechanism, on a spec of its own: a removed value of a live parameter and a
    removed parameter, with and without its former default."""
    spec = {'mode': P.Param('str', 'a', 'doc', choices=('a',),
                            removed={'b': P.Removed('b lost', "mode='a'")})}
    gone = {'old': P.Removed('old lost', 'nothing', former_default=0)}
    assert P.validate(spec, {'old': 0}, 'x', gone) == {'mode': 'a'}
    with pytest.raises(ValueError, match=r"x: mode='b' was removed: b lost; use instead: "
                                         r"mode='a'"):
        P.validate(spec, {'mode': 'b'}, 'x', gone)
    with pytest.raises(ValueError, match=r"x: old=3 was removed: old lost; use instead: "
                                         r"nothing"):
        P.validate(spec, {'old': 3}, 'x', gone)
    with pytest.raises(ValueError, match='unknown compression parameter'):
        P.validate(spec, {'new': 3}, 'x', gone)
