"""Failures in real ps-lite jobs: a worker's NaN gradient voids the step on every
worker and training goes on (a key's rounds, and a Gluon script); a malformed payload
is rejected by the server, which lives on; a server killed mid-job ends the job
quickly, named."""
import json
import os
import subprocess
import sys
import time

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs', 'failure_job.py')


def launch(env, mode, timeout=120, extra=()):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, '-m', 'kvstore_ext.launch', '-n', '2', '-s', '1',
                           '--timeout', str(timeout - 20), sys.executable, JOB, '--mode', mode]
                          + list(extra),
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


@pytest.mark.parametrize('mode', [['--aggregation', 'server'],
                                  ['--aggregation', 'server', '--pull', 'compressed'],
                                  ['--aggregation', 'homomorphic'],
                                  ['--aggregation', 'server', '--nan-ranks', '0,1'],
                                  ['--kvstore', 'dist_sync_thc'],
                                  ['--replan'], ['--replan', '--nan-ranks', '1']],
                         ids=['server', 'compressed-pull', 'homomorphic', 'every-rank-nan',
                              'thc', 'replan', 'replan-nan-on-rank-1'])
def test_nonfinite_gradient_voids_the_step_and_training_goes_on(job_env, mode):
    """Rank 0's NaN at step 2: both workers' sums of step 2 are NaN, and steps 3 and 4
    are finite, equal on both workers and (server mode, float32 pull) equal to what
    one-process stores of both ranks give, rank 0's having kept its residual through
    the NaN. With a compressed pull the servers reply void rows, not a malformed reply.
    Then: every worker's gradient holds the NaN. Last: THC, whose two rounds decide a
    void step on the engine (a NaN norm), with no host read before the push. Last, a
    re-plan to float32 at the NaN step (``--replan``): the residuals it hands over
    must not be lost with the void step, on the NaN's worker or the other."""
    proc, _ = launch(job_env, 'nonfinite', extra=mode)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if ' ok checksum ' in l]
    assert len(lines) == 10, proc.stdout[-2000:]
    for step in (3, 4):
        sums = {l.split(' ok checksum ')[1] for l in lines if 'step %d ok' % step in l}
        assert len(sums) == 1, sums       # every worker pulled the same sum
    for rank in [] if '--replan' in mode else \
            mode[mode.index('--nan-ranks') + 1].split(',') if '--nan-ranks' in mode else ['0']:
        assert 'non-finite gradient (NaN or Inf) on this worker (rank %s)' % rank \
            in proc.stderr, proc.stderr[-3000:]
    if '--replan' in mode:
        assert proc.stdout.count('finite steps delivered their gradients') == 2, \
            proc.stdout[-2000:]


def test_malformed_payload_is_rejected_and_server_survives(job_env):
    proc, _ = launch(job_env, 'malformed')
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count('step 3 ok') == 2
    log = proc.stdout + proc.stderr
    # the server logs a round's statuses when the key's next round arrives (it does not
    # wait for the decode), naming the worker and what was wrong
    assert 'payload of worker 1 rejected in the previous round' in log, log[-3000:]
    assert 'unsupported payload version' in log


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


def test_gluon_script_skips_a_void_step_on_every_worker(job_env, tmp_path):
    """train_mnist.py with worker 0's NaN at step 5 (--nan-at-step): both workers
    record step 5 as void, skip its update, train on and end with the same model at a
    trained accuracy (2 epochs of the bundled digits)."""
    script = os.path.join(os.path.dirname(os.path.dirname(JOB)), '..', 'gluon_scripts',
                          'train_mnist.py')
    summary = str(tmp_path / 'run-{rank}.json')
    proc = subprocess.run(
        [sys.executable, '-m', 'kvstore_ext.launch', '-n', '2', '-s', '1', '--timeout', '200',
         sys.executable, script, '--kvstore', 'dist_sync_hylo', '--num-epochs', '2',
         '--batch-size', '32', '--lr', '0.1', '--log-interval', '0', '--nan-at-step', '5',
         '--summary-json', summary],
        env=job_env, capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = [json.load(open(summary.format(rank=r))) for r in range(2)]
    for run in runs:
        assert run['epochs'][0]['void_steps'] == [5], run['epochs'][0]
        assert run['epochs'][1]['void_steps'] == []
        assert run['final_test_acc'] > 0.9, run['epochs']
    assert runs[0]['final_test_acc'] == runs[1]['final_test_acc']
    assert 'void step' in proc.stdout + proc.stderr
