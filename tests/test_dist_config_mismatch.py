"""Workers configured differently: every worker raises at the key's first round,
naming the key, what differs and which ranks hold which value; no server dies of
SIGABRT, nothing trains on diverging replicas, and the job ends well within its
timeout. Before the fingerprint round (kvstore_ext/fingerprint.py), rank 0's
``fc_scale=4.0`` trained on silently with replicas drifting apart (exit 0),
``size_threshold=10`` / ``aggregation='server'`` / a key of another shape killed the
server (or a worker) with SIGABRT, naming nothing, and two scheme types hung until
the launcher's timeout."""
import os
import re
import subprocess
import sys
import time

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs', 'mismatch_job.py')
TIMEOUT = 300          # the launcher's (a hang is a failure): a loaded 2-core machine
                       # took 160 s for a job that fails at its first key
BASE = '{"size_threshold": 100}'   # the test's tensors (64 to 2560 values) compressed


def launch(env, *args):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, '-m', 'kvstore_ext.launch', '-n', '2', '-s', '1',
                           '--timeout', str(TIMEOUT), sys.executable, JOB, '--params', BASE]
                          + list(args),
                          env=env, capture_output=True, text=True, timeout=TIMEOUT + 60)
    return proc, time.monotonic() - start


def errors_by_rank(output):
    """{rank: the ConfigurationMismatchError message that worker printed}."""
    return {int(rank): message for rank, message in re.findall(
        r'^\[rank (\d)\] kvstore_ext\.fingerprint\.ConfigurationMismatchError: (.*)$',
        output, re.M)}


def assert_every_worker_raised(proc, seconds, key):
    output = proc.stdout + proc.stderr
    tail = proc.stdout[-2000:] + proc.stderr[-4000:]
    # 124: the launcher's timeout (a hang); the machine's load sets the rest of the time
    assert proc.returncode not in (0, 124), 'after %.0f s: %s' % (seconds, tail)
    assert 'SIGABRT' not in output and 'operands shape mismatch' not in output \
        and 'Check failed' not in output, tail
    assert re.search(r'worker \d \(kv\.rank \d\) exited with code 1; stopping all nodes',
                     proc.stderr), tail
    assert ' key %s ' % key not in proc.stdout, tail    # the key never took a step
    errors = errors_by_rank(output)
    assert sorted(errors) == [0, 1], tail
    assert errors[0] == errors[1], errors           # the same message on every worker
    return errors[0]


@pytest.mark.parametrize('declare', ['broadcast', 'pushpull'])
def test_rank0_fc_scale_differs(job_env, declare):
    """The case that trained on silently (the dense layer's replicas drifted apart)."""
    proc, seconds = launch(job_env, '--rank0-params', '{"fc_scale": 4.0}',
                           '--declare', declare)
    message = assert_every_worker_raised(proc, seconds, 'bias')
    assert "key 'bias'" in message         # the first key: parameters are per store
    assert 'parameter fc_scale: rank 0 has 4.0; rank 1 has 2.0' in message, message


def test_rank0_size_threshold_differs(job_env):
    proc, seconds = launch(job_env, '--rank0-params', '{"size_threshold": 10}',
                           '--declare', 'pushpull')
    message = assert_every_worker_raised(proc, seconds, 'bias')
    assert 'parameter size_threshold: rank 0 has 10; rank 1 has 100' in message, message


def test_rank0_aggregation_differs(job_env):
    """Declared by ``init`` (Module's way), found there already."""
    proc, seconds = launch(job_env, '--rank0-params', '{"aggregation": "server"}',
                           '--declare', 'init')
    message = assert_every_worker_raised(proc, seconds, 'bias')
    assert "parameter aggregation: rank 0 has 'server'; rank 1 has 'homomorphic'" \
        in message, message
    assert 'fc_scale' not in message       # only what differs is named


def test_a_parameter_set_after_broadcast_differs(job_env):
    """Keys broadcast with equal parameters, then rank 0 changes one before the first
    step: the first step compares again (planning.agree_due), not only the broadcasts."""
    proc, seconds = launch(job_env, '--rank0-params-after-declare', '{"fc_scale": 4.0}',
                           '--declare', 'broadcast')
    message = assert_every_worker_raised(proc, seconds, 'bias')
    assert 'parameter fc_scale: rank 0 has 4.0; rank 1 has 2.0' in message, message


@pytest.mark.parametrize('declare', ['broadcast', 'pushpull'])
def test_a_key_whose_shape_differs(job_env, declare):
    """Broadcast (Gluon's way) used to abort a worker in ps-lite, pushpull the server."""
    proc, seconds = launch(job_env, '--rank0-fc-rows', '65', '--declare', declare)
    message = assert_every_worker_raised(proc, seconds, 'fc')
    assert "key 'fc'" in message and 'shape: rank 0 has (65, 40); rank 1 has (64, 40)' \
        in message, message
    assert 'parameter' not in message


def test_different_scheme_types(job_env):
    """dist_sync_topk on one worker, dist_sync_hylo on the other: used to hang."""
    proc, seconds = launch(job_env, '--worker0-kvstore', 'dist_sync_topk',
                           '--kvstore', 'dist_sync_hylo', '--params', '{}')
    message = assert_every_worker_raised(proc, seconds, 'bias')
    assert 'different kvstore types' in message, message
    # ps-lite ranks workers in the order they connect, not by launch index
    assert re.search(r'rank (\d) has dist_sync_(topk|hylo); rank (?!\1)\d has '
                     r'dist_sync_(?!\2)(topk|hylo)', message), message
