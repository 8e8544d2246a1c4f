"""Access to the plugin's MXNet operators (``kvx_*``), loaded on first use.

Kept in ``_lib.OPS`` (not looked up in ``mx.nd``, which server processes, running
with ``mxnet`` only partly imported, may not have bound yet).
"""
from . import _lib


def op(name):
    if _lib.OPS:
        return _lib.OPS[name]
    if _lib._missing is not None:
        raise _lib._missing
    _lib.load()
    return _lib.OPS[name]


def shape_attr(shape):
    """MXNet's spelling of a shape attribute, e.g. '(64, 32, 5, 5)'."""
    return '(' + ', '.join(str(int(d)) for d in shape) + (',)' if len(shape) == 1 else ')')


def nonfinite(array):
    """1.0 if ``array`` holds NaN or Inf, else 0.0: a 1-element array computed on the
    engine (``kvx_finite_check``), read by nobody until it is needed."""
    return op('kvx_finite_check')(array.reshape((-1,)))


_constants = {}


def constant(value):
    """A 1-element float32 array holding ``value``, made once: what engine ops pick
    by a status, e.g. ``where(status, constant(nan), constant(1))``, so that a codec
    decides on the engine without reading the status on the host."""
    key = repr(float(value))        # NaN is not equal to itself
    if key not in _constants:
        import numpy as np
        from mxnet import ndarray
        _constants[key] = ndarray.full((1,), value, dtype=np.float32)
    return _constants[key]


def host_array(values):
    """An NDArray over a float32, C-ordered copy of ``values`` (a NumPy array), made
    without the engine: ``ndarray.array`` first waits for write access, a no-op pushed
    into the engine's queue behind whatever runs there (a layer's backward, another
    key's encoder: milliseconds on a busy worker); ``from_numpy`` wraps the memory."""
    import numpy as np
    from mxnet import ndarray
    return ndarray.from_numpy(np.array(values, dtype=np.float32, order='C', copy=True),
                              zero_copy=True)
