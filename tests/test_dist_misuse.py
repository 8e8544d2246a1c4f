"""Misuse under the launcher (2 workers, 1 server; tests/dist_jobs/misuse_job.py):
a mistyped kvstore type raises in every worker (``mx.kv.create`` and a Gluon
Trainer) instead of training with MXNet's plain dist_sync; a Gluon Embedding with
sparse gradients is refused naming its parameter; a float64 key and a key repeated in
one pushpull list come back exactly as through MXNet's own dist_sync."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'dist_jobs', 'misuse_job.py')
WORKERS = 2


def run(tmp_path, env, kvstore, timeout=300):
    out = str(tmp_path / (kvstore + '-{rank}.json'))
    cmd = [sys.executable, '-m', 'kvstore_ext.launch', '-n', str(WORKERS), '-s', '1',
           '--timeout', str(timeout - 30), sys.executable, JOB, '--kvstore', kvstore,
           '--out', out]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.load(open(out.replace('{rank}', str(r)))) for r in range(WORKERS)]


@pytest.mark.timeout(660)       # two jobs of 300 s at most (alone: about 15 s each)
def test_misuse_on_ps_lite(tmp_path, job_env):
    ours = run(tmp_path, job_env, 'dist_sync_hylo')
    plain = run(tmp_path, job_env, 'dist_sync')
    for found in ours:
        assert found['create_typo'].startswith("ValueError: unknown kvstore type "
                                               "'dist_sync_hyloo' (did you mean 'dist_sync_hylo'")
        assert found['trainer_typo'] == found['create_typo']
        assert found['trainer_sparse'].startswith('TypeError: Gluon parameter key ')
        assert 'sparse_grad=False' in found['trainer_sparse']
    for found in ours + plain:
        assert found['f64_dtype'] == 'float64'
        # what dist_sync's server gives for float64, bit for bit (measured: exact, as
        # 1e15 + 1e15 + 1 and 2**52 + 1 twice come back whole)
        assert found['f64'] == plain[0]['f64']
        a_plus_b = [sum(i * (r + 1) + 0.5 + r for r in range(WORKERS)) for i in range(6)]
        assert found['repeated'] == [a_plus_b, a_plus_b]
