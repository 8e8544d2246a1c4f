"""Failures in real ps-lite jobs: a worker's NaN gradient ends the job quickly and
cleanly; a malformed payload is rejected by the server, which lives on; a server killed
mid-job ends the job quickly, named."""
import os
import subprocess
import sys
import time

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs', 'failure_job.py')


def launch(env, mode, timeout=120):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, '-m', 'kvstore_ext.launch', '-n', '2', '-s', '1',
                           '--timeout', str(timeout - 20), sys.executable, JOB, '--mode', mode],
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def test_nonfinite_gradient_ends_the_job(job_env):
    proc, seconds = launch(job_env, 'nonfinite')
    assert proc.returncode not in (0, 124), proc.stderr[-3000:]
    assert 'NonFiniteGradientError' in proc.stderr, proc.stderr[-3000:]
    assert 'residual is unchanged' in proc.stderr
    assert 'exited with code 1' in proc.stderr
    assert seconds < 90


def test_malformed_payload_is_rejected_and_server_survives(job_env):
    proc, _ = launch(job_env, 'malformed')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count('step 3 ok') == 2
    log = proc.stdout + proc.stderr
    assert 'payload rejected' in log and 'worker 1' in log, log[-3000:]


def test_server_killed_mid_job_ends_it_named(job_env):
    """The workers block in a round whose server is gone; the launcher sees the server's
    exit, stops every node and says which one died and how."""
    proc, seconds = launch(job_env, 'kill-server')
    assert proc.returncode not in (0, 124), proc.stdout[-2000:] + proc.stderr[-3000:]
    assert 'killing server pid' in proc.stdout, proc.stdout[-2000:]
    assert 'server 0 was killed by signal 9 (SIGKILL); stopping all nodes' in proc.stderr, \
        proc.stderr[-3000:]
    assert 'step 3 ok' not in proc.stdout
    assert seconds < 60
