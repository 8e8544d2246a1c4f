"""The flags every script has (``base_parser``; a script adds its own to
``parser.script_group``) and the checks of their values that need no MXNet."""
import argparse
import json

from .errors import UsageError
from .optim import lr_step_epochs


def base_parser(description, epilog=None, **defaults):
    """The flags every script has; ``defaults`` overrides per script (e.g. lr=0.1).
    ``parser.script_group`` is where a script adds its own (model, data) flags."""
    p = argparse.ArgumentParser(description=description, epilog=epilog,
                                formatter_class=_HelpFormatter)
    p.script_group = p.add_argument_group('model and data')
    g = p.add_argument_group('distributed')
    g.add_argument('--kvstore', default='dist_sync_hylo',
                   help="kvstore type: one registered by kvstore_ext (dist_sync_hylo, "
                        "dist_sync_none, dist_sync_2bit, ...) or MXNet's own (dist_sync, "
                        "dist_async, local, device). dist types need a launcher: "
                        "python -m kvstore_ext.launch -n WORKERS -s SERVERS python SCRIPT ...")
    g.add_argument('--compression-params', default={}, type=_json_dict,
                   help='JSON dict of the scheme\'s parameters, e.g. '
                        '\'{"size_threshold": 32768, "aggregation": "server"}\'')
    g = p.add_argument_group('training')
    g.add_argument('--num-epochs', type=int, default=3, help='epochs to train (in all, with '
                   '--resume)')
    g.add_argument('--batch-size', type=int, default=64,
                   help='per device; a worker trains on batch-size x devices samples a step')
    g.add_argument('--optimizer', default='sgd', help="any MXNet optimizer ('sgd', 'nag', ...)")
    g.add_argument('--lr', type=float, default=0.05,
                   help='learning rate (for the global batch: the kvstore sums all workers\' '
                        'gradients and the step divides by the global batch)')
    g.add_argument('--lr-mode', default='cosine', choices=('cosine', 'step', 'constant'),
                   help='learning-rate schedule over the whole run')
    g.add_argument('--lr-steps', '--lr-decay-epoch', dest='lr_steps', default='',
                   help="step mode: epochs after which the lr is multiplied by --lr-factor, "
                        "e.g. '30,60,80'")
    g.add_argument('--lr-factor', '--lr-decay', dest='lr_factor', type=float, default=0.1,
                   help='step mode: lr multiplier at each step')
    g.add_argument('--warmup-epochs', type=float, default=0.0,
                   help='linear warm-up of the lr over this many epochs')
    g.add_argument('--warmup-lr', type=float, default=0.0, help='lr at the start of warm-up')
    g.add_argument('--momentum', type=float, default=0.9,
                   help='of sgd and nag; with sgd it is also given to a scheme that has a '
                        '"momentum" parameter (Hylo: DGC\'s momentum correction of the conv '
                        'top-k, from 8 workers on by default) unless --compression-params '
                        'sets it')
    g.add_argument('--wd', type=float, default=1e-4, help='weight decay')
    g.add_argument('--mode', default='hybrid', choices=('hybrid', 'imperative'),
                   help='hybrid: hybridize the network (static graph)')
    g.add_argument('--seed', type=int, default=42,
                   help='seeds initialisation, data order and augmentation (with the epoch)')
    g.add_argument('--nan-at-step', type=int, default=-1, metavar='STEP',
                   help='fault injection: worker 0 puts a NaN into its first gradient at '
                        'this step (counted from 0 over the run), to see the void step '
                        'skipped by every worker')
    g = p.add_argument_group('devices (per worker)')
    g.add_argument('--gpus', default='', help="GPU ids, e.g. '0,1' (none: CPU)")
    g.add_argument('--num-cpu-contexts', type=int, default=1,
                   help='without --gpus: train on this many CPU contexts (mx.cpu(0), '
                        'mx.cpu(1), ...), the multi-device path of a GPU worker')
    g = p.add_argument_group('data')
    g.add_argument('--synthetic', action='store_true',
                   help='random data of the real shapes (for benchmarks); no files are read')
    g.add_argument('--num-batches', type=int, default=0,
                   help='if > 0, at most this many batches per epoch in training and in '
                        'evaluation (benchmarks, smoke tests)')
    g = p.add_argument_group('checkpoints')
    g.add_argument('--save-dir', default='',
                   help='write a checkpoint here every --save-frequency epochs: parameters, '
                        'trainer states and the kvstore\'s residuals, one set of files per '
                        'worker (empty: no checkpoints)')
    g.add_argument('--save-frequency', type=int, default=1, help='epochs between checkpoints')
    g.add_argument('--resume', nargs='?', const='latest', default=None, metavar='EPOCH',
                   help='continue from the checkpoint in --save-dir written after EPOCH '
                        'epochs (default: the latest); the run then trains to --num-epochs')
    g = p.add_argument_group('output')
    g.add_argument('--log-interval', type=int, default=20,
                   help='batches between log lines (0: only per epoch)')
    g.add_argument('--summary-json', default=None,
                   help='write a final JSON summary here; {rank} is replaced by the rank')
    p.set_defaults(**defaults)
    return p


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
    """Defaults shown, except empty ones; the description and epilog as written."""

    def _get_help_string(self, action):
        if action.default in (None, '', {}, False):
            return action.help
        return super()._get_help_string(action)


def _json_dict(text):
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError('not JSON (%s): %s' % (e, text))
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError('a JSON object is needed, got %s' % text)
    return value


def check_args(args):
    for flag in ('num_epochs', 'batch_size', 'save_frequency'):
        if getattr(args, flag) < 1:
            raise UsageError('--%s must be >= 1' % flag.replace('_', '-'))
    if args.resume is not None and not args.save_dir:
        raise UsageError('--resume needs --save-dir (where the checkpoints are)')
    if args.resume not in (None, 'latest'):
        try:
            int(args.resume)
        except ValueError:
            raise UsageError('--resume takes an epoch number, got %r' % args.resume)
    if args.lr_mode == 'step':
        lr_step_epochs(args)
