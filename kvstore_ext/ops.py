"""Access to the plugin's MXNet operators (``kvx_*``), loaded on first use.

Looked up in ``mxnet.ndarray.op`` rather than ``mx.nd`` because server processes
run with ``mxnet`` only partly imported.
"""
from . import _lib


def op(name):
    _lib.load()
    from mxnet.ndarray import op as nd_op
    return getattr(nd_op, name)


def shape_attr(shape):
    """MXNet's spelling of a shape attribute, e.g. '(64, 32, 5, 5)'."""
    return '(' + ', '.join(str(int(d)) for d in shape) + (',)' if len(shape) == 1 else ')')
