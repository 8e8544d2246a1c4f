"""kvstore_ext's dist_sync_2bit against MXNet's own 2-bit compression, distributed: two
real ps-lite jobs (2 workers, 1 server, 2 devices a worker) push the same gradients for
several steps, one through MXNet's ``dist_sync`` with
``set_gradient_compression({'type': '2bit', 'threshold': t})`` (push then pull), one
through ``dist_sync_2bit`` (pushpull). Every pulled sum must be equal, bit for bit, and
equal the NumPy reference (each worker: acc = device sum + residual; +-t where
|acc| >= t, the rest kept; the server sums)."""
import os
import sys

import numpy as np
import pytest

from kvx_ref import codecs as ref

from test_dist_aggregate import launch

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'dist_jobs', 'twobit_job.py')
sys.path.insert(0, os.path.dirname(JOB))
import twobit_job as job  # noqa: E402

WORKERS, STEPS = 2, 6


def run(tmp_path, env, kvstore, threshold):
    out = tmp_path / kvstore
    out.mkdir()
    launch(out, env, WORKERS, 1, [JOB, '--kvstore', kvstore, '--threshold', str(threshold),
                                  '--steps', str(STEPS), '--out', str(out)])
    return [dict(np.load(str(out / ('rank%d.npz' % w)))) for w in range(WORKERS)]


def reference(threshold):
    """{(key, step): the summed, dequantised pushes} by the NumPy 2-bit model, and how
    many elements were sent only thanks to the residual (|device sum| < t)."""
    want, carried = {}, 0
    for key, shape in job.SHAPES.items():
        residuals = [np.zeros(shape, np.float32) for _ in range(WORKERS)]
        for step in range(STEPS):
            total = np.zeros(shape, np.float32)
            for w in range(WORKERS):
                grad = job.gradient(w, step, key, 0) + job.gradient(w, step, key, 1)
                words, residuals[w] = ref.twobit_encode(grad, residuals[w], threshold)
                decoded = ref.twobit_decode(words, threshold, grad.size).reshape(shape)
                carried += np.count_nonzero(decoded[np.abs(grad) < threshold])
                total += decoded
            want[key, step] = total
    return want, carried


@pytest.mark.parametrize('threshold', [0.5])
def test_2bit_matches_mxnet_builtin(tmp_path, job_env, threshold):
    mxnet_runs = run(tmp_path, job_env, 'mxnet', threshold)
    ext_runs = run(tmp_path, job_env, 'ext', threshold)
    want, carried = reference(threshold)
    for (key, step), expect in want.items():
        name = 'out/%s/%d' % (key, step)
        for label, runs in (('mxnet', mxnet_runs), ('dist_sync_2bit', ext_runs)):
            for r in runs:
                assert np.array_equal(r[name], expect), (label, key, step)
    # the residuals matter: many elements are sent only after steps of accumulation
    assert carried > 1000
