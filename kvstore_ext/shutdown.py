"""How a process with kvstore_ext stores ends: the job exits, and says what it saved.

Why this exists. MXNet's own atexit handler (``mxnet.base._notify_shutdown``,
``MXNotifyShutdown``) puts the engine in its shutdown phase and waits for it; from then
on the engine *skips* the operations still queued (``ThreadedEngine::ExecuteOprBlock``
only calls their completion). A worker whose last pushes were still queued at that
moment never sends them, so another worker's pull of that round never returns: that
worker waits in ``WaitForAll`` for ever, and the first one waits for it in the barrier
of ``~KVStoreDist`` (garbage collection at interpreter shutdown). Both stacks were seen
in hung jobs of MXNet's ``train_imagenet.py``. Stock ``dist_sync`` has the same race;
our stores make it likely because their last step queues more engine operations
(encoders, a second round, deferred checks) after the script's last line.

So, at exit, before MXNet's handler (atexit runs handlers last-registered first, and
this one is registered when the first store is made, long after ``import mxnet``
registered MXNet's):

1. tell ``kvstore_ext.launch`` the script is done (``kvstore_ext_autoload.announce_exit``);
2. wait for the engine (``mxnet.ndarray.waitall``): every queued push reaches its
   server while the engine still runs operations;
3. on rank 0, print one line per store: type, scheme mode, bytes pushed and pulled
   against float32 (``comm_stats``), so compression shows in any script's output;
4. release the stores' inner native kvstores (``PSTransport.release``): the collective
   barrier of ``~KVStoreDist`` then runs here, between live workers, not during
   garbage collection after MXNet's shutdown.

``KVSTORE_EXT_SUMMARY=0`` turns off the line of step 3.
"""
import atexit
import os
import sys
import weakref

SUMMARY_VAR = 'KVSTORE_EXT_SUMMARY'
_MODE_PARAMS = ('aggregation', 'pull')      # Hylo's aggregation and what workers pull
_stores = weakref.WeakSet()
_state = {'registered': False}


def track(store):
    """Called by every CompressedKVStore when it is made."""
    _stores.add(store)
    if not _state['registered']:
        _state['registered'] = True
        atexit.register(at_exit)


def _megabytes(count):
    return '%.2f MB' % (count / 1e6)


def _ratio(raw, sent):
    return ('%.1fx fewer' % (raw / sent)) if sent else 'none sent'


def summary_line(store):
    """One line: what ``store`` moved, against float32 (None if it made no step)."""
    stats = store.comm_stats()
    if not stats['steps']:
        return None
    params = getattr(store.scheme, 'params', {})
    shown = [name for name in _MODE_PARAMS if name in params]
    if params.get('aggregation', 'server') != 'server':
        shown = [name for name in shown if name != 'pull']   # pull: server mode's option
    mode = ', '.join('%s=%s' % (name, params[name]) for name in shown)
    raw = stats['raw_bytes']
    return ('[kvstore_ext] %s%s, rank %d of %d, %d steps: pushed %s, pulled %s; float32 '
            'would push %s and pull %s (push %s, pull %s)'
            % (store.type, ' (%s)' % mode if mode else '', store.rank, store.num_workers,
               stats['steps'], _megabytes(stats['push_bytes']),
               _megabytes(stats['pull_bytes']), _megabytes(raw), _megabytes(raw),
               _ratio(raw, stats['push_bytes']), _ratio(raw, stats['pull_bytes'])))


def at_exit(out=None):
    """Steps 1-4 of the module's docstring; reports its own failures, never raises."""
    out = sys.stderr if out is None else out
    try:
        from kvstore_ext_autoload import announce_exit
    except ImportError:         # the hook is not installed (a source checkout)
        pass
    else:
        announce_exit()
    stores = list(_stores)
    try:
        from mxnet import ndarray
        ndarray.waitall()
        if os.environ.get(SUMMARY_VAR, '1') != '0':
            for store in stores:
                line = summary_line(store) if store.rank == 0 else None
                if line:
                    out.write(line + '\n')
            out.flush()
    except Exception as e:      # noqa: BLE001 (at exit: say it, then release anyway)
        out.write('[kvstore_ext] at exit: %s: %s\n' % (type(e).__name__, e))
    for store in stores:
        release = getattr(store._transport, 'release', None)
        if release is not None:
            release()
