"""The statistics of bench/promise.py, the accuracy harness whose verdicts
docs/RESULTS.md quotes: the paired verdict against a margin, the paired training-time ratio, and
``--report`` on a results file. Fake run records, no training."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, 'bench')
sys.path.insert(0, BENCH)
import promise  # noqa: E402  (bench/promise.py; no mxnet)


def run(spec, seed, acc, train_s, model='cnn512'):
    return {'spec': spec, 'model': model, 'workers': 4, 'schedule': 'short', 'seed': seed,
            'final_acc': acc, 'push_ratio': 13.0, 'pull_ratio': 1.0, 'wall_s': train_s + 1,
            'train_s': train_s, 'others_cpu_share': 0.0,
            'curve': [{'epoch': 0, 'test_acc': acc, 'test_acc_spread': 0.0,
                       'wall_s': train_s + 1, 'train_s': train_s, 'train_loss': 0.1}]}


def test_verdict_against_the_margin():
    # a steady loss of 0.7 points: not within 0.5, within 1, and shown both ways
    diffs = [0.7, 0.75, 0.65, 0.7, 0.72, 0.68]
    assert promise.verdict(diffs, 0.5) == 'WORSE'
    assert promise.verdict(diffs, 1.0) == 'ok'
    # a noisy one: the seeds cannot tell
    assert promise.verdict([0.7, -1.0, 2.0], 1.0) == '?'
    assert promise.verdict([0.1], 1.0) == '?'     # one seed never decides


def test_summary_pairs_accuracy_and_time_by_seed():
    runs = [run('dist_sync', 1, 0.950, 10.0), run('dist_sync', 2, 0.940, 12.0),
            run('dist_sync', 3, 0.930, 11.0),
            run('dist_sync_x', 1, 0.945, 12.0), run('dist_sync_x', 2, 0.936, 13.2),
            run('dist_sync_x', 3, 0.9255, 12.1),
            run('dist_sync_x', 4, 0.5, 9.0)]      # no baseline for seed 4: not paired
    rows = {r['spec']: r for r in promise.summarize(runs, margin=1.0)}
    x = rows['dist_sync_x']
    assert x['seeds'] == [1, 2, 3, 4] and x['paired_n'] == 3
    assert x['paired_diff_points'][0] == pytest.approx((0.5 + 0.4 + 0.45) / 3)
    assert x['verdict'] == 'ok'
    assert x['train_ratio'][0] == pytest.approx((1.2 + 1.1 + 1.1) / 3)
    assert rows['dist_sync']['train_ratio'][0] == pytest.approx(1.0)
    assert promise.summarize(runs)[1]['verdict'] == '?'    # 0.5: the seeds cannot tell


def test_report_prints_a_results_file(tmp_path):
    path = tmp_path / 'runs.json'
    path.write_text(json.dumps({'runs': [run('dist_sync', s, 0.95, 10.0) for s in (1, 2)] +
                                        [run('dist_sync_x', s, 0.90, 11.0) for s in (1, 2)]}))
    out = subprocess.run([sys.executable, os.path.join(BENCH, 'promise.py'), '--report',
                          '--margin', '1', '--json', str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith('dist_sync_x')][0]
    assert '+5.00' in line and 'WORSE' in line and '1.100' in line
    missing = subprocess.run([sys.executable, os.path.join(BENCH, 'promise.py'), '--report',
                              '--json', str(tmp_path / 'none.json')],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and 'existing --json' in missing.stderr


def test_seeds_to_show_is_the_smallest_count_whose_bound_clears_the_margin():
    diffs = [0.1, 0.5, -0.2, 0.4]          # mean 0.2, sd 0.316
    n = promise.seeds_to_show(diffs, 0.5)
    bound = lambda k: 0.2 + promise.t95(k - 1) * 0.31623 / k ** 0.5  # noqa: E731
    assert bound(n) < 0.5 <= bound(n - 1)
    assert promise.seeds_to_show([0.6, 0.7, 0.5], 0.5) is None    # mean above: never
    assert promise.seeds_to_show([0.3], 0.5) is None              # one seed: no spread
    assert promise.seeds_to_show([0.49, -1.0, 2.0], 0.5, most=50) == 51
    assert promise.upper_bound([0.1, 0.5, -0.2, 0.4]) == pytest.approx(bound(4), abs=1e-4)


def _write(path, runs):
    path.write_text(json.dumps({'runs': runs}))
    return str(path)


def test_report_merges_files_and_prints_the_matrix(tmp_path):
    base = _write(tmp_path / 'a.json', [run('dist_sync', s, 0.95, 10.0) for s in (1, 2, 3)])
    more = _write(tmp_path / 'b.json', [run('dist_sync_x', s, a, 11.0)
                                        for s, a in ((1, 0.949), (2, 0.951), (3, 0.950))])
    cmd = [sys.executable, os.path.join(BENCH, 'promise.py'), '--json', base, '--report',
           more, '--matrix']
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if ' dist_sync_x' in x][0]
    # paired loss 0.00 +- 0.10 over 3 seeds: bound 0.17, shown within 0.5, 2 seeds would do
    assert '+0.00' in line and '+0.17' in line and ' ok ' in line and line.endswith(' 2')
    assert '0.100/0.100' in line
    assert not any(x.startswith('cnn512') and ' dist_sync ' in x
                   for x in out.stdout.splitlines())      # no line for the baseline itself
    twice = subprocess.run(cmd[:-2] + [base], capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and 'also in' in twice.stderr
    alone = subprocess.run(cmd[:4] + ['--matrix'], capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2 and 'form of --report' in alone.stderr


def test_run_curve_sums_the_workers_training_cpu():
    """A job's training CPU is its workers' (summed: each is one process's); absent when a
    worker did not record it (results made before it was)."""
    import accuracy

    def summary(cpu, acc=0.9):
        epoch = {'test_acc': acc, 'wall_time': 5.0, 'epoch_time': 4.0, 'train_time': 3.0,
                 'train_loss': 0.2}
        if cpu is not None:
            epoch['train_cpu'] = cpu
        return {'epochs': [epoch]}
    curve = accuracy.run_curve([summary(2.5), summary(3.0)])
    assert curve[0]['train_cpu_s'] == 5.5 and curve[0]['train_s'] == 3.0
    assert 'train_cpu_s' not in accuracy.run_curve([summary(2.5), summary(None)])[0]
