"""Kvstore type names: a mistyped distributed name raises instead of training plainly.

Why: ``mxnet.kvstore.create(name)`` looks ``name`` up in ``KVStoreBase.kv_registry``
(where kvstore_ext registers ``dist_sync_<scheme>``) and hands any other name to
MXNet's C library, whose ``KVStore::Create`` (src/kvstore/kvstore.cc) makes a
distributed store of *any* name containing ``dist`` (synchronous unless it contains
``_async``, device communication if it contains ``device``). So ``dist_sync_hyloo``
becomes MXNet's plain ``dist_sync``: under a launcher the job trains uncompressed and
only a later ``set_gradient_compression`` fails, with an unrelated message ("Required
parameter type"); in one process ps-lite aborts on ``DMLC_NUM_WORKER``.

``install()`` (called by ``import kvstore_ext``) wraps ``mxnet.kvstore.create``, which
``mx.kv.create`` is and which ``mxnet/model.py``'s ``_create_kvstore`` (Gluon's
Trainer, Module) calls through the module attribute, so that a name containing
``dist`` that is neither registered nor one of MXNet's documented distributed types
raises ValueError with the closest known names. Every other name (MXNet's own, any
registered type, non-distributed names) goes to MXNet's ``create`` untouched.
"""
import difflib
import functools

# MXNet's own distributed names and the test for a name MXNet would run as its plain
# dist store: one definition, in the stdlib-only hook that also uses them
from kvstore_ext_autoload import MXNET_DIST_NAMES, wants_kvstore_ext

MXNET_TYPES = ('local', 'device', 'nccl') + tuple(sorted(MXNET_DIST_NAMES))


def registered_types():
    """Every name ``KVStoreBase.kv_registry`` holds (kvstore_ext's types, MXNet's
    Python stores such as horovod, byteps, and any user-registered store)."""
    from mxnet.kvstore import KVStoreBase
    return sorted(KVStoreBase.kv_registry)


def check_type_name(name):
    """Raise ValueError if ``name`` would silently become a plain MXNet dist store."""
    if not isinstance(name, str):
        return                      # MXNet's create raises its own TypeError
    lower = name.lower()
    registered = registered_types()
    if not wants_kvstore_ext(lower, registered):
        return
    from .registry import kvstore_types
    known = sorted(set(registered) | set(MXNET_TYPES))
    close = difflib.get_close_matches(lower, known, n=3, cutoff=0.6)
    raise ValueError(
        'unknown kvstore type %r%s: MXNet would create its plain dist store for any name '
        'containing "dist" (a typo would train uncompressed). kvstore_ext types: %s; '
        "MXNet's: %s" % (name, ' (did you mean %s?)' % ' or '.join(map(repr, close))
                         if close else '', ', '.join(kvstore_types()), ', '.join(MXNET_TYPES)))


def install():
    """Wrap ``mxnet.kvstore.create`` (once) with ``check_type_name``."""
    from mxnet import kvstore
    from mxnet.kvstore import base
    original = getattr(kvstore, 'create', None)
    if original is None or getattr(original, 'checks_type_names', False):
        return      # (a server process imports us before mxnet.kvstore is complete)

    @functools.wraps(original)
    def create(name='local'):
        check_type_name(name)
        return original(name)

    create.checks_type_names = True
    kvstore.create = create
    base.create = create
