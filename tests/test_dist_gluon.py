"""Gluon training on real ps-lite processes: 4 workers and 2 servers train the MNIST
CNN on the bundled digits with MXNet's dist_sync and with dist_sync_hylo in both
aggregation modes; Hylo's accuracy after the same epochs is not below dist_sync's by
more than the two runs' noise, while the default (homomorphic) mode moves over 3.5x
fewer bytes both ways and server mode pushes over 7x fewer (and pulls float32).

Why one-sided and 1.5 points: one run of each cannot show "within 0.5 points". The
server sums arrive in any order, so two runs of dist_sync with one seed differ; seeds
spread dist_sync's final accuracy by 0.4-0.5 points (bench/results/accuracy.txt), so the
difference of two single runs spreads by about 0.6. A CI run failed the old two-sided
0.5-point bound with Hylo 0.95 points *above* dist_sync (97.5 vs 96.55). Within 0.5
points is judged over seeds by bench/promise.py (docs/RESULTS.md, "Hylo's accuracy
matrix"); this test
catches a Hylo that trains worse than the noise (for scale, MXNet's 2-bit codec lost
38 points on this CNN in bench/results/accuracy.txt's 8-epoch run).

The byte bounds: server mode's was 10x before the conv rates were raised: a conv
layer at the size threshold now sends 0.3 of its filters (was 0.1), which bought back
the accuracy that short runs lost; on this CNN, whose conv layers are a quarter of the
gradient, that costs the push ratio from over 10x to 7.4x (in a CI run;
bench/results/wire_bytes.json gives the bytes per model). The additive mode codes
FC values as base-9 digits at 4 workers (4.6 bits, not 2.1) and sends twice the conv
filters, but its pull is compressed as much as its push: 4.0x both ways here
(measured), against server mode's 7.4x push and 1x pull."""
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'gluon_scripts', 'train_mnist.py')
ARGS = ['--num-epochs', '8', '--batch-size', '32', '--lr', '0.1', '--lr-mode', 'cosine',
        '--log-interval', '0']


NOISE = 0.015  # two single runs' accuracy difference that seeds alone can produce


def train(tmp_path, env, kvstore, params=None):
    name = kvstore + ''.join('-%s=%s' % kv for kv in sorted((params or {}).items()))
    summary = str(tmp_path / (name + '-{rank}.json'))
    extra = ['--compression-params', json.dumps(params)] if params else []
    cmd = [sys.executable, '-m', 'kvstore_ext.launch', '-n', '4', '-s', '2', '--timeout', '500',
           sys.executable, SCRIPT, '--kvstore', kvstore, '--summary-json', summary] + ARGS + extra
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.load(open(summary.replace('{rank}', str(r)))) for r in range(4)]
    assert {r['num_workers'] for r in runs} == {4}
    return runs


def late_accuracy(run):
    """Mean test accuracy of the last two epochs (the lr has decayed to ~0 by then)."""
    return float(np.mean([e['test_acc'] for e in run['epochs'][-2:]]))


def test_hylo_matches_dist_sync_in_both_modes(tmp_path, job_env):
    plain = train(tmp_path, job_env, 'dist_sync')
    modes = {'homomorphic': train(tmp_path, job_env, 'dist_sync_hylo'),     # the default
             'server': train(tmp_path, job_env, 'dist_sync_hylo', {'aggregation': 'server'})}
    # every worker evaluates the same synchronised model on the same digits (MXNet's own
    # dist_sync too: the scripts broadcast the initial weights before the first push,
    # training/loop.py _broadcast_before_first_push; docs/decisions/dist-sync-broadcast-first.md)
    assert len({r['final_test_acc'] for r in plain}) == 1, [r['final_test_acc'] for r in plain]
    assert late_accuracy(plain[0]) > 0.95, plain[0]['epochs']
    for mode, hylo in modes.items():
        assert len({r['final_test_acc'] for r in hylo}) == 1, mode
        assert late_accuracy(hylo[0]) >= late_accuracy(plain[0]) - NOISE, \
            (mode, hylo[0]['epochs'], plain[0]['epochs'])
        plans = hylo[0]['codec_plan'].values()
        assert any(p.startswith('ternary') for p in plans), (mode, plans)
        assert any('additive' in p for p in plans) == (mode == 'homomorphic'), (mode, plans)
    for run in modes['homomorphic']:
        stats = run['comm_stats']
        assert stats['raw_bytes'] >= 3.5 * stats['push_bytes'], stats
        assert stats['raw_bytes'] >= 3.5 * stats['pull_bytes'], stats
    for run in modes['server']:
        stats = run['comm_stats']
        assert stats['raw_bytes'] >= 7 * stats['push_bytes'], stats
        assert stats['pull_bytes'] >= 0.99 * stats['raw_bytes'], stats   # float32 pulled
