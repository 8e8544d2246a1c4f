"""Shared test setup: the NumPy reference (python/kvx_ref) on sys.path, and the
``job_env`` fixture that every multi-process test runs its launcher with.

Nodes are recognised by DMLC_ROLE plus a per-test tag in their environment, so that
ps-lite jobs of anyone else on the same machine are never touched.
"""
import os
import signal
import sys
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'python'))
sys.path.insert(0, os.path.join(REPO, 'tests', 'dist_jobs'))
from job_util import pids_with  # noqa: E402

TAG_VAR = 'KVSTORE_EXT_LAUNCH_TEST_TAG'   # KVSTORE_EXT_* is forwarded over ssh too
SETTLE = 3.0                              # PDEATHSIG / ssh watchdogs act asynchronously


def tagged_nodes(tag):
    """pids of live processes whose environment has DMLC_ROLE and our tag."""
    return pids_with(('%s=%s' % (TAG_VAR, tag)).encode(), b'DMLC_ROLE=')


def wait_no_nodes(tag, seconds):
    """Leftover pids after waiting up to ``seconds`` for them to go."""
    deadline = time.monotonic() + seconds
    while True:
        left = tagged_nodes(tag)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def job_env():
    """Environment for a launcher run; fails the test if any of its nodes outlives it."""
    tag = uuid.uuid4().hex
    env = dict(os.environ)
    env.pop('PORT', None)
    env.pop('DMLC_ROLE', None)
    env[TAG_VAR] = tag
    env['PYTHONUNBUFFERED'] = '1'
    yield env
    left = wait_no_nodes(tag, SETTLE)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, 'ps-lite nodes left behind (killed now): %s' % left
