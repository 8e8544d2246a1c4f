"""``--kvstore dist_sync_hylo`` in a script that never imports kvstore_ext.

Why: MXNet's example scripts (``example/image-classification/common/fit.py``,
``example/gluon/image_classification.py``) and users' own scripts pass their
``--kv-store`` string to ``mx.kv.create``. Without ``import kvstore_ext`` our types are
not in MXNet's registry, and MXNet's native ``KVStore::Create`` turns *any* name that
contains ``dist`` into its plain ``dist_sync`` store (``dist_async`` if it contains
``_async``), whose ``type`` still reads the name given: the job then trains
uncompressed and nothing says so.

How: the package installs ``kvstore_ext_autoload.pth`` into site-packages, whose one
line imports this module at every interpreter start. This module imports only ``sys``
and ``os`` and puts a finder on ``sys.meta_path`` that waits for ``mxnet.kvstore``; when
that module has finished executing, ``mxnet.kvstore.create`` (and ``base.create``,
which it is) is wrapped. The wrapper, for a name that contains ``dist`` but is neither
one of MXNet's own spellings nor registered, imports kvstore_ext (which registers the
types) and creates the store again; a name that is still unknown is refused (by
kvstore_ext's own check of names if it installs one, else here), never handed to
MXNet. It covers ``python -m kvstore_ext.launch``, MXNet's ``tools/launch.py`` and a
plain ``python script.py`` alike.

Why a top-level module and not ``kvstore_ext.autoload``: importing anything under
``kvstore_ext`` runs ``kvstore_ext/__init__``, which imports mxnet and loads the C++
plugin (about 2 s at every interpreter start, for every Python program in the
environment). Servers and the scheduler (``DMLC_ROLE`` server/scheduler) get no hook
at all: MXNet runs their server loop *inside* ``import mxnet``, where nothing may be
imported on the side (the aggregator kvstore_ext's workers send is unpickled there,
and imports what it needs itself). ``KVSTORE_EXT_AUTOLOAD=0`` turns the hook off.

At exit, a worker started by ``kvstore_ext.launch`` (``KVSTORE_EXT_LAUNCHER`` set)
that created a dist kvstore prints ``EXIT_LINE`` once its script is done (an atexit
handler registered after MXNet's, so it runs before MXNet's shutdown): the launcher
then knows the script finished, and names a node still running some seconds after
every worker's script is done, instead of waiting for ``--timeout`` (MXNet's own
shutdown can hang; see docs/LAUNCH.md).
"""
import os
import sys

DISABLE_VAR = 'KVSTORE_EXT_AUTOLOAD'          # '0': no hook
LAUNCHER_VAR = 'KVSTORE_EXT_LAUNCHER'         # set by kvstore_ext.launch in workers
# kvstore_ext/launch.py matches this line (EXIT_LINE there; a test holds them equal)
EXIT_LINE = '[kvstore_ext.launch] script finished, exiting'
# MXNet's own names of its distributed store (src/kvstore/kvstore.cc reads only 'dist',
# 'device' and '_async' in a name; these are the spellings its docs and examples use)
MXNET_DIST_NAMES = frozenset(['dist', 'dist_sync', 'dist_async', 'dist_device_sync',
                              'dist_device_async', 'dist_sync_device',
                              'dist_async_device'])
_TARGET = 'mxnet.kvstore'
_MARK = '_kvstore_ext_autoload'
_state = {'exit_registered': False, 'exit_announced': False, 'retrying': False}


def wants_kvstore_ext(name, registry):
    """True if MXNet would run ``name`` as its plain dist store although it is none of
    MXNet's names and nothing registered it: a kvstore_ext type (or a typo of one)."""
    if not isinstance(name, str):
        return False
    lower = name.lower()
    return 'dist' in lower and lower not in MXNET_DIST_NAMES and lower not in registry


def announce_exit(out=None):
    """Print EXIT_LINE once (workers of kvstore_ext.launch only)."""
    if _state['exit_announced'] or not os.environ.get(LAUNCHER_VAR):
        return
    _state['exit_announced'] = True
    out = sys.stdout if out is None else out
    try:
        out.write(EXIT_LINE + '\n')
        out.flush()
    except (OSError, ValueError):
        pass


def _register_exit_line():
    if not _state['exit_registered'] and os.environ.get(LAUNCHER_VAR):
        import atexit
        _state['exit_registered'] = True
        atexit.register(announce_exit)


def _wrap(module):
    """Wrap ``module.create`` (``mxnet.kvstore``) and ``mxnet.kvstore.base.create``."""
    original = getattr(module, 'create', None)
    if original is None or getattr(original, _MARK, False):
        return
    registry = module.KVStoreBase.kv_registry

    def create(name='local'):
        if wants_kvstore_ext(name, registry):
            store = _create_ours(name, registry, create)
        else:
            store = original(name)
        try:
            kind = store.type
        except Exception:       # a registered store need not implement type
            kind = ''
        if isinstance(kind, str) and 'dist' in kind:
            _register_exit_line()
        return store

    create.__doc__ = original.__doc__
    create.__wrapped__ = original
    setattr(create, _MARK, True)
    module.create = create
    base = sys.modules.get(_TARGET + '.base')
    if base is not None and getattr(base, 'create', None) is original:
        base.create = create


def _create_ours(name, registry, ours):
    """Import kvstore_ext (it registers its types) and create ``name`` again."""
    try:
        import kvstore_ext  # noqa: F401  (registers dist_sync_<scheme>)
    except Exception as e:
        raise RuntimeError(
            'kvstore type %r is not one of MXNet\'s, and importing kvstore_ext to find it '
            'failed (%s: %s); refusing it rather than let MXNet run it as plain dist_sync'
            % (name, type(e).__name__, e)) from e
    if name.lower() in registry:
        return registry[name.lower()]()
    current = sys.modules[_TARGET].create
    if current is not ours and not _state['retrying']:
        # kvstore_ext put its own check of names on top: let it refuse (it names close
        # matches); if it hands the name back to us, refuse here
        _state['retrying'] = True
        try:
            return current(name)
        finally:
            _state['retrying'] = False
    raise ValueError('unknown kvstore type %r: neither MXNet\'s (%s) nor registered by '
                     'kvstore_ext (%s); refused rather than run as plain dist_sync'
                     % (name, ', '.join(sorted(MXNET_DIST_NAMES)),
                        ', '.join(sorted(k for k in registry if k.startswith('dist')))))


class _Finder:
    """On sys.meta_path until ``mxnet.kvstore`` is imported: lets the normal finders find
    it, then wraps ``create`` once the module has executed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from importlib.machinery import PathFinder
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _wrap(module)
        spec.loader.exec_module = exec_module
        return spec


def install():
    """Install the hook (idempotent); nothing in servers, the scheduler or when
    ``KVSTORE_EXT_AUTOLOAD=0``."""
    if os.environ.get(DISABLE_VAR, '1') == '0':
        return
    if os.environ.get('DMLC_ROLE') in ('server', 'scheduler'):
        return
    module = sys.modules.get(_TARGET)
    if module is not None:
        if getattr(module, 'create', None) is not None:
            _wrap(module)
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
