"""kvstore_ext/fingerprint.py without processes: the words a worker contributes and
the message every worker builds from all of them (the multi-process runs are in
test_dist_config_mismatch.py). Rows are stacked as the Sum round delivers them: each
worker's slot, the others zero, added in float32."""
import numpy as np
import pytest

import kvstore_ext  # noqa: F401  (registers the schemes)
from kvstore_ext import fingerprint
from kvstore_ext.registry import SCHEMES
from kvstore_ext.schemes.base import COMMON_PARAMS


def spec_of(name):
    return dict(COMMON_PARAMS, **SCHEMES[name].PARAMS)


def rows_of(*slots):
    """What the Sum round returns, reshaped: every worker's slot in its place, summed
    in float32 as the server does."""
    n = len(slots)
    total = np.zeros(n * fingerprint.WORDS, dtype=np.float32)
    for rank, words in enumerate(slots):
        mine = np.zeros((n, fingerprint.WORDS), dtype=np.float32)
        mine[rank] = words
        total += mine.reshape((-1,))
    return total.reshape((n, fingerprint.WORDS))


def hylo_slot(key='fc', shape=(64, 40), dtype=np.float32, kind='dist_sync_hylo', **given):
    params = SCHEMES['hylo'](**given).params
    return fingerprint.slot(kind, key, shape, dtype, params, spec_of('hylo')), params


def test_every_word_is_exact_in_float32():
    words, _ = hylo_slot(conv_rate=0.05, size_threshold=(1 << 24) - 1)
    assert words.dtype == np.float32 and words.shape == (fingerprint.WORDS,)
    hashes = words[:fingerprint._OFFSET['param_values'][0]]   # all but the values
    assert np.all(hashes >= 0) and np.all(hashes < 2 ** 24)
    assert np.all(hashes == np.floor(hashes))


def test_equal_configurations_agree():
    a, params = hylo_slot(fc_scale=4.0)
    b, _ = hylo_slot(fc_scale=4.0)
    assert fingerprint.compare(rows_of(a, b, a), 'fc', params, spec_of('hylo')) is None


def test_every_scheme_fits_the_named_parameter_slots():
    """Every parameter a scheme holds (dAD's include its fallback's) is declared, so a
    difference is named with both values, and fits the named slots."""
    for name, cls in SCHEMES.items():
        scheme = cls()
        assert set(scheme.params) == set(scheme.param_specs()), name
        assert len(scheme.params) <= fingerprint.MAX_PARAMS, name


def test_a_fallback_parameter_of_dad_is_named():
    scheme = SCHEMES['dad']()
    params, spec = scheme.params, scheme.param_specs()
    rows = [fingerprint.slot('dist_sync_dad', 'fc', (64, 40), np.float32, dict(
        params, **{'fallback.aggregation': aggregation}), spec)
        for aggregation in ('homomorphic', 'server')]
    message = fingerprint.compare(rows_of(*rows), "fc", params, spec)
    assert message is not None and \
        "fallback.aggregation: rank 0 has 'homomorphic'; rank 1 has 'server'" in message, message


@pytest.mark.parametrize('given, expected', [
    ({'fc_scale': 4.0}, 'parameter fc_scale: rank 0 has 4.0; ranks 1, 2 have 2.0'),
    ({'size_threshold': 10}, 'parameter size_threshold: rank 0 has 10; ranks 1, 2 have 32768'),
    ({'aggregation': 'server'},
     "parameter aggregation: rank 0 has 'server'; ranks 1, 2 have 'homomorphic'"),
    ({'conv_rate': 0.05}, 'parameter conv_rate: rank 0 has 0.05; ranks 1, 2 have None'),
])
def test_a_parameter_of_rank_0_differs(given, expected):
    odd, params = hylo_slot(**given)
    default, default_params = hylo_slot()
    for local in (params, default_params):      # every worker builds the same message
        message = fingerprint.compare(rows_of(odd, default, default), 'fc', local,
                                      spec_of('hylo'))
        assert message.startswith("key 'fc': the workers are configured differently")
        assert expected in message, message
        assert message.count('parameter ') == 1, message


def test_shape_dtype_key_and_type():
    base, params = hylo_slot()
    cases = [
        (hylo_slot(shape=(65, 40))[0], 'shape: rank 0 has (64, 40); rank 1 has (65, 40)'),
        (hylo_slot(shape=(64,))[0], 'shape: rank 0 has (64, 40); rank 1 has (64,)'),
        (hylo_slot(dtype=np.float16)[0], 'dtype: rank 0 has float32; rank 1 has float16'),
        (hylo_slot(key='conv')[0], "different keys at the same point: rank 0 has 'fc'; "
                                   "rank 1 has 'conv'"),
        (hylo_slot(kind='dist_sync_lgreco_hylo')[0],
         'different kvstore types: rank 0 has dist_sync_hylo; rank 1 has '
         'dist_sync_lgreco_hylo'),
    ]
    for other, expected in cases:
        message = fingerprint.compare(rows_of(base, other), 'fc', params, spec_of('hylo'))
        assert expected in message, message


def test_a_shape_beyond_float32_integers_still_differs():
    base, params = hylo_slot(shape=(1 << 25, 1))
    other, _ = hylo_slot(shape=((1 << 25) + 1, 1))
    message = fingerprint.compare(rows_of(base, other), 'fc', params, spec_of('hylo'))
    assert message is not None and 'shape' in message


def test_one_worker_has_no_one_to_disagree_with():
    class OneWorker:
        num_workers, rank = 1, 0

        def exchange(self, key, requests):
            raise AssertionError('no round for one worker')
    fingerprint.agree(OneWorker(), 'dist_sync_hylo', 'fc', (2, 3), np.float32,
                      {'chunk_size': 1024}, COMMON_PARAMS)


def test_a_parameter_beyond_the_named_ones_still_differs():
    """A scheme with more parameters than MAX_PARAMS: the digest of all of them tells."""
    params = {'p%02d' % i: 1.0 for i in range(fingerprint.MAX_PARAMS + 5)}
    other = dict(params, p36=2.0)
    rows = rows_of(fingerprint.slot('dist_sync_x', 'k', (3,), np.float32, params, {}),
                   fingerprint.slot('dist_sync_x', 'k', (3,), np.float32, other, {}))
    message = fingerprint.compare(rows, 'k', params, {})
    assert message is not None and 'beyond the %d named here' % fingerprint.MAX_PARAMS \
        in message, message


def test_a_gluon_key_is_compared_once(monkeypatch):
    """Gluon's Trainer broadcasts every key before its first step: each key's
    fingerprint is compared there, and only the first key planned is compared again at
    its first step, after the optimizer's momentum was handed over (the parameters may
    change until then: planning.agree_due). Every key used to be compared twice."""
    import mxnet as mx
    compared = []       # (key, the momentum compared)
    agree = fingerprint.agree

    def counting(transport, kind, key, shape, dtype, params, spec):
        compared.append((key, params['momentum']))
        return agree(transport, kind, key, shape, dtype, params, spec)
    monkeypatch.setattr(fingerprint, 'agree', counting)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, in_units=5), mx.gluon.nn.Dense(3, in_units=8))
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), 'sgd',
                               {'learning_rate': 0.1, 'momentum': 0.9},
                               kvstore='dist_sync_hylo')
    for _ in range(2):
        with mx.autograd.record():
            loss = net(mx.nd.ones((2, 5))).sum()
        loss.backward()
        trainer.step(2)
    keys = [key for key, _ in compared]
    first = keys[0]
    assert sorted(set(keys)) == list(range(4))
    assert sorted(keys) == sorted(list(set(keys)) + [first]), compared       # 5 rounds, not 8
    assert compared[keys.index(first, 1)] == (first, 0.9), compared     # after the hand-over
