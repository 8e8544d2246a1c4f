"""Unedited scripts get kvstore_ext's types (kvstore_ext_autoload.py), their jobs end,
and rank 0 says at exit what compression saved (kvstore_ext/shutdown.py).

The scripts here never import kvstore_ext: MXNet's own example scripts, vendored
unmodified in tests/mxnet_examples/ (Apache-2.0, see NOTICE there), and a user's Gluon
script of the same shape (tests/user_scripts/gluon_user.py). They run the way a user
runs them: ``python -m kvstore_ext.launch ... python script.py --kv-store TYPE``, with
the package installed (its .pth file puts the hook in every interpreter).
"""
import io
import os
import re
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
LAUNCH = os.path.join(REPO, 'kvstore_ext', 'launch.py')
IMAGENET_DIR = os.path.join(REPO, 'tests', 'mxnet_examples', 'image-classification')
GLUON_USER = os.path.join(REPO, 'tests', 'user_scripts', 'gluon_user.py')
JOB_TIMEOUT = 240
EXIT_WITHIN = 20.0      # seconds from a job's last worker line to the launcher's exit
SUMMARY = re.compile(r'\[kvstore_ext\] (dist_sync_\w+)(?: \(([^)]*)\))?, rank 0 of (\d+), '
                     r'(\d+) steps: pushed ([\d.]+) MB, pulled ([\d.]+) MB; float32 would '
                     r'push ([\d.]+) MB and pull ([\d.]+) MB')


def train_imagenet(kvstore):
    """MXNet's train_imagenet.py --benchmark 1 (synthetic data), small and short."""
    return [PY, 'train_imagenet.py', '--benchmark', '1', '--network', 'resnet',
            '--num-layers', '8', '--image-shape', '3,28,28', '--num-classes', '10',
            '--num-examples', '256', '--batch-size', '32', '--num-epochs', '1',
            '--disp-batches', '2', '--kv-store', kvstore]


def run_job(job_env, command, cwd=None, launcher=None):
    """Run a 2-worker, 1-server job; (code, stdout + stderr lines with their arrival
    times, seconds from the last worker line to the launcher's exit)."""
    import threading
    launcher = launcher or [PY, LAUNCH, '-n', '2', '-s', '1', '--timeout', '200', '--']
    start = time.monotonic()
    proc = subprocess.Popen(launcher + command, cwd=cwd, env=job_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, last = [], [start]

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip('\n'))
            if not line.startswith('[launch]'):
                last[0] = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=JOB_TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    end = time.monotonic()
    reader.join(5)
    return code, lines, end - last[0]


def summaries(lines):
    return [SUMMARY.search(line) for line in lines if SUMMARY.search(line)]


@pytest.mark.parametrize('kvstore', ['dist_sync_hylo', 'dist_sync_none'])
def test_mxnet_train_imagenet_unedited(job_env, kvstore):
    """MXNet's own Module script with --kv-store dist_sync_hylo: our store (one line at
    exit, on rank 0 only, with fewer bytes than float32 for Hylo), and the job ends
    within seconds of its last line."""
    code, lines, exit_s = run_job(job_env, train_imagenet(kvstore), cwd=IMAGENET_DIR)
    text = '\n'.join(lines)
    assert code == 0, text[-4000:]
    assert text.count('Train-accuracy') == 2, text[-4000:]
    found = summaries(lines)
    assert len(found) == 1, text[-4000:]            # rank 0 only, one store
    kind, mode, workers, steps, pushed, pulled, raw_push, raw_pull = found[0].groups()
    assert kind == kvstore and workers == '2' and steps == '4'
    assert float(raw_push) == float(raw_pull) > 0
    if kvstore == 'dist_sync_hylo':
        assert mode == 'aggregation=homomorphic'
        assert float(pushed) < float(raw_push) and float(pulled) < float(raw_pull)
    else:
        assert float(pushed) == float(raw_push)
    assert exit_s < EXIT_WITHIN, 'exited %.1f s after its last line' % exit_s


def test_users_gluon_script_unedited(job_env):
    """A Gluon script passing --kvstore to gluon.Trainer gets kvstore_ext's store."""
    code, lines, exit_s = run_job(job_env, [PY, GLUON_USER, '--kvstore', 'dist_sync_hylo'])
    text = '\n'.join(lines)
    assert code == 0, text[-4000:]
    made = re.findall(r'kvstore (\S+) \((\S+)\), rank (\d) of 2: loss ([\d.]+)', text)
    assert sorted(m[2] for m in made) == ['0', '1'], text[-4000:]
    assert {m[:2] for m in made} == {('dist_sync_hylo', 'kvstore_ext.registry')}
    assert made[0][3] == made[1][3]                 # same weights on both workers
    found = summaries(lines)
    assert len(found) == 1 and float(found[0].group(5)) < float(found[0].group(7))
    assert exit_s < EXIT_WITHIN, 'exited %.1f s after its last line' % exit_s


def test_users_gluon_script_under_mxnet_tools_launch(job_env):
    """The hook lives in the interpreter, not in our launcher: MXNet's tools/launch.py
    (with its Python 3.9 fix) runs the same unedited script with our store."""
    fix = [PY, '-c', 'import runpy; runpy.run_path(%r)["run_mxnet_tools_launch"]()' % LAUNCH,
           '-n', '2', '-s', '1', '--launcher', 'local']
    code, lines, _ = run_job(job_env, [PY, GLUON_USER, '--kvstore', 'dist_sync_hylo'],
                             launcher=fix)
    text = '\n'.join(lines)
    assert code == 0, text[-4000:]
    assert text.count('kvstore dist_sync_hylo (kvstore_ext.registry)') == 2, text[-4000:]
    assert len(summaries(lines)) == 1


def _python(code, env=None):
    return subprocess.run([PY, '-c', code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_names_mxnet_would_run_as_plain_dist_sync():
    """Without a launcher (rank 0 of 1): our type is ours, MXNet's own names stay
    MXNet's (kvstore_ext is then not even imported), and a misspelt one is refused
    instead of becoming dist_sync."""
    done = _python(
        'import sys, mxnet as mx\n'
        'for name in ("local", "dist_sync_device"):\n'
        '    try:\n'
        '        print(name, type(mx.kv.create(name)).__module__)\n'
        '    except Exception as e:\n'
        '        print(name, "error", e)\n'
        'print("imported", "kvstore_ext" in sys.modules)\n'
        'kv = mx.kv.create("dist_sync_hylo")\n'
        'print("dist_sync_hylo", type(kv).__module__, kv.type)\n'
        'try:\n'
        '    mx.kv.create("dist_sync_hyloo")\n'
        '    print("dist_sync_hyloo created")\n'
        'except ValueError as e:\n'
        '    print("refused:", e)\n')
    out = done.stdout
    assert 'local mxnet.kvstore.kvstore' in out, out + done.stderr[-2000:]
    assert 'imported False' in out
    assert 'dist_sync_hylo kvstore_ext.registry dist_sync_hylo' in out
    assert "refused: unknown kvstore type 'dist_sync_hyloo'" in out, out
    assert 'dist_sync_hyloo created' not in out


def test_hook_costs_nothing_and_stays_out_of_servers():
    """The interpreter-wide hook imports neither mxnet nor kvstore_ext, and servers
    and the scheduler (whose loop runs inside ``import mxnet``) get none at all."""
    probe = ('import sys; print("mxnet" in sys.modules, "kvstore_ext" in sys.modules, '
             'any(type(f).__name__ == "_Finder" for f in sys.meta_path))')
    assert _python(probe).stdout.split() == ['False', 'False', 'True']
    for role in ('server', 'scheduler'):
        assert _python(probe, {'DMLC_ROLE': role}).stdout.split() == \
            ['False', 'False', 'False']
    assert _python(probe, {'KVSTORE_EXT_AUTOLOAD': '0'}).stdout.split()[2] == 'False'


def test_summary_line_of_a_local_store():
    """One line per store that made a step, with the bytes comm_stats() counts."""
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    from kvstore_ext import shutdown
    kv = mx.kv.create('dist_sync_hylo')
    idle = mx.kv.create('dist_sync_topk')        # made no step: no line
    grad = mx.nd.array(__import__('numpy').random.RandomState(0).randn(256, 512))
    out = mx.nd.zeros(grad.shape)
    for _ in range(3):
        kv.pushpull(0, grad, out=out)
    stats = kv.comm_stats()
    line = shutdown.summary_line(kv)
    assert shutdown.summary_line(idle) is None
    match = SUMMARY.search(line)
    assert match, line
    assert match.group(1) == 'dist_sync_hylo' and match.group(4) == '3'
    assert float(match.group(5)) == round(stats['push_bytes'] / 1e6, 2)
    assert float(match.group(7)) == round(stats['raw_bytes'] / 1e6, 2) == \
        round(3 * 4 * 256 * 512 / 1e6, 2)
    buffer = io.StringIO()
    shutdown.at_exit(out=buffer)
    assert line in buffer.getvalue().splitlines()
