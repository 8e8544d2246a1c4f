"""The walk of docs/ADDING_A_SCHEME.md, done: a server-decoded codec and its scheme
defined outside kvstore_ext (tests/toy_codec/sign_scale.py, 'sign + scale', NumPy only)
run through a real 2-worker, 2-server job, and every worker pulls what the NumPy
reference below says, bit for bit. The codec is named nowhere in kvstore_ext/, cpp/ or
python/ (the shared files), and the plugin's C++ table does not know its id: the
servers found it in the codec list (kvstore_ext/codec_list.py), imported its module
and decoded it in NumPy (kvstore_ext/py_decode.py).

Why a package on PYTHONPATH and not a class in this file: the servers must import the
codec's module to decode it, and importing a test file there would drag pytest in.
"""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, 'dist_jobs', 'codec_walk_job.py')
sys.path.insert(0, os.path.dirname(JOB))
import codec_walk_job as job  # noqa: E402

STEPS = 4
WORKERS = 2
SIGN_SCALE = 101


def reference(workers, steps):
    """{(key, step): the float32 sum every worker pulls}: each worker sends
    sign(acc) and mean|acc| of acc = grad + residual, keeps acc - scale * sign(acc);
    the servers add scale * sign(acc) worker by worker."""
    out = {}
    for key, shape in job.SHAPES.items():
        residual = [np.zeros(int(np.prod(shape)), np.float32) for _ in range(workers)]
        for step in range(steps):
            total = np.zeros(int(np.prod(shape)), np.float32)
            for w in range(workers):
                acc = job.gradient(w, step, key).reshape(-1) + residual[w]
                scale = np.float32(np.abs(acc).mean(dtype=np.float32))
                signs = np.sign(acc).astype(np.float32)
                residual[w] = acc - scale * signs
                total += scale * signs
            out[key, step] = total.reshape(shape)
    return out


def test_outside_codec_runs_in_a_real_job(tmp_path, job_env):
    env = dict(job_env)
    env['PYTHONPATH'] = os.pathsep.join(p for p in [HERE, env.get('PYTHONPATH')] if p)
    cmd = [sys.executable, '-m', 'kvstore_ext.launch', '-n', str(WORKERS), '-s', '2',
           '--timeout', '130', sys.executable, JOB, '--kvstore', 'dist_sync_sign_scale',
           '--module', 'toy_codec.sign_scale', '--steps', str(STEPS),
           '--out', str(tmp_path)]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    expected = reference(WORKERS, STEPS)
    for rank in range(WORKERS):
        got = np.load(os.path.join(str(tmp_path), 'rank%d.npz' % rank))
        for (key, step), want in expected.items():
            pulled = got['out/%s/%d' % (key, step)]
            assert np.array_equal(pulled, want), (rank, key, step, pulled, want)
    # not a float32 sum in disguise: the codec's sum differs from the gradients' sum
    plain = sum(job.gradient(w, 0, 'b') for w in range(WORKERS))
    assert not np.allclose(expected['b', 0], plain)


def test_no_shared_file_names_the_codec():
    """The codec lives in its own files: nothing in the package, the C++ plugin or the
    reference names it, and the plugin's codec table does not have its id."""
    import ctypes
    from kvstore_ext import _lib
    for folder in ('kvstore_ext', 'cpp', 'python'):
        for where, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(('.py', '.cc', '.h')):
                    with open(os.path.join(where, name), errors='replace') as f:
                        text = f.read()
                    assert 'sign_scale' not in text and 'SignScale' not in text, name
    lib = ctypes.CDLL(_lib.library_path())
    ids = [lib.kvx_codec_id(i) for i in range(lib.kvx_codec_count())]
    assert ids and SIGN_SCALE not in ids
