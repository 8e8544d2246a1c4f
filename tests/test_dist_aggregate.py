"""Real ps-lite jobs (scheduler, servers, workers on loopback): what every worker pulls
equals the NumPy reference's 'decode each worker's payload, sum', over several rounds,
residuals included, in both aggregation modes, for 2 and 4 workers (Hylo's server mode
also 8) and 1 and 2 servers.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kvx_ref import codecs as ref
from kvstore_ext import chunking
from kvstore_ext.codecs import (FP32Codec, FilterTopKCodec, TernaryCodec,
                                AdditiveTernaryCodec, AdditiveTopKCodec, AdaCompCodec,
                                ElementTopKCodec)
from kvstore_ext.schemes import AdaComp, Hylo, NoCompression, TopK

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
    """What the workers' agreement sums to: abs-sums and maxima (FC) or filter scores
    (conv)."""
    if isinstance(codec, AdditiveTernaryCodec):     # [sum|acc|, sum of the maxima]
        return np.array([sum(np.abs(a.astype(np.float64)).sum() for a in accs),
                         sum(float(ref.acc_abs_max(a)) for a in accs)])
    return sum(ref.filter_scores(a) for a in accs)


def encode(codec, grad, residual, scale=None):
    """(payload, new residual, status) of a server-decoded codec, by the reference."""
    if isinstance(codec, FilterTopKCodec):
        return ref.topk_encode(grad, residual, codec.k)
    if isinstance(codec, AdaCompCodec):
        return ref.adacomp_encode(grad, residual, codec.bin, codec.capacity)
    if isinstance(codec, ElementTopKCodec):
        return ref.element_topk_encode(grad, residual, codec.k)
    return ref.ternary_encode(grad, residual, codec.scale if scale is None else scale,
                              codec.threshold, value=codec.value)


def decode(codec, payload):
    if isinstance(codec, FilterTopKCodec):
        return ref.topk_decode(payload, codec.size)
    if isinstance(codec, AdaCompCodec):      # the slot's padding is not the payload's
        return ref.adacomp_decode(payload[:8 + int(payload[7])], codec.size)
    if isinstance(codec, ElementTopKCodec):
        return ref.element_topk_decode(payload, codec.size)
    return ref.ternary_decode(payload, codec.size)


def reference_chunk(codec, grads, residuals, agreed, carried, workers):
    """(expected float32 sum, exact?) for one chunk; updates ``residuals`` in place.

    ``agreed`` is what the workers recorded they encoded with; it must equal the
    statistic of this step's acc ('round') or ``carried`` from the previous step
    ('previous'; None at the first step, which runs a round). Returns also what
    this step carries to the next one: the agreement, or the server's residual of a
    compressed reply."""
    if isinstance(codec, FP32Codec):
        return sum(grads[1:], grads[0].copy()), False, None   # server adds in arrival order
    if isinstance(codec, (FilterTopKCodec, TernaryCodec, AdaCompCodec, ElementTopKCodec)):
        total = np.zeros(codec.size, np.float32)
        for w, g in enumerate(grads):                      # server decodes in rank order
            payload, new_res, status = encode(codec, g, residuals[w])
            decoded, ok = decode(codec, payload)
            assert status == ok == 0
            residuals[w][...] = new_res
            total += decoded
        if not codec.compressed_reply:
            return total.reshape(codec.shape), True, None
        # the server re-encodes the sum with its own residual (``carried``); the
        # parameters reach it as float32 words (the reply row)
        server_res = np.zeros(codec.shape, np.float32) if carried is None else carried
        payload, server_res, status = encode(codec, total.reshape(codec.shape), server_res,
                                             scale=float(np.float32(getattr(codec, 'scale', 0))))
        reply, ok = decode(codec, payload)
        assert status == ok == 0
        return reply.reshape(codec.shape), True, server_res
    accs = [g + r for g, r in zip(grads, residuals)]
    expected = agreement_statistic(codec, accs) if carried is None else carried
    np.testing.assert_allclose(agreed, expected, rtol=1e-4)
    if isinstance(codec, AdditiveTernaryCodec):
        t, v = ref.agreed_ternary(agreed, codec.scale, codec.value, workers, codec.size)
        words = np.zeros(codec.sum_words(workers), np.float32)
        for w, g in enumerate(grads):
            payload, new_res, status = ref.ternary_encode_sum(g, residuals[w], t, workers,
                                                              value=float(v))
            assert status == 0
            residuals[w][...] = new_res
            words += payload
        expect = ref.ternary_decode_sum(words, v, workers, codec.size)[0].reshape(codec.shape)
        exact = True
    else:
        assert isinstance(codec, AdditiveTopKCodec)
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
    if codec.carries:     # the prediction of the next step's acc
        carry = agreement_statistic(codec, [g + r for g, r in zip(grads, residuals)])
    return expect, exact, carry


# mode: (kvstore, scheme, parameters)
MODES = {'server': ('dist_sync_hylo', Hylo, dict(PARAMS, aggregation='server')),
         'server-compressed': ('dist_sync_hylo', Hylo,
                               dict(PARAMS, aggregation='server', pull='compressed')),
         'homomorphic': ('dist_sync_hylo', Hylo, dict(PARAMS, aggregation='homomorphic',
                                                      agreement='previous')),
         # the conv filter set from a round below 8 workers too
         'homomorphic-conv-round': ('dist_sync_hylo', Hylo,
                                    dict(PARAMS, aggregation='homomorphic',
                                         agreement='conv_round')),
         # the default agreement: at 8 workers the conv filter set comes from a round
         'homomorphic-auto': ('dist_sync_hylo', Hylo, dict(PARAMS, aggregation='homomorphic')),
         # float32 through MXNet's own pushpull, chunk by chunk on views of the arrays
         'none': ('dist_sync_none', NoCompression, {'chunk_size': 1024}),
         # codecs change at steps 2 and 4 (aggregate_job.replanning_scheme)
         'replan': ('dist_sync_test_replan', job.replanning_scheme(), PARAMS),
         # small bins and a tight slot, so that chunks overflow their capacity
         'adacomp': ('dist_sync_adacomp', AdaComp, {'size_threshold': 100, 'chunk_size': 1024,
                                                    'bin_conv': 9, 'bin_fc': 40,
                                                    'max_per_bin': 1.5}),
         # each chunk (at most 1024 elements) sends ceil(0.03 * its size); 'bias' goes float32
         'topk': ('dist_sync_topk', TopK, {'size_threshold': 100, 'chunk_size': 1024,
                                           'ratio': 0.03})}
STEPS_OF = {'replan': 6}


@pytest.mark.parametrize('mode, workers, servers', [
    (mode, w, s) for mode in ('server', 'server-compressed', 'homomorphic')
    for w, s in ((2, 1), (2, 2), (4, 1), (4, 2))
] + [('homomorphic-conv-round', 2, 2), ('homomorphic-conv-round', 4, 1), ('none', 2, 2),
       ('server', 8, 2),
       ('homomorphic-auto', 8, 2), ('homomorphic-auto', 2, 1),
       ('replan', 2, 2), ('replan', 4, 1), ('adacomp', 2, 2), ('adacomp', 4, 1),
       ('topk', 2, 2), ('topk', 4, 1)])
def test_aggregate_matches_reference(tmp_path, job_env, workers, servers, mode):
    kvstore, scheme_class, params = MODES[mode]
    steps = STEPS_OF.get(mode, STEPS)
    launch(tmp_path, job_env, workers, servers, [JOB, '--kvstore', kvstore,
                                                 '--params', json.dumps(params),
                                                 '--steps', str(steps), '--out', str(tmp_path)])
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    infos = [json.load(open(str(tmp_path / ('rank%d.json' % w)))) for w in range(workers)]
    assert sorted(i['rank'] for i in infos) == list(range(workers))
    assert all(i['num_workers'] == workers for i in infos)
    for run in runs:                      # broadcast: everyone holds rank 0's value
        assert np.array_equal(run['broadcast'], np.ones((3, 4), np.float32))

    scheme = scheme_class(**params)
    scheme.num_workers = workers          # as the store does before it plans
    for key, shape in job.SHAPES.items():
        codec = None
        residuals = [np.zeros(shape, np.float32) for _ in range(workers)]
        for step in range(steps):
            outs = [run['out/%s/%d' % (key, step)] for run in runs]
            for out in outs[1:]:
                assert np.array_equal(out, outs[0]), 'workers pulled different sums'
            grads = worker_gradients(workers, step, key)
            planned = scheme.codec_for(shape, np.float32, step=step)
            if codec is None or not planned.same_as(codec):     # (re-)plan, as the store
                if codec is None or planned.kind() != codec.kind():
                    # another kind: the old codec's residual goes with this step, the
                    # new codec starts afresh (Codec.owed)
                    grads = [g + r for g, r in zip(grads, residuals)]
                    residuals = [np.zeros(shape, np.float32) for _ in range(workers)]
                    carried = None
                codec = planned
                chunks = chunking.split(codec, params['chunk_size'])
                carried = carried or [None] * len(chunks)
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
    if mode == 'homomorphic-auto':       # the conv key's agreement follows the workers
        agreement = 'round' if workers >= 8 else 'previous'
        assert infos[0]['plans']['0']['conv'].endswith('agreed (%s))' % agreement), infos
    if mode == 'replan':
        plans = [infos[0]['plans'][str(s)] for s in range(steps)]    # the store re-planned
        assert plans[0] == plans[1] != plans[2] == plans[3] != plans[4] == plans[5], plans
    stats = infos[0]['stats']
    assert stats['steps'] == steps and stats['raw_bytes'] > 0
    if mode == 'none':
        assert stats['push_bytes'] == stats['pull_bytes'] == stats['raw_bytes']
    else:
        assert stats['push_bytes'] < stats['raw_bytes'] / 3
    if mode in ('server-compressed', 'homomorphic'):
        assert stats['pull_bytes'] < stats['raw_bytes'] / 3


@pytest.mark.parametrize('aggregation, workers, servers', [
    ('server', 2, 2), ('server', 4, 1), ('homomorphic', 2, 1), ('fc', 2, 2),
    ('topk', 2, 2), ('adacomp', 2, 2), ('adacomp', 4, 1)])
def test_momentum_correction_matches_reference(tmp_path, job_env, aggregation, workers,
                                               servers):
    """``momentum`` (DGC's correction, codecs/momentum.py) in a real job: every worker's
    sum equals the NumPy spec's (kvx_ref/momentum.py, every worker's velocity and
    residual), step after step: Hylo's conv top-k in both modes (homomorphic with
    agreement 'round': the agreed filters are the top-k of the summed scores),
    dist_sync_topk's element top-k and dist_sync_adacomp (a slot partly used: bins of
    100, up to 30 a bin)."""
    from kvx_ref.momentum import (momentum_adacomp_step, momentum_element_topk_step,
                                  momentum_ternary_step, momentum_topk_step)
    kvstore, key = {'topk': ('dist_sync_topk', 'fc'),
                    'adacomp': ('dist_sync_adacomp', 'fc'),
                    'fc': ('dist_sync_hylo', 'fc')}.get(
                        aggregation, ('dist_sync_hylo', 'conv'))
    if aggregation == 'topk':
        params = {'size_threshold': 100, 'ratio': 0.03, 'momentum': 0.9}
        k = TopK(**params).codec_for(job.SHAPES[key], np.float32).k
    elif aggregation == 'adacomp':
        params = {'size_threshold': 100, 'bin_fc': 100, 'max_per_bin': 30, 'momentum': 0.9}
        codec = AdaComp(**params).codec_for(job.SHAPES[key], np.float32)
    elif aggregation == 'fc':
        params = dict(PARAMS, momentum=0.9, fc_momentum_correction='on',
                      chunk_size=1 << 20, aggregation='server')
    else:
        params = dict(PARAMS, momentum=0.9, momentum_correction='on', chunk_size=1 << 20,
                      aggregation=aggregation)
        if aggregation == 'homomorphic':
            params['agreement'] = 'conv_round'
        k = Hylo(**params).conv_k(job.SHAPES[key])
    launch(tmp_path, job_env, workers, servers, [JOB, '--kvstore', kvstore,
                                                 '--params', json.dumps(params),
                                                 '--steps', str(STEPS), '--out', str(tmp_path)])
    runs = [dict(np.load(str(tmp_path / ('rank%d.npz' % w)))) for w in range(workers)]
    residuals, velocities, delivered = [None] * workers, [None] * workers, None
    for step in range(STEPS):
        outs = [run['out/%s/%d' % (key, step)] for run in runs]
        grads = worker_gradients(workers, step, key)
        if aggregation == 'topk':
            want, delivered, residuals, velocities = momentum_element_topk_step(
                [g.reshape(-1) for g in grads], residuals, velocities, delivered, k, 0.9)
            want = want.reshape(grads[0].shape)
        elif aggregation == 'adacomp':
            want, delivered, residuals, velocities = momentum_adacomp_step(
                [g.reshape(-1) for g in grads], residuals, velocities, delivered, codec.bin,
                codec.capacity, 0.9)
            want = want.reshape(grads[0].shape)
        elif aggregation == 'fc':
            want, delivered, residuals, velocities = momentum_ternary_step(
                [g.reshape(-1) for g in grads], residuals, velocities, delivered,
                PARAMS['fc_scale'], 0.9)
            want = want.reshape(grads[0].shape)
        elif aggregation == 'server':
            want, delivered, residuals, velocities = momentum_topk_step(
                grads, residuals, velocities, delivered, k, 0.9)
        else:
            want, delivered, residuals, velocities = homomorphic_momentum_step(
                grads, residuals, velocities, delivered, k, 0.9)
        for out in outs:
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(),
                                       err_msg='step %d' % step)
        if aggregation in ('adacomp', 'fc'):   # each worker's own residual, as the spec's
            for w, run in enumerate(runs):
                got = run['res/%s/%d' % (key, step)].reshape(-1)
                np.testing.assert_allclose(got, residuals[w].reshape(-1), rtol=1e-5,
                                           atol=1e-5 * np.abs(residuals[w]).max(),
                                           err_msg='step %d rank %d' % (step, w))


def homomorphic_momentum_step(grads, residuals, velocities, delivered, k, m):
    """The spec's step with the filter set agreed from the summed scores of every
    worker's velocity + residual (homomorphic, agreement 'round')."""
    shape = grads[0].shape
    us = [g.copy() if v is None else (np.float32(m) * v + g).astype(np.float32)
          for g, v in zip(grads, velocities)]
    rs = [np.zeros(shape, np.float32) if r is None else r for r in residuals]
    idx = ref.topk_select(sum(ref.filter_scores(u + r) for u, r in zip(us, rs)), k)
    total = np.zeros(shape, np.float32)
    new_rs, new_us = [], []
    for u, r in zip(us, rs):
        acc = (u + r).reshape(shape[0], -1)
        total.reshape(shape[0], -1)[idx] += acc[idx]
        kept = acc.copy()
        kept[idx] = 0
        new_rs.append(kept.reshape(shape))
        masked = u.reshape(shape[0], -1).copy()
        masked[idx] = 0
        new_us.append(masked.reshape(shape))
    returned = total if delivered is None else (total - np.float32(m) * delivered)
    return returned, total, new_rs, new_us
