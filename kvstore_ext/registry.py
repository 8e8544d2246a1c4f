"""Schemes become kvstore types: ``register_scheme(S)`` makes ``dist_sync_<S.name>``.

MXNet's registry names a kvstore by its class name, lower-cased, so each scheme gets a
small subclass of CompressedKVStore with that name. The name contains 'dist' because
Gluon's Trainer ignores a non-dist kvstore on a single device.
"""
from mxnet.kvstore import KVStoreBase

from .store import CompressedKVStore

SCHEMES = {}


def register_scheme(scheme_class):
    """Register ``scheme_class`` and return the kvstore class made for it."""
    name = 'dist_sync_' + scheme_class.name
    store_class = type(name, (CompressedKVStore,), {
        'scheme_class': scheme_class,
        '__doc__': 'kvstore %r: %s' % (name, (scheme_class.__doc__ or '').strip().split('\n')[0]),
        '__module__': __name__,
    })
    KVStoreBase.register(store_class)
    SCHEMES[scheme_class.name] = scheme_class
    return store_class


def kvstore_types():
    return sorted('dist_sync_' + name for name in SCHEMES)
