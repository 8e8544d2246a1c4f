"""A checkpoint of a real job with a compressed pull is a consistent cut, and a job
with another number of workers refuses it.

Cut: rank 0's save sends its command to the servers straight (past MXNet's engine).
A loop that saves right after its last ``pushpull`` calls, without reading the sums
(as after ``trainer.step``), while the other worker's last gradients come late (a slow
backward pass), used to have the servers write the residual of one step earlier. Now
identical runs write byte-identical server files, which are not the files of a save
one step earlier, and resuming from them continues bit for bit.

Workers: a 2-worker checkpoint resumed by 4 workers, and a 4-worker one by 2, are
refused by every worker with one message naming both numbers (or the rank without a
file), before anything reaches a server; no server dies.
"""
import filecmp
import os
import re
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs', 'resume_job.py')
SAVE_AT = 20        # steps before the save: both keys' server residuals move in the
                    # last step (measured; at step 6 the conv key's does not)
LATE = 1500         # rank 1's last gradients come out of LATE x LATE matrix products


def launch(env, workers, *args):
    """(exit code, output) of a 2-server job of ``workers`` workers."""
    proc = subprocess.run([sys.executable, '-m', 'kvstore_ext.launch', '-n', str(workers),
                           '-s', '2', '--timeout', '300', sys.executable, JOB]
                          + [str(a) for a in args],
                          env=env, capture_output=True, text=True, timeout=330)
    return proc.returncode, proc.stdout + proc.stderr


def run(env, *args, workers=2):
    """The pulled sums' digests by (rank, step, key) of a job that must succeed."""
    code, output = launch(env, workers, *args)
    assert code == 0, output[-5000:]
    return dict(((int(r), int(s), k), d) for r, s, k, d in re.findall(
        r'rank (\d+) step (\d+) key (\w+) sum (\w+)', output))


def server_files(directory):
    servers = os.path.join(directory, 'state-0.kvx.servers')
    return servers, sorted(os.listdir(servers))


@pytest.mark.timeout(2100)         # six jobs (each about 30 s on an idle machine)
def test_repeated_saves_write_the_same_cut_and_resume_exactly(job_env, tmp_path):
    earlier = tmp_path / 'earlier'
    earlier.mkdir()
    run(job_env, '--last', SAVE_AT - 1, '--save', earlier)
    earlier_dir, names = server_files(earlier)
    assert len(names) == 2, names                 # fc and conv
    cuts = []
    for attempt in range(3):
        saved = tmp_path / ('saved%d' % attempt)
        saved.mkdir()
        run(job_env, '--last', SAVE_AT, '--save', saved, '--unread',
            '--late-gradient', LATE)
        cuts.append(server_files(saved))
    first_dir, first_names = cuts[0]
    assert first_names == names
    for directory, found in cuts[1:]:
        assert found == names
        _, mismatch, errors = filecmp.cmpfiles(first_dir, directory, names, shallow=False)
        assert not mismatch and not errors, (directory, mismatch, errors)
    # every key's server residual moved in the last step: a save that missed it differs
    _, mismatch, _ = filecmp.cmpfiles(first_dir, earlier_dir, names, shallow=False)
    assert mismatch == names, 'files equal to a save one step earlier: %s' % (
        sorted(set(names) - set(mismatch)))
    straight = run(job_env, '--last', SAVE_AT + 3)
    resumed = run(job_env, '--first', SAVE_AT, '--last', SAVE_AT + 3, '--load',
                  tmp_path / 'saved2')
    later = {k: v for k, v in straight.items() if k[1] >= SAVE_AT}
    assert len(later) == 2 * 3 * 2 and resumed == later


def check_refused(output, saved, current):
    """Every worker that got to the load refused with one of the two messages, and no
    node died of a signal or of a failed check."""
    counts = 'was saved by a job of %d workers, this job has %d' % (saved, current)
    # ranks beyond the saved ones have no file of their own and may be the first to fail
    missing = ['no compression state for worker rank %d' % rank
               for rank in range(saved, current)]
    assert any(m in output for m in [counts] + missing), output[-5000:]
    assert 'MXNetError' not in output and 'Check failed' not in output, output[-5000:]
    assert 'killed by signal' not in output, output[-5000:]
    assert not re.search(r'rank \d+ step \d+ key', output), 'a step ran: ' + output[-3000:]


@pytest.mark.timeout(700)
def test_two_worker_checkpoint_in_four_worker_job_is_refused(job_env, tmp_path):
    run(job_env, '--last', 3, '--save', tmp_path)
    code, output = launch(job_env, 4, '--first', 3, '--last', 5, '--load', tmp_path)
    assert code != 0
    check_refused(output, 2, 4)


@pytest.mark.timeout(700)
def test_four_worker_checkpoint_in_two_worker_job_is_refused(job_env, tmp_path):
    run(job_env, '--last', 3, '--save', tmp_path, workers=4)
    code, output = launch(job_env, 2, '--first', 3, '--last', 5, '--load', tmp_path)
    assert code != 0
    check_refused(output, 4, 2)
