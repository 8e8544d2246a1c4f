"""Error feedback delivers what it withholds, for every thresholded codec.

A thresholded codec sends part of ``acc = grad + residual`` and keeps the rest. That
is only error feedback if what is kept arrives later. Hylo's FC rule sent ``|acc| >=
fc_scale * mean|acc|``: with equal magnitudes (a constant or sign-only gradient, one
element) and ``fc_scale`` > 1 nothing passed, the threshold grew with the residual,
and every pulled sum was exactly 0 forever. The bound each codec now keeps, for one
worker pushing the same gradient g every step (r = K * g - what K steps delivered;
G = max|g|):

* Hylo FC (ternary, both aggregations): t is capped at max|acc|
  (homomorphic: at the mean of the workers' maxima), so the largest |acc| always gets
  a code and shrinks; capped, it is sent whole. Hence no pull is all zero while acc is
  not, equal magnitudes arrive whole every step (r = 0), and a smaller value waits only
  until its acc reaches the largest (r <= G).
* Hylo conv (filter top-k, both aggregations): the k filters with the largest
  ||acc||^2 go, at least k/O of the total, so ||r||_2 <= ||g||_2 * q / (1 - q),
  q = sqrt(1 - k/O).
* Element top-k: likewise in L1, ||r||_1 <= (n/k - 1) * ||g||_1.
* AdaComp: each nonzero bin's largest |acc| qualifies (|H| = |G + g| >= max|G| while
  the residual has g's sign); checked: nothing stays unsent over K steps.
* MXNet's 2-bit (fixed t, its own rule kept): |r| < t wherever |g| <= t (a value
  waits at most ceil(t / |g|) steps); a |g| above t sends only t a step (MXNet's rule).

Everything runs through the kvstore (rank 0 of 1), the FC rows held step by step to
the NumPy reference (python/kvx_ref)."""
import math

import numpy as np
import pytest
import mxnet as mx

import kvstore_ext  # noqa: F401  registers the kvstore types
from kvx_ref import codecs as ref

f32 = np.float32
STEPS = 20
FC, CONV = (300, 200), (32, 8, 3, 3)


def gradient(kind, shape):
    """constant +1; random +-1 per element; sparse (5 nonzeros of mixed magnitude);
    'one' (a single element) and 'two' (two elements of different magnitude), each as a
    1-D tensor, or (2, 1, 1, 1) for a conv codec."""
    n = int(np.prod(shape))
    rng = np.random.default_rng(11)
    if kind == 'constant':
        return np.ones(shape, f32)
    if kind == 'sign':
        return rng.choice(f32([-1, 1]), size=shape)
    if kind == 'sparse':
        g = np.zeros(n, f32)
        g[rng.choice(n, 5, replace=False)] = [1, -1, 0.5, -0.75, 0.25]
        return g.reshape(shape)
    if kind == 'one':
        return np.ones(shape, f32)
    assert kind == 'two'
    return np.array([1.0, -0.25], f32).reshape(shape)


def shape_of(kind, conv):
    if kind in ('one', 'two'):
        return {'one': (1,), 'two': (2,)}[kind] if not conv else (2, 1, 1, 1)
    return CONV if conv else FC


def run(name, params, grad, steps=STEPS):
    """Every step's pulled sum of ``grad`` pushed ``steps`` times (one worker)."""
    kv = mx.kv.create(name)
    kv.set_gradient_compression(params)
    kv.broadcast('w', mx.nd.zeros(grad.shape), mx.nd.zeros(grad.shape))
    pulled = []
    for _ in range(steps):
        out = mx.nd.zeros(grad.shape)
        kv.pushpull('w', mx.nd.array(grad), out=out)
        pulled.append(out.asnumpy())
    return pulled


# -- Hylo FC: the capped threshold, held to the reference ---------------------------

FC_MODES = {
    'homomorphic-previous': {},
    'server': {'aggregation': 'server'},
}


def fc_reference(grad, mode, value, scale=2.0, steps=STEPS):
    """What one worker's pulls are by the NumPy reference, and its acc before each
    step."""
    residual = np.zeros(grad.size, f32)
    g = grad.reshape(-1)
    n = g.size
    pulled, accs, carried = [], [], None

    def stats(acc):
        a = np.abs(acc.astype(np.float64))
        return [a.sum(), float(ref.acc_abs_max(acc))]

    for _ in range(steps):
        acc = (g + residual).astype(f32)
        accs.append(acc)
        if mode == 'server':
            payload, residual, status = ref.ternary_encode(g, residual, scale, value=value)
            out, ok = ref.ternary_decode(payload, n)
        else:
            agreed = carried if (mode == 'homomorphic-previous' and carried) else stats(acc)
            t, v = ref.agreed_ternary(agreed, scale, value, 1, n)
            words, residual, status = ref.ternary_encode_sum(g, residual, t, 1, value=v)
            out, ok = ref.ternary_decode_sum(words, v, 1, n)
            carried = stats((g + residual).astype(f32))
        assert status == ok == 0
        pulled.append(out.reshape(grad.shape))
    return pulled, accs


@pytest.mark.parametrize('kind', ['constant', 'sign', 'sparse', 'one', 'two'])
@pytest.mark.parametrize('mode', sorted(FC_MODES))
def test_hylo_fc_delivers(kind, mode):
    value = 'round'                 # Hylo's FC value rule (hylo.FC_VALUE): codes worth 2t
    grad = gradient(kind, shape_of(kind, conv=False))
    params = dict(FC_MODES[mode], size_threshold=0)
    pulled = run('dist_sync_hylo', params, grad)
    want, accs = fc_reference(grad, mode, value)
    delivered = np.zeros(grad.shape, np.float64)
    for step, (got, expect, acc) in enumerate(zip(pulled, want, accs)):
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=0,
                                   err_msg='step %d differs from the reference' % step)
        # the bound: the largest |acc| gets a code (its sign), so no pull is all zero
        top = np.abs(acc) == np.abs(acc).max()
        assert np.all(np.sign(got.reshape(-1)[top]) == np.sign(acc[top])), step
        delivered += got
    left = STEPS * grad.astype(np.float64) - delivered
    if kind in ('constant', 'sign', 'one'):          # equal magnitudes arrive whole
        assert not left.any()
        for got in pulled:
            assert np.array_equal(got, grad)
    elif kind == 'two':                               # the small one waits for the max
        assert np.abs(left).max() <= np.abs(grad).max()
    else:                                             # sparse: every nonzero moved
        nz = grad != 0
        assert np.all(np.sign(delivered[nz]) == np.sign(grad[nz]))


# -- the other thresholded codecs: their bounds --------------------------------------

OTHERS = {
    # id: (kvstore, params, conv layout)
    'hylo-conv-homomorphic': ('dist_sync_hylo', {'size_threshold': 0, 'conv_rate': 0.25},
                              True),
    'hylo-conv-server': ('dist_sync_hylo', {'size_threshold': 0, 'conv_rate': 0.25,
                                            'aggregation': 'server'}, True),
    'topk': ('dist_sync_topk', {'size_threshold': 0, 'ratio': 0.1}, False),
    'adacomp': ('dist_sync_adacomp', {'size_threshold': 0, 'bin_fc': 50, 'bin_conv': 50,
                                      'max_per_bin': 10}, False),
    '2bit': ('dist_sync_2bit', {'threshold': 1.0}, False),
}


@pytest.mark.parametrize('kind', ['constant', 'sign', 'sparse', 'one', 'two'])
@pytest.mark.parametrize('codec', sorted(OTHERS))
def test_thresholded_codec_delivers(codec, kind):
    name, params, conv = OTHERS[codec]
    grad = gradient(kind, shape_of(kind, conv))
    g = grad.astype(np.float64)
    pulled = run(name, params, grad)
    delivered = np.sum(pulled, axis=0, dtype=np.float64)
    left = STEPS * g - delivered
    if codec != '2bit':                  # something every step (acc is never all zero)
        assert all(p.any() for p in pulled)
    if codec.startswith('hylo-conv'):
        k = min(max(math.ceil(0.25 * grad.shape[0] - 1e-9), 1), grad.shape[0])
        q = math.sqrt(1 - k / grad.shape[0])
        bound = np.linalg.norm(g) * q / (1 - q) if q > 0 else 0.0
        assert np.linalg.norm(left) <= bound * (1 + 1e-6) + 1e-6
    elif codec == 'topk':
        k = math.ceil(0.1 * grad.size - 1e-9)
        assert np.abs(left).sum() <= (grad.size / k - 1) * np.abs(g).sum() * (1 + 1e-6)
    elif codec == '2bit':                # |g| <= t = 1 everywhere here
        assert np.abs(left).max() < 1.0
    # every element with a gradient has delivered some of it, in its direction
    nz = grad != 0
    assert np.all(np.sign(delivered[nz]) == np.sign(grad[nz])), codec


def test_twobit_above_threshold_sends_t_a_step():
    """MXNet's 2-bit rule, kept for compatibility: a |g| above the fixed t arrives at t a
    step, the rest accumulates (never all zero, never more than t)."""
    grad = np.full((10,), 2.0, f32)
    pulled = run('dist_sync_2bit', {'threshold': 0.5}, grad)
    for got in pulled:
        assert np.array_equal(got, np.full((10,), 0.5, f32))


# -- two workers, real ps-lite: the constant gradient arrives in both Hylo modes -------

@pytest.mark.parametrize('aggregation', ['homomorphic', 'server'])
def test_two_workers_equal_magnitudes_arrive(tmp_path, job_env, aggregation):
    """2 workers, 1 server: every step's pulled sum is the sum of the workers' gradients
    (constant, random signs, one element): capped, every value is sent whole."""
    import os
    import sys
    from test_dist_aggregate import launch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs'))
    import delivery_job as job
    steps = 4
    job_path = os.path.join(os.path.dirname(os.path.abspath(job.__file__)), 'delivery_job.py')
    launch(tmp_path, job_env, 2, 1, [job_path, '--aggregation', aggregation,
                                     '--steps', str(steps), '--out', str(tmp_path)],
           timeout=240)
    for rank in range(2):
        got = np.load(str(tmp_path / ('rank%d.npz' % rank)))
        for key in job.SHAPES:
            want = job.gradient(0, key) + job.gradient(1, key)
            for step in range(steps):
                assert np.array_equal(got['%s/%d' % (key, step)], want), (rank, key, step)
