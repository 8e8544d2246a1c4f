"""Real ps-lite jobs in which every worker but rank 0 pushes a new array each step and
never reads its results (tests/dist_jobs/no_wait_job.py): no round may take a push of
another step. MXNet's dist_sync orders a key's push after its last pull only through
the pushed array; without the store's ordering (transport/ps.py ``_after_last_round``)
these jobs return wrong sums and then hang."""
import os
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs', 'no_wait_job.py')


@pytest.mark.parametrize('kvstore', ['dist_sync_hylo', 'dist_sync_none', 'dist_sync_fp16'])
def test_a_round_takes_only_its_own_step(tmp_path, job_env, kvstore):
    proc = subprocess.run(
        [sys.executable, '-m', 'kvstore_ext.launch', '-n', '3', '-s', '1', '--timeout', '60',
         sys.executable, JOB, '--kvstore', kvstore, '--steps', '30'],
        cwd=str(tmp_path), env=job_env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'no-wait %s steps 30 worst relative error' % kvstore in proc.stdout, proc.stdout
    assert proc.stdout.count(' done') == 3, proc.stdout[-2000:]
