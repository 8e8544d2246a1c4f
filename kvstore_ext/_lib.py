"""Find and load the C++ plugin (libkvx_ops.so) into MXNet, once per process.

Why a search: the library is installed inside the package, but the package may be
imported from a source checkout (``python -m kvstore_ext.launch`` run from the repo
root), whose folder has no compiled library; then the installed build is used.

Server processes import this module while ``mxnet`` is only partly imported (the
server loop starts inside ``import mxnet``), so only submodules are imported here.
"""
import os
import sys

LIBRARY_NAME = 'libkvx_ops.so'
_loaded = None
_missing = None


def library_path():
    """Path of the plugin: $KVSTORE_EXT_LIBRARY, the package folder, or an installed copy."""
    override = os.environ.get('KVSTORE_EXT_LIBRARY')
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, LIBRARY_NAME)]
    candidates += [os.path.join(p, 'kvstore_ext', LIBRARY_NAME) for p in sys.path if p]
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise ImportError(
        'kvstore_ext: the C++ plugin %s was not found next to %s nor in any installed '
        'kvstore_ext on sys.path. Build and install the package first: `make install` '
        '(or `pip install --no-build-isolation .`).' % (LIBRARY_NAME, here))


OP_PREFIX = 'kvx_'
OPS = {}


def load():
    """Register the plugin's operators with MXNet (idempotent) and return its path.

    Why not ``mx.library.load``: after loading, it regenerates the Python functions of
    all ~2,000 MXNet operators (measured: seconds of CPU in every worker and server
    process). Only the plugin's ``kvx_*`` operators are made here, into ``OPS`` and
    ``mxnet.ndarray`` (so ``mx.nd.kvx_...`` works too).
    """
    global _loaded
    if _loaded is None:
        path = library_path()
        _register(path)
        _loaded = path
    return _loaded


def _register(path):
    """Load the lib_api library at ``path`` into MXNet and make its new ``kvx_*``
    operators (into ``OPS`` and ``mxnet.ndarray``)."""
    import ctypes
    from mxnet.base import _LIB, check_call, c_str, mx_uint, py_str
    from mxnet.ndarray.register import _make_ndarray_function
    check_call(_LIB.MXLoadLib(c_str(path), mx_uint(0)))
    names = ctypes.POINTER(ctypes.c_char_p)()
    count = ctypes.c_uint()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(count), ctypes.byref(names)))
    ndarray_module = sys.modules['mxnet.ndarray']
    for i in range(count.value):
        name = py_str(names[i])
        if name.startswith(OP_PREFIX) and name not in OPS:
            OPS[name] = _make_ndarray_function(_op_handle(name), name, name)
            setattr(ndarray_module, name, OPS[name])


_SYMBOL_OPS = {}


def symbol_op(name):
    """The ``mxnet.symbol`` function of plugin operator ``name``, made on first use (for
    an operator that runs inside hybridized graphs: ``kvx_dad_capture``)."""
    if name not in _SYMBOL_OPS:
        from mxnet.symbol.register import _make_symbol_function
        load()
        _SYMBOL_OPS[name] = _make_symbol_function(_op_handle(name), name, name)
    return _SYMBOL_OPS[name]


def _op_handle(name):
    """MXNet's handle of the registered operator ``name``."""
    import ctypes
    from mxnet.base import _LIB, check_call, c_str, OpHandle
    handle = OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    return handle


_capi = None


def capi():
    """The plugin's C interface (cpp/capi.h) through ctypes: the library MXNet loaded,
    so its state (dAD's captured rows) is the operators' own."""
    global _capi
    if _capi is None:
        import ctypes
        _capi = ctypes.CDLL(load())
    return _capi


TEST_LIBRARY_NAME = 'libkvx_test_ops.so'
_test_loaded = None


def load_test_ops():
    """Also register the operators only tests and benchmarks use (the per-codec
    decoders, THC's pieces, MXNet's 2-bit layout: ``cpp/ops_test*.cc``), from the test
    library installed next to the plugin; kvstore_ext itself never loads it. Returns
    its path."""
    global _test_loaded
    load()
    if _test_loaded is None:
        path = os.path.join(os.path.dirname(_loaded), TEST_LIBRARY_NAME)
        if not os.path.isfile(path):
            raise ImportError('kvstore_ext: the test library %s is not installed (CMake '
                              'option KVX_TEST_OPS, on by default: `make install`)' % path)
        _register(path)
        _test_loaded = path
    return _test_loaded


def try_load():
    """``load`` at import time; if the library is missing, remember why and let the
    import succeed (the launcher needs no plugin): the first operator use raises."""
    global _missing
    try:
        load()
    except ImportError as err:
        _missing = err
