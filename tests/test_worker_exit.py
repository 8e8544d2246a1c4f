"""kvstore_ext/worker_exit.py: an uncaught exception ends a worker at once with exit
code 1 (a normal exit would hang in ps-lite's shutdown barrier), and the training
scripts use this one hook rather than a copy of their own.

The module is loaded by path, as the children here do, so that these tests do not
import mxnet."""
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(REPO, 'kvstore_ext', 'worker_exit.py')

CHILD = '''
import atexit, importlib.util, sys
spec = importlib.util.spec_from_file_location('worker_exit', %r)
worker_exit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker_exit)
atexit.register(lambda: print('atexit ran', flush=True))   # a normal exit would run it
for _ in range(%d):
    worker_exit.exit_on_uncaught_exception()
print('buffered line', end='')                               # flushed before the exit
raise RuntimeError('boom')
'''


def run_child(installs):
    return subprocess.run([sys.executable, '-c', CHILD % (MODULE, installs)],
                          capture_output=True, text=True, timeout=60)


def test_uncaught_exception_exits_at_once_with_code_1():
    proc = run_child(1)
    assert proc.returncode == 1, proc.stderr
    assert 'atexit ran' not in proc.stdout          # os._exit: no interpreter shutdown
    assert proc.stdout == 'buffered line'
    assert proc.stderr.count('RuntimeError: boom') == 1, proc.stderr


def test_installing_twice_keeps_one_hook():
    proc = run_child(3)
    assert proc.returncode == 1
    assert proc.stderr.count('Traceback') == 1, proc.stderr


def test_without_the_hook_the_exit_is_normal():
    """The control: the same child without the hook runs its atexit handlers."""
    proc = run_child(0)
    assert proc.returncode == 1 and 'atexit ran' in proc.stdout


def test_scripts_have_no_copy_of_the_hook():
    """One hook for the transport and the scripts: no excepthook in gluon_scripts/."""
    found = []
    for root, _, files in os.walk(os.path.join(REPO, 'gluon_scripts')):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(root, name)
                with open(path) as f:
                    if re.search(r'excepthook|os\._exit', f.read()):
                        found.append(os.path.relpath(path, REPO))
    assert found == []
