"""Shared test setup: the NumPy reference (python/kvx_ref) on sys.path, and a check
that no test leaves ps-lite nodes (processes with DMLC_ROLE) behind."""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'python'))


def dmlc_processes():
    """PIDs of live processes whose environment has DMLC_ROLE (ps-lite nodes)."""
    pids = []
    for name in os.listdir('/proc'):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % name, 'rb') as f:
                env = f.read().split(b'\0')
        except OSError:
            continue
        if any(v.startswith(b'DMLC_ROLE=') for v in env):
            pids.append(int(name))
    return pids


@pytest.fixture
def no_leftover_nodes():
    """Fail the test if it leaves ps-lite nodes running (and kill them)."""
    yield
    import signal
    import time
    left = dmlc_processes()
    deadline = time.time() + 5
    while left and time.time() < deadline:
        time.sleep(0.2)
        left = dmlc_processes()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, 'processes left behind: %s' % left
