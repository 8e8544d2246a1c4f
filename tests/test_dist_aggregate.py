"""Real ps-lite jobs (scheduler, servers, workers on loopback): what every worker pulls
equals the NumPy reference's 'decode each worker's payload, sum', over several rounds,
residuals included, in both aggregation modes, for 2 and 4 workers and 1 and 2 servers.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kvx_ref import codecs as ref
from kvstore_ext import chunking
from kvstore_ext.codecs import (FP32Codec, FilterTopKCodec, TernaryCodec, HomTernaryCodec,
                                HomTopKCodec)
from kvstore_ext.schemes import Hylo, NoCompression

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'dist_jobs', 'aggregate_job.py')
sys.path.insert(0, os.path.dirname(JOB))
import aggregate_job as job  # noqa: E402

STEPS = 4
PARAMS = {'size_threshold': 100, 'conv_rate': 0.25, 'chunk_size': 1024, 'fc_scale': 1.2}


def launch(tmp_path, env, workers, servers, job_args, timeout=150):
    """Run a job under our launcher; return its completed process (asserts exit 0)."""
    cmd = [sys.executable, '-m', 'kvstore_ext.launch', '-n', str(workers), '-s', str(servers),
           '--timeout', str(timeout - 20), sys.executable] + job_args
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def worker_gradients(workers, step, key):
    """Each worker's device sum, in float32 as the store forms it (device 0 + device 1)."""
    return [job.gradient(w, step, key, 0) + job.gradient(w, step, key, 1)
            for w in range(workers)]


def agreement_statistic(codec, accs):
    """What the workers' agreement sums to: abs-sums (FC) or filter scores (conv)."""
    if isinstance(codec, HomTernaryCodec):
        return np.array([sum(np.abs(a.astype(np.float64)).sum() for a in accs)])
    return sum(ref.filter_scores(a) for a in accs)


def reference_chunk(codec, grads, residuals, agreed, carried, workers):
    """(expected float32 sum, exact?) for one chunk; updates ``residuals`` in place.

    ``agreed`` is what the workers recorded they encoded with; it must equal the
    statistic of this step's acc ('round') or ``carried`` from the previous step
    ('previous'; None at the first step, which runs a round). Returns also what
    this step carries to the next one."""
    if isinstance(codec, FP32Codec):
        return sum(grads[1:], grads[0].copy()), False, None   # server adds in arrival order
    if isinstance(codec, (FilterTopKCodec, TernaryCodec)):
        total = np.zeros(codec.size, np.float32)
        for w, g in enumerate(grads):                      # server decodes in rank order
            if isinstance(codec, FilterTopKCodec):
                payload, new_res, status = ref.topk_encode(g, residuals[w], codec.k)
                decoded, ok = ref.topk_decode(payload, codec.size)
            else:
                payload, new_res, status = ref.ternary_encode(g, residuals[w], codec.scale,
                                                              codec.threshold)
                decoded, ok = ref.ternary_decode(payload, codec.size)
            assert status == ok == 0
            residuals[w][...] = new_res
            total += decoded
        return total.reshape(codec.shape), True, None
    accs = [g + r for g, r in zip(grads, residuals)]
    expected = agreement_statistic(codec, accs) if carried is None else carried
    np.testing.assert_allclose(agreed, expected, rtol=1e-4)
    if isinstance(codec, HomTernaryCodec):
        t = np.float32(codec.scale * float(agreed[0]) / (workers * codec.size))
        words = np.zeros(codec.sum_words(workers), np.float32)
        for w, g in enumerate(grads):
            payload, new_res, status = ref.ternary_encode_sum(g, residuals[w], t, workers)
            assert status == 0
            residuals[w][...] = new_res
            words += payload
        expect = ref.ternary_decode_sum(words, t, workers, codec.size)[0].reshape(codec.shape)
        exact = True
    else:
        assert isinstance(codec, HomTopKCodec)
        idx = ref.topk_select(agreed.astype(np.float64), codec.k)
        assert np.array_equal(idx, ref.topk_select(expected, codec.k))
        values = np.zeros(codec.k * codec.filter_size, np.float32)
        for w, g in enumerate(grads):
            sent, new_res, status = ref.topk_gather(g, residuals[w], idx)
            assert status == 0
            residuals[w][...] = new_res
            values += sent
        expect, exact = ref.topk_scatter(values, idx, codec.shape)[0], False
    carry = None
    if codec.agreement_mode == 'previous':     # the prediction of the next step's acc
        carry = agreement_statistic(codec, [g + r for g, r in zip(grads, residuals)])
    return expect, exact, carry


# mode: (kvstore, scheme, parameters)
MODES = {'server': ('dist_sync_hylo', Hylo, dict(PARAMS, aggregation='server')),
         'homomorphic': ('dist_sync_hylo', Hylo, dict(PARAMS, aggregation='homomorphic',
                                                      agreement='previous')),
         'homomorphic-round': ('dist_sync_hylo', Hylo, dict(PARAMS, aggregation='homomorphic',
                                                            agreement='round')),
         # float32 through MXNet's own pushpull, chunk by chunk on views of the arrays
         'none': ('dist_sync_none', NoCompression, {'chunk_size': 1024})}


@pytest.mark.parametrize('mode, workers, servers', [
    (mode, w, s) for mode in ('server', 'homomorphic') for w, s in ((2, 1), (2, 2), (4, 1), (4, 2))
] + [('homomorphic-round', 2, 2), ('homomorphic-round', 4, 1), ('none', 2, 2)])
def test_aggregate_matches_reference(tmp_path, job_env, workers, servers, mode):
    kvstore, scheme_class, params = MODES[mode]
    launch(tmp_path, job_env, workers, servers, [JOB, '--kvstore', kvstore,
                                                 '--params', json.dumps(params),
                                        '--steps', str(STEPS), '--out', str(tmp_path)])
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    assert sorted(i['rank'] for i in infos) == list(range(workers))
    assert all(i['num_workers'] == workers for i in infos)
    for run in runs:                      # broadcast: everyone holds rank 0's value
        assert np.array_equal(run['broadcast'], np.ones((3, 4), np.float32))

    scheme = scheme_class(**params)
    for key, shape in job.SHAPES.items():
        codec = scheme.codec_for(shape, np.float32)
        chunks = chunking.split(codec, params['chunk_size'])
        residuals = [np.zeros(shape, np.float32) for _ in range(workers)]
        carried = [None] * len(chunks)
        for step in range(STEPS):
            outs = [run['out/%s/%d' % (key, step)] for run in runs]
            for out in outs[1:]:
                assert np.array_equal(out, outs[0]), 'workers pulled different sums'
            grads = worker_gradients(workers, step, key)
            for i, chunk in enumerate(chunks):
                agreed = runs[0].get('agreed/%s/%d/%d' % (key, step, i))
                expect, exact, carried[i] = reference_chunk(
                    chunk.codec, [chunk.view(g) for g in grads],
                    [chunk.view(r) for r in residuals], agreed, carried[i], workers)
                got = chunk.view(outs[0])
                if exact:
                    assert np.array_equal(got, expect), (key, step, i, chunk.codec)
                else:
                    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
            if codec.uses_residual:
                for w, run in enumerate(runs):
                    assert np.array_equal(run['res/%s/%d' % (key, step)], residuals[w]), \
                        (key, step, w)
    stats = infos[0]['stats']
    assert stats['steps'] == STEPS and stats['raw_bytes'] > 0
    if mode == 'none':
        assert stats['push_bytes'] == stats['pull_bytes'] == stats['raw_bytes']
    else:
        assert stats['push_bytes'] < stats['raw_bytes'] / 3
