"""A plain key (sent as it is) costs the worker what MXNet's dist_sync costs: per
step, one native pushpull (a key of several chunks: one native push of every chunk,
then one pull, so that the chunks' rounds overlap) and no other MXNet C API call but
one no-op op when the pushed array is not the out (it orders the push after the last pull; chunk views,
dtypes and the call's arguments are made once per plan and arrays:
transport/plain_route.py), in real ps-lite jobs (tests/dist_jobs/plain_path_job.py)
that also check the sums against NumPy's, a NaN reaching the sum, the byte counters
and push/pull."""
import json
import os
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs',
                   'plain_path_job.py')


@pytest.mark.parametrize('kvstore', ['dist_sync_none', 'dist_sync_hylo'])
def test_a_plain_step_is_one_native_round(tmp_path, job_env, kvstore):
    proc = subprocess.run(
        [sys.executable, '-m', 'kvstore_ext.launch', '-n', '2', '-s', '2', '--timeout', '90',
         sys.executable, JOB, '--kvstore', kvstore],
        cwd=str(tmp_path), env=job_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(' done') == 2, proc.stdout[-2000:]
    lines = [line.split('calls ', 1)[1] for line in proc.stdout.splitlines()
             if 'calls ' in line]
    assert len(lines) == 6, proc.stdout[-2000:]      # 3 keys on each of 2 workers
    chunks_seen = set()
    for line in lines:
        key, chunks, steps, apart, calls = line.split(' ', 4)
        chunks, steps = int(chunks), int(steps)
        chunks_seen.add((key, chunks))
        expect = ({'MXKVStorePushPull': steps} if chunks == 1 else
                  {'MXKVStorePush': steps, 'MXKVStorePullWithSparse': steps})
        if int(apart):      # the push waits for the last pull: one no-op op a step
            expect['MXImperativeInvokeEx'] = steps
        assert json.loads(calls) == expect, line
    assert chunks_seen == {('big', 5), ('bias', 1), ('apart', 3)}, lines
