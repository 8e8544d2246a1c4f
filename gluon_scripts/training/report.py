"""What a run tells its user: log lines (with the worker's rank), a progress bar on a
terminal, and the final summary (accuracy, time, bytes against float32, the codec of
every tensor), also as JSON with ``--summary-json``."""
import json
import logging
import os
import sys

import numpy as np


def setup_logging(rank):
    """The 'train' logger: INFO to stdout, every line marked with the rank."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format='%(asctime)s [rank ' + str(rank) + '] %(message)s')
    return logging.getLogger('train')


class Progress:
    """A one-line progress bar on a terminal; silent when the output is a file."""

    def __init__(self, total, enabled=True):
        self.total, self.enabled = total, enabled and sys.stdout.isatty()
        self.shown = False

    def update(self, done, text=''):
        if self.enabled:
            width = 30
            filled = int(width * done / max(self.total, 1))
            sys.stdout.write('\r[%s%s] %d/%d %s\033[K' % ('#' * filled, '.' * (width - filled),
                                                         done, self.total, text))
            sys.stdout.flush()
            self.shown = True

    def clear(self):
        """Before a log line: erase the bar (it is redrawn at the next update)."""
        if self.shown:
            sys.stdout.write('\r\033[K')
            sys.stdout.flush()
            self.shown = False

    def close(self):
        self.clear()


def summarize(args, kv, history, log, extra=None):
    """Final report: accuracy, time, bytes saved against float32; JSON if asked."""
    stats = kv.comm_stats() if hasattr(kv, 'comm_stats') else None
    summary = {'kvstore': args.kvstore, 'compression_params': args.compression_params,
               'scheme_params': dict(kv.scheme.params) if hasattr(kv, 'scheme') else None,
               'rank': kv.rank, 'num_workers': kv.num_workers, 'epochs': history,
               'final_test_acc': history[-1]['test_acc'] if history else None,
               'total_time': float(sum(e['epoch_time'] for e in history)),
               'comm_stats': stats,
               # policy='auto': the link rate its plans use and its choice per key
               'policy': kv.policy_decisions() if hasattr(kv, 'policy_decisions') else None}
    if history:
        summary['samples_per_sec'] = float(np.mean([e['samples_per_sec'] for e in history]))
        summary['bytes_per_step'] = {
            k: float(np.mean([e['bytes_per_step'][k] for e in history]))
            for k in ('push', 'pull', 'raw')}
        summary['bytes_counted'] = stats is not None
    if stats and stats['raw_bytes']:
        summary['push_saved'] = 1 - stats['push_bytes'] / stats['raw_bytes']
        summary['pull_saved'] = 1 - stats['pull_bytes'] / stats['raw_bytes']
        log.info('bytes pushed %.2f MB vs %.2f MB as float32 (%.1fx less, %.1f%% saved); '
                 'pulled %.2f MB', stats['push_bytes'] / 1e6, stats['raw_bytes'] / 1e6,
                 stats['raw_bytes'] / max(stats['push_bytes'], 1), 100 * summary['push_saved'],
                 stats['pull_bytes'] / 1e6)
    if hasattr(kv, 'codec_plan'):
        plan = {str(k): v for k, v in kv.codec_plan().items() if v is not None}
        summary['codec_plan'] = plan
        kinds = {}
        for v in plan.values():
            kind = 'top-k filters' if v.startswith('top') else v.split(',')[0].split()[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        log.info('codecs (tensors): %s', ', '.join('%s %d' % kv_ for kv_ in sorted(kinds.items())))
    if history:
        log.info('final test accuracy %.4f after %d epochs (%.1fs training and evaluation)',
                 summary['final_test_acc'], len(history), summary['total_time'])
    summary.update(extra or {})
    if args.summary_json:
        path = args.summary_json.replace('{rank}', str(kv.rank))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(summary, f, indent=1, default=str)
    return summary
