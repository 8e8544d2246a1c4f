"""Gluon end to end in one process: the MNIST CNN trained through dist_sync_hylo
reaches the accuracy of the same run through dist_sync_none (within one point)."""
import json
import os
import subprocess
import sys


SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'gluon_scripts', 'train_mnist.py')


def train(tmp_path, kvstore, epochs=3, extra=()):
    summary = tmp_path / (kvstore + '.json')
    env = dict(os.environ)
    env.pop('DMLC_ROLE', None)
    proc = subprocess.run([sys.executable, SCRIPT, '--kvstore', kvstore, '--num-epochs',
                           str(epochs), '--summary-json', str(summary), '--log-interval', '0']
                          + list(extra), capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(summary.read_text())


def test_hylo_matches_uncompressed_accuracy(tmp_path):
    plain = train(tmp_path, 'dist_sync_none')
    hylo = train(tmp_path, 'dist_sync_hylo')
    assert plain['final_test_acc'] > 0.9, plain['epochs']
    assert abs(hylo['final_test_acc'] - plain['final_test_acc']) <= 0.01, \
        (hylo['epochs'], plain['epochs'])
    # the CPU the process spent training (every thread), which the loopback benchmark
    # compares: positive, and no more than its cores could give in the epoch's time
    for epoch in plain['epochs'] + hylo['epochs']:
        assert 0 < epoch['train_cpu'] <= epoch['train_time'] * (os.cpu_count() or 1) + 0.1, \
            epoch
    stats = hylo['comm_stats']
    assert stats['push_bytes'] * 5 < stats['raw_bytes'], stats
    assert plain['comm_stats']['push_bytes'] == plain['comm_stats']['raw_bytes']
