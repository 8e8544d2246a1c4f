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
