"""One size rule for every scheme with a ``size_threshold`` (``Scheme.exempt``): a
tensor that is not float32, or has fewer elements than the threshold, goes
uncompressed, whatever the scheme."""
from types import SimpleNamespace

import numpy as np
import pytest

import kvstore_ext
from kvstore_ext.schemes.base import Scheme

THRESHOLD = 64 * 48
WITH_THRESHOLD = sorted(name for name, cls in kvstore_ext.SCHEMES.items()
                        if 'size_threshold' in cls.PARAMS)


def create(name, **params):
    if name == 'dad':       # a fixed capacity: no capture needed to plan a layer
        params['capacity'] = 4
    return kvstore_ext.SCHEMES[name](**params)


def compressed(scheme, shape, dtype):
    """True if ``scheme`` compresses a tensor of ``shape`` and ``dtype`` (dAD: as a
    Dense layer's weight whose rows are the layer's units)."""
    if scheme.name == 'dad':
        layer = SimpleNamespace(units=shape[0])
        return scheme.dad_codec(layer, shape, dtype) is not None
    return not scheme.codec_for_key(str(shape), shape, dtype, step=100).passthrough


def test_the_schemes_that_compress_by_size_all_have_the_rule():
    assert {'hylo', 'topk', 'adacomp', 'thc', 'fp16', 'powersgd', 'dad',
            'lgreco', 'lgreco_hylo'} <= set(WITH_THRESHOLD)


@pytest.mark.parametrize('name', WITH_THRESHOLD)
def test_the_rule_at_the_threshold(name):
    scheme = create(name, size_threshold=THRESHOLD)
    assert not scheme.exempt((64, 48), np.float32)            # exactly the threshold
    assert not scheme.exempt((THRESHOLD,), 'float32')
    assert scheme.exempt((64, 47), np.float32)                # one row fewer
    for dtype in (np.float16, np.float64):
        assert scheme.exempt((64, 480), dtype)
    for shape, dtype in [((64, 47), np.float32), ((64, 480), np.float64), ((5,), np.float32)]:
        assert not compressed(scheme, shape, dtype), (shape, dtype)


@pytest.mark.parametrize('name', WITH_THRESHOLD)
def test_every_scheme_asks_the_one_rule(name, monkeypatch):
    """Tensors the scheme compresses go uncompressed once the shared rule says so: no
    scheme keeps a size check of its own."""
    shapes = [(64, 64, 3, 3), (256, 300)]
    scheme = create(name, size_threshold=1)
    assert any(compressed(scheme, shape, np.float32) for shape in shapes)
    monkeypatch.setattr(Scheme, 'exempt', lambda self, shape, dtype: True)
    scheme = create(name, size_threshold=1)
    for shape in shapes:
        assert not compressed(scheme, shape, np.float32), shape
