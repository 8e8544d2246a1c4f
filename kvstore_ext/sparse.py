"""Sparse (row_sparse) arrays: refused at a key's first use, with the way out.

Why refuse rather than pass them through uncompressed: MXNet's own ``dist_sync`` takes
row_sparse gradients only with the optimizer on its servers (Gluon's Trainer then
requires ``update_on_kvstore=True``; a row_sparse key without a server-side updater
comes back with rows at the wrong indices), and a compressing store runs no optimizer
there: its servers sum (or decode) gradients. So there is no uncompressed path through
MXNet for a row_sparse key that gives what ``dist_sync`` gives.

Where: the store checks each key's arrays once (store.py, ``_declare`` and the checks
of a key's first round: Module's ``init``/``push``/``pushpull``, hand-written loops);
Gluon's Trainer refuses any custom kvstore for sparse gradients before the store sees
a key ("Cannot use <class> for multi-device training with sparse gradients"), so
``install()`` wraps ``Trainer._init_kvstore`` to say which parameter and what to do
first, for kvstore_ext's types only.
"""
import functools
import sys


def refusal(key, stype, store_type):
    """The message for a ``stype`` array of ``key`` given to ``store_type``."""
    return ('key %r: %s arrays cannot be compressed by %s, which handles dense gradients '
            "only, nor passed through (MXNet's dist_sync takes sparse gradients only with "
            'the optimizer on its servers, which kvstore_ext does not run). Make the '
            'gradient dense (Gluon: nn.Embedding(..., sparse_grad=False); Module: a '
            "default-storage gradient), it is then compressed like any other; or train "
            "this model with kvstore='dist_sync'" % (key, stype, store_type))


def _compressing(kvstore, store_class):
    from mxnet.kvstore import KVStoreBase
    if isinstance(kvstore, str):
        kvstore = KVStoreBase.kv_registry.get(kvstore.lower())
        return isinstance(kvstore, type) and issubclass(kvstore, store_class)
    return isinstance(kvstore, store_class)


def check_trainer(trainer, store_class):
    """Raise TypeError if a Gluon Trainer with a kvstore_ext store (a ``store_class``,
    given by the caller: the store imports this module) has a parameter with a sparse
    gradient or weight."""
    kvstore = trainer._kvstore_params.get('kvstore')
    if not _compressing(kvstore, store_class):
        return
    for param in trainer._params:
        for stype in (param._grad_stype, param._stype):
            if stype != 'default':
                name = kvstore if isinstance(kvstore, str) else kvstore.type
                raise TypeError('Gluon parameter ' + refusal(param.name, stype, name))


def install(store_class):
    """Wrap Gluon's ``Trainer._init_kvstore`` (once) with ``check_trainer`` for
    ``store_class``'s stores; not in a server process, where Gluon is not imported."""
    module = sys.modules.get('mxnet.gluon.trainer')
    if module is None:
        return
    original = module.Trainer._init_kvstore
    if getattr(original, 'checks_sparse', False):
        return

    @functools.wraps(original)
    def _init_kvstore(self):
        check_trainer(self, store_class)
        return original(self)

    _init_kvstore.checks_sparse = True
    module.Trainer._init_kvstore = _init_kvstore
