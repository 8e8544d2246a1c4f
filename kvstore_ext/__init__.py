"""kvstore_ext: layer-aware gradient compression for MXNet's distributed KVStore.

``import kvstore_ext`` loads the C++ plugin's operators into MXNet and registers the
kvstore types ``dist_sync_<scheme>`` (see ``kvstore_types()``), usable as
``gluon.Trainer(..., kvstore='dist_sync_hylo', compression_params={...})`` and as
``Module.fit(..., kvstore=mx.kv.create('dist_sync_hylo'))``.
"""
from . import _lib, names, sparse
from .errors import NonFiniteGradientError, PayloadError
from .registry import register_scheme, kvstore_types, SCHEMES
from .store import CompressedKVStore as _CompressedKVStore
from .schemes import BUILTIN as _BUILTIN_SCHEMES

__version__ = '0.1.0'

_lib.try_load()
names.install()      # a mistyped dist_* type raises instead of training uncompressed
sparse.install(_CompressedKVStore)     # Gluon's Trainer names a sparse parameter and the way out
for _scheme in _BUILTIN_SCHEMES:
    register_scheme(_scheme)

__all__ = ['register_scheme', 'kvstore_types', 'SCHEMES', 'NonFiniteGradientError',
           'PayloadError']
