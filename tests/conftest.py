"""Shared test setup: the NumPy reference (python/kvx_ref) on sys.path, the
``job_env`` fixture that every multi-process test runs its launcher with, and a check
that no test leaves a scheme, kvstore type or codec registered behind it.

Nodes are recognised by DMLC_ROLE plus a per-test tag in their environment, so that
ps-lite jobs of anyone else on the same machine are never touched.
"""
import logging
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


LOG_LEVEL_AT_START = logging.getLogger('kvstore_ext').level


@pytest.fixture(autouse=True)
def log_level_left_as_found():
    """The package logger's level is global: a bench script's main run in-process that
    quiets it hides the warnings later tests read from caplog."""
    yield
    assert logging.getLogger('kvstore_ext').level == LOG_LEVEL_AT_START, \
        "the 'kvstore_ext' logger's level was left changed by this test or its fixtures"


def _registries():
    """The global registries a test may add to, as far as they are imported yet."""
    found = {}
    if 'kvstore_ext' in sys.modules:
        from kvstore_ext import codec_list, registry
        found['scheme'] = set(registry.SCHEMES)
        found['codec id'] = set(codec_list.CODECS)
    if 'mxnet' in sys.modules:
        from mxnet.kvstore import KVStoreBase
        found['kvstore type'] = set(KVStoreBase.kv_registry)
    return found


@pytest.fixture(autouse=True)
def registries_left_as_found():
    """A test that registers a scheme, a kvstore type or a codec removes it after itself
    (a fixture): the registries are global, and what one test leaves there shows in the
    lists of every later test (test_cost_model.py and test_params_doc.py fail on it)."""
    before = _registries()
    yield
    after = _registries()
    if set(after) != set(before):
        return          # the test imported kvstore_ext (registering its types) or MXNet
    left = ['%s %r' % (kind, name) for kind in sorted(after)
            for name in sorted(after[kind] - before[kind], key=repr)]
    assert not left, 'left registered by this test: %s' % ', '.join(left)
