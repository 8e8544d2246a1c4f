"""Where a worker trains: the kvstore named by ``--kvstore`` (checked against the
registered types before anything starts, with ``--compression-params``) and the
devices of ``--gpus`` / ``--num-cpu-contexts``."""
import json
import os
import sys

from . import errors
from .errors import UsageError


def import_mxnet():
    """Import MXNet first: in a server or scheduler process started with the script
    (MXNet's tools/launch.py does that) ``import mxnet`` runs the server loop and exits,
    before any worker-only check."""
    import mxnet as mx
    return mx


def check_kvstore_flags(args):
    """--kvstore and --compression-params make sense together, before anything starts."""
    import kvstore_ext
    # MXNet's native types (kvstore_ext/names.py: mx.kv.create of an unknown name
    # makes a 'local' store, or a plain dist one if it contains 'dist')
    from kvstore_ext.names import MXNET_TYPES as MXNET_KVSTORES
    ours = kvstore_ext.kvstore_types()
    name = args.kvstore.lower()
    params = dict(args.compression_params)
    from mxnet.kvstore import KVStoreBase
    if name not in ours and name not in MXNET_KVSTORES and name not in KVStoreBase.kv_registry:
        raise UsageError('unknown --kvstore %r; kvstore_ext types: %s; MXNet\'s: %s'
                         % (args.kvstore, ', '.join(ours), ', '.join(MXNET_KVSTORES)))
    if name in ours:
        ctype = params.pop('type', None)
        if ctype is not None and 'dist_sync_' + str(ctype) != name:
            raise UsageError(
                '--compression-params "type": %r selects MXNet\'s built-in compression; with '
                'kvstore_ext the scheme is the kvstore type (--kvstore dist_sync_%s)'
                % (ctype, ctype))
    elif params:
        ctype = params.get('type')
        hint = ''
        if ctype == '2bit':
            rest = {k: v for k, v in params.items() if k != 'type'}
            hint = (" Use the same scheme as a kvstore_ext type, which works with pushpull: "
                    "--kvstore dist_sync_2bit --compression-params '%s'" % json.dumps(rest))
        raise UsageError(
            "MXNet's built-in gradient compression (%s) cannot be used from a Gluon Trainer: "
            "MXNet's kvstore refuses pushpull when compression is set.%s"
            % (json.dumps(params), hint))
    if name.startswith('dist') and name not in ours and 'DMLC_ROLE' not in os.environ:
        raise UsageError('--kvstore %s needs a launcher that starts scheduler and servers, '
                         'e.g. python -m kvstore_ext.launch -n 2 -s 1 python %s ...'
                         % (args.kvstore, os.path.basename(sys.argv[0])))
    return name, params


def contexts(args):
    """The worker's devices: --gpus, or --num-cpu-contexts CPU contexts."""
    import mxnet as mx
    if args.gpus.strip():
        try:
            ids = [int(i) for i in args.gpus.split(',') if i.strip()]
        except ValueError:
            raise UsageError("--gpus takes GPU ids like '0,1', got %r" % args.gpus)
        available = mx.context.num_gpus()
        missing = [i for i in ids if i >= available]
        if missing:
            raise UsageError('--gpus %s: this machine has %d GPU(s) visible to MXNet'
                             % (args.gpus, available))
        return [mx.gpu(i) for i in ids]
    if args.num_cpu_contexts < 1:
        raise UsageError('--num-cpu-contexts must be >= 1')
    return [mx.cpu(i) for i in range(args.num_cpu_contexts)]


def create_kvstore(name, compression_params):
    """The kvstore (kvstore_ext types are registered on import), compression set; in a
    distributed job, a hard exit from here on, and the rank told to the launcher."""
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(name)
    if kv.type.startswith('dist') and kv.num_workers > 1:
        errors.mark_distributed()
    if kv.type.startswith('dist') and 'DMLC_ROLE' in os.environ:
        # our launcher then labels this worker's output by kv.rank, not launch index
        from kvstore_ext.launch import announce_rank
        announce_rank(kv.rank)
    if compression_params:
        try:
            kv.set_gradient_compression(compression_params)
        except (ValueError, TypeError) as e:
            raise UsageError('--compression-params: %s' % e)
    return kv
