"""policy='auto' (kvstore_ext/policy.py): per key, float32 or Hylo's codec, whichever
the cost model predicts faster at the link rate; every worker decides the same.

The decision is checked against kvstore_ext/cost.py itself; the real jobs (2 workers,
1 server, python -m kvstore_ext.launch) check what travels: with a huge link_rate
exactly dist_sync_none's bytes and weights, with a tiny one the default Hylo's bytes,
with a measured one (link_rate=0) the same plan on every worker."""
import json
import os

import numpy as np
import pytest

import kvstore_ext  # noqa: F401  (registers the schemes)
from kvstore_ext import cost, policy
from kvstore_ext.codecs import FP32Codec
from kvstore_ext.schemes import Hylo

from test_dist_aggregate import launch

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'dist_jobs', 'policy_job.py')
f32 = np.float32
# a large conv layer (top-k filters) and a large FC layer (ternary)
SHAPES = [(512, 256, 3, 3), (4096, 1024)]


def model_says_compress(codec, workers, servers, rate_bits):
    """The cost model's comparison, written out: codec + servers + wire against float32's
    wire, each tensor alone, at ``rate_bits``."""
    link = cost.Link(rate_bits / 8)
    packed = cost.cost(codec, workers, servers, link)
    raw = cost.cost(FP32Codec(codec.shape), workers, servers, link)
    return packed.codec_seconds + packed.server_seconds + packed.wire_seconds < \
        raw.wire_seconds


MODES = [{}, {'aggregation': 'server', 'pull': 'compressed'}]
# the rule's decisions as such, not tried against float32 in the job (plan_trial.py)
RULE = {'trial_steps': 0}


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('shape', SHAPES)
def test_fast_link_raw_slow_link_compressed(shape, mode):
    default = Hylo(**mode)
    default.num_workers = 4
    want = default.codec_for(shape, f32)
    assert not want.passthrough
    for rate, compressed in ((1e13, False), (1e6, True)):
        scheme = Hylo(**RULE, policy='auto', link_rate=rate, **mode)
        scheme.num_workers = 4
        got = scheme.codec_for(shape, f32)
        assert got.passthrough is not compressed
        assert model_says_compress(want, 4, 1, rate) is compressed
        if compressed:
            assert got.describe() == want.describe()
    # the default policy compresses whatever the link
    assert not Hylo(link_rate=1e13).codec_for(shape, f32).passthrough


@pytest.mark.parametrize('shape', SHAPES)
def test_float32_pulls_never_pay(shape):
    """Server mode pulling float32: the busiest link carries the float32 sum either
    way, so the model predicts float32 faster at every rate (codec time for nothing)."""
    for rate in (1e6, 1e9, 1e12):
        scheme = Hylo(aggregation='server', policy='auto', link_rate=rate)
        scheme.num_workers = 4
        assert scheme.codec_for(shape, f32).passthrough
        assert not model_says_compress(Hylo(aggregation='server').codec_for(shape, f32),
                                       4, 1, rate)


@pytest.mark.parametrize('workers,servers', [(2, 1), (8, 2)])
@pytest.mark.parametrize('shape', SHAPES)
def test_the_switch_is_where_the_model_crosses(shape, workers, servers):
    """On a grid of rates the decision is the model's at every rate, switches once,
    and crossover() lies between the two rates where it switches."""
    scheme = Hylo()
    scheme.num_workers = workers
    codec = scheme.codec_for(shape, f32)
    rates = np.logspace(6, 13, 141)
    got = [policy.compresses(codec, workers, servers, r) for r in rates]
    assert got == [model_says_compress(codec, workers, servers, r) for r in rates]
    switches = [i for i in range(1, len(got)) if got[i] != got[i - 1]]
    assert len(switches) == 1 and got[0] and not got[-1]
    at = policy.crossover(codec, workers, servers)
    assert rates[switches[0] - 1] <= at <= rates[switches[0]]
    assert policy.compresses(codec, workers, servers, at * 0.999)
    assert not policy.compresses(codec, workers, servers, at * 1.001)


def test_small_and_exempt_tensors_are_untouched():
    scheme = Hylo(**RULE, policy='auto', link_rate=1e6)
    assert scheme.codec_for((64,), f32).passthrough
    assert scheme.codec_for((100, 100), np.float16).passthrough


def test_parameters_are_checked():
    with pytest.raises(ValueError, match='policy'):
        Hylo(policy='fast')
    with pytest.raises(ValueError, match='link_rate'):
        Hylo(link_rate=-1.0)


def agree_everywhere(meters):
    """agree_rate on every worker of ``meters``, its Sum round played here: what each
    worker pushes is summed, and every worker reads the sum."""
    from mxnet import ndarray
    contributions = []
    for m in meters:
        policy.agree_rate(m, len(meters), lambda a: contributions.append(a.asnumpy()) or a)
    total = np.sum(contributions, axis=0)
    return [policy.agree_rate(m, len(meters), lambda a: ndarray.array(total, dtype=f32))
            for m in meters]


def test_measured_rate_is_agreed_as_the_mean():
    """agree_rate: one Sum round; workers that timed nothing are not counted."""
    meters = []
    for rate in (4e9, 2e9, 0.0):
        m = policy.LinkMeter()
        if rate:
            m.add(rate / 8, 1.0)
        meters.append(m)

    values = agree_everywhere(meters)
    assert values[0] == values[1] == values[2]
    assert values[0][0] == pytest.approx(3e9, rel=1e-6)
    assert values[0][1] == 0.0      # one size of round each: no line, no round seconds
    assert values[0][2] == pytest.approx((4e9 + 2e9) / 8 / 2, rel=1e-6)   # bytes timed


def test_a_rate_from_few_bytes_does_not_replace_the_agreed_one():
    """A re-measured rate replaces the agreed one (and re-plans) only if it moved by
    more than RATE_CHANGE on at least RATE_EVIDENCE of the bytes: the rounds of a
    compressed plan's small float32 keys are latency-bound, their rate is noise."""
    assert policy.adopts(0.0, 0.0, 1e9, 1e3)                 # the first rate
    assert not policy.adopts(1e9, 4e7, 0.0, 0.0)             # nothing timed
    assert not policy.adopts(1e9, 4e7, 1.5e9, 4e7)           # moved too little
    assert policy.adopts(1e9, 4e7, 4e9, 1e7)                 # 4x, on a quarter of the bytes
    assert not policy.adopts(1e9, 4e7, 4e9, 0.9e7)           # 4x, on too few bytes


def test_round_seconds_are_agreed_as_the_mean_of_the_lines():
    """agree_rate's second number: the mean intercept of the workers whose fit drew a
    line (rounds of several sizes); a worker with no line is not counted."""
    meters = []
    for rate, latency in ((4e9, 0.002), (2e9, 0.006), (1e9, None)):
        m = policy.LinkMeter()
        sizes = (1 << 12, 1 << 20, 1 << 23) if latency else (1 << 20,)
        for nbytes in sizes:
            m.add(nbytes, (latency or 0.0) + 8.0 * nbytes / rate)
        meters.append(m)
    values = agree_everywhere(meters)
    assert values[0] == values[1] == values[2]
    assert values[0][0] == pytest.approx(7e9 / 3, rel=1e-5)
    assert values[0][1] == pytest.approx(0.004, rel=1e-4)


def test_an_agreement_round_is_priced_at_the_round_seconds():
    """A conv layer whose codec agrees by a round of its own ('conv_round') pays the
    round seconds once more than float32; one that agrees on the previous step pays
    none: where the model says compress without rounds, enough round seconds make the
    first float32 and leave the second compressed."""
    shape, workers, rate = (128, 128, 3, 3), 8, 5e9
    by_round = Hylo(agreement='conv_round')
    by_round.num_workers = workers
    by_previous = Hylo(agreement='previous')
    by_previous.num_workers = workers
    with_round, previous = by_round.codec_for(shape, f32), by_previous.codec_for(shape, f32)
    assert policy.compresses(with_round, workers, 1, rate)
    assert policy.compresses(previous, workers, 1, rate)
    link = cost.Link(rate / 8.0)
    packed = cost.cost(with_round, workers, 1, link)
    assert packed.rounds == 2 and cost.cost(previous, workers, 1, link).rounds == 1
    saved = (cost.cost(FP32Codec(shape), workers, 1, link).wire_seconds
             - packed.wire_seconds - packed.codec_seconds - packed.server_seconds)
    assert saved > 0
    assert policy.compresses(with_round, workers, 1, rate, round_s=0.9 * saved)
    assert not policy.compresses(with_round, workers, 1, rate, round_s=1.1 * saved)
    assert policy.compresses(previous, workers, 1, rate, round_s=1.1 * saved)


def latency_bound_rounds(rate_bits, latency, small=60, large=(1 << 20, 4 << 20, 16 << 20),
                         seed=0):
    """(bytes, seconds) of timed rounds as a job's init and first step make them: many
    small keys (biases, norms, small convs), each a round trip and a little, and a few
    large ones at ``latency`` + bytes / rate, each size timed twice (broadcast, step),
    every round a little late (delays only add)."""
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(100, 20000, small)) + list(large)
    points = []
    for b in sizes:
        for _ in range(2):
            late = rng.uniform(0, 0.2) * latency
            points.append((float(b), latency + 8.0 * b / rate_bits + late))
    return points


@pytest.mark.parametrize('rate,mean_below', [(1e8, 1.0), (1e9, 0.75), (1e10, 0.3)])
def test_link_meter_measures_the_link_not_the_latency(rate, mean_below):
    """Latency-bound small keys plus large keys: the meter gives the large keys' rate
    (the link's), where total bytes over total seconds is dominated by the small keys'
    round trips and lands below it, the further the faster the link."""
    points = latency_bound_rounds(rate, 1e-3)
    meter = policy.LinkMeter()
    for b, s in points:
        meter.add(b, s)
    got = meter.rate_bits()
    assert got == pytest.approx(rate, rel=0.15)
    mean = 8 * sum(b for b, _ in points) / sum(s for _, s in points)
    assert mean < mean_below * rate            # what the former estimator measured
    fit = meter.last
    assert fit.method == 'line' and fit.rounds == len(points)
    assert fit.mean_bits == pytest.approx(mean)
    assert fit.latency_s == pytest.approx(1e-3, rel=0.3)


def test_link_meter_keeps_each_sizes_fastest_round():
    """A key's first round that waited (for the backward pass, for the other worker) is
    not the link: of two rounds of one size the faster one counts."""
    points = latency_bound_rounds(1e9, 1e-3)
    meter = policy.LinkMeter()
    for b, s in points:
        meter.add(b, s)
    meter.add(points[0][0], 0.5)               # a small key's round that waited 0.5 s
    assert meter.rate_bits() == pytest.approx(1e9, rel=0.15)


def test_link_meter_one_late_round_of_the_largest_size_does_not_tilt_the_line():
    """A round that waited, of a size timed once (the largest key: no faster round of
    its size to take instead), measured 104 ms where its neighbours took 3 on loopback.
    It has the most leverage on a least-squares line; the median line (Theil-Sen)
    keeps the link's rate."""
    points = latency_bound_rounds(1e9, 1e-3)
    meter = policy.LinkMeter()
    for b, s in points:
        meter.add(b, s)
    largest = 64 << 20
    meter.add(largest, 10 * (1e-3 + 8.0 * largest / 1e9))
    assert meter.rate_bits() == pytest.approx(1e9, rel=0.15)
    assert meter.last.method == 'line'


@pytest.mark.parametrize('workers', [2, 4, 8])
def test_rounds_are_filed_under_the_bytes_of_the_servers_link(workers):
    """A worker pushes and pulls b bytes, but one server's link takes every worker's
    push in, then sends every worker's pull (a broadcast: one push, every worker's
    pull): what the cost model's links carry, so that the fitted rate is the link's.
    Rounds timed on such a link give its rate back, not rate / workers."""
    n, rate = 1 << 18, 1e9
    assert policy.round_link_bytes((n,), workers, 1, 1 << 20) == 2 * workers * 4 * n
    assert policy.round_link_bytes((n,), workers, 1, 1 << 20, pulls=workers) == \
        (1 + workers) * 4 * n
    meter = policy.LinkMeter()
    for size in [16, 1000, 30000, 1 << 16, 1 << 18, 1 << 19]:
        link_bytes = policy.round_link_bytes((size,), workers, 1, 1 << 20)
        meter.add(link_bytes, 1e-3 + 8.0 * link_bytes / rate)
    assert meter.rate_bits() == pytest.approx(rate, rel=1e-6)


def test_link_meter_degenerate_fits_fall_back_to_the_bytes_weighted_rate():
    """One size, a line that falls with size, or a negative latency: no line; the
    bytes-weighted rate through the origin, sum(b^2) / sum(b s) over the fastest round
    of each size, led by the largest rounds. Nothing timed: 0 (not counted in the
    agreement)."""
    cases = {
        'one size': [(1e6, 0.01), (1e6, 0.012)],
        'falling': [(1e3, 0.02), (1e6, 0.01)],
        'negative latency': [(1e5, 0.0001), (1e6, 0.01)],
    }
    for name, points in cases.items():
        meter = policy.LinkMeter()
        for b, s in points:
            meter.add(b, s)
        fastest = {b: min(t for c, t in points if c == b) for b, _ in points}
        want = 8 * sum(b * b for b in fastest) / sum(b * t for b, t in fastest.items())
        assert meter.rate_bits() == pytest.approx(want), name
        assert meter.last.method == 'bytes-weighted' and meter.last.latency_s is None, name
    empty = policy.LinkMeter()
    empty.add(0, 0.0)
    assert empty.rate_bits() == 0.0 and empty.last.method == 'none'


def test_rate_change_threshold():
    assert not policy.changed(1e9, 1.9e9) and not policy.changed(1e9, 0.6e9)
    assert policy.changed(1e9, 2.1e9) and policy.changed(1e9, 0.4e9)


def test_measured_rate_replans_through_settle():
    """link_rate=0: float32 at the first step, re-planned at step 1 by the agreed rate,
    and again every REMEASURE_STEPS steps only if it moved by more than RATE_CHANGE
    (the shipped codec table: the rate's round alone)."""
    scheme = Hylo(**RULE, policy='auto', link_rate=0.0, codec_times='shipped')
    scheme.num_workers = 2
    shape = SHAPES[0]
    assert scheme.codec_for(shape, f32, step=0).passthrough
    assert scheme.measures_link(0) and not scheme.measures_link(1)
    assert scheme.replans_at(1) and not scheme.replans_at(2)
    assert scheme.replans_at(policy.REMEASURE_STEPS)
    assert scheme.measures_link(policy.REMEASURE_STEPS - 1)
    from mxnet import ndarray

    def share_with(other_bits):
        def share(array):
            mine = array.asnumpy()
            # the other worker: a rate, no line (no round seconds), from one second's bytes
            other = [other_bits / 1e6, 1, 0, 0, other_bits / 8 / 1e6]
            return ndarray.array(mine + np.array(other, f32), dtype=f32)
        return share

    scheme.link_meter.add(1e6 / 8, 1.0)           # 1 Mbit/s here, 3 Mbit/s there
    scheme.settle(1, 0, share_with(3e6))
    assert scheme.agreed_rate == pytest.approx(2e6) and scheme.agreed_round_s == 0.0
    assert not scheme.codec_for(shape, f32, step=1).passthrough     # slow: compressed
    scheme.link_meter.add(2e6 / 8, 1.0)           # 1.5x faster: kept
    scheme.settle(100, 0, share_with(4e6))
    assert scheme.agreed_rate == pytest.approx(2e6)
    scheme.link_meter.add(1e13 / 8, 1.0)          # a million times faster: re-planned
    scheme.settle(200, 0, share_with(1e13))
    assert scheme.agreed_rate == pytest.approx(1e13, rel=1e-3)
    assert scheme.codec_for(shape, f32, step=200).passthrough


def test_given_rate_does_not_measure():
    """A given rate is not measured; the codecs are timed at step 1 (its only re-plan),
    unless the shipped table is asked for."""
    scheme = Hylo(**RULE, policy='auto', link_rate=1e9)
    assert not scheme.measures_link(0) and scheme.replans_at(1)
    assert not any(scheme.replans_at(s) for s in (2, policy.REMEASURE_STEPS))
    shipped = Hylo(**RULE, policy='auto', link_rate=1e9, codec_times='shipped')
    assert not shipped.measures_link(0) and not shipped.replans_at(1)
    assert not Hylo().measures_link(0) and not Hylo().replans_at(1)


LOCAL_SHAPES = {'conv': (24, 8, 3, 3), 'fc': (70, 33), 'bias': (50,), 'wide': (5000,)}


@pytest.mark.parametrize('rate', [0, 1e3])
def test_decisions_are_reported_logged_once_and_summarized(tmp_path, caplog, rate):
    """One process (the store is rank 0 of 1): kv.policy_decisions() gives the rate the
    plans use and every key's choice, as kv.plan shows it; one log line says so, at the
    first step after the decisions (step 1 with a given rate and the shipped table,
    step 2 with a measured one), and no more; the training scripts' --summary-json
    carries the same."""
    import argparse
    import logging
    import sys
    import mxnet as mx
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(dict(BASE, **RULE, policy='auto', link_rate=rate,
                                     codec_times='shipped'))
    for key, shape in LOCAL_SHAPES.items():
        kv.broadcast(key, mx.nd.ones(shape), out=mx.nd.zeros(shape))
    logged = []
    with caplog.at_level('INFO', logger='kvstore_ext'):
        for step in range(5):
            for key, shape in LOCAL_SHAPES.items():
                kv.pushpull(key, mx.nd.ones(shape), out=mx.nd.zeros(shape))
            logged.append([r.getMessage() for r in caplog.records
                           if "policy='auto': link rate" in r.getMessage()])
    found = kv.policy_decisions()
    assert found['compressed'] == {k: kv.plan(k).compressed for k in LOCAL_SHAPES}
    if rate:
        assert found['rate_source'] == 'given' and found['rate_bits'] == rate
        assert found['round_s'] == 0.0
        assert found['rate_fit'] is None
        assert [len(x) for x in logged] == [0, 1, 1, 1, 1]
        assert logged[-1][0].endswith('3 of 4 keys compressed: conv, fc, wide')
    else:
        assert found['rate_source'] == 'measured'
        assert found['rate_bits'] == kv.scheme.agreed_rate > 0
        assert found['round_s'] == kv.scheme.agreed_round_s >= 0
        assert found['rate_fit']['rounds'] == 2 * len(LOCAL_SHAPES)  # broadcast, step 0
        assert [len(x) for x in logged] == [0, 0, 1, 1, 1]
    assert '%.0f Mbit/s' % (found['rate_bits'] / 1e6) in logged[-1][0]
    assert found['codec_timing_s'] is None and 'timed in' not in logged[-1][0]
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'gluon_scripts'))
    from training import report
    args = argparse.Namespace(kvstore='dist_sync_hylo', compression_params={},
                              summary_json=str(tmp_path / 's-{rank}.json'))
    report.summarize(args, kv, [], logging.getLogger('test'))
    assert json.load(open(str(tmp_path / 's-0.json')))['policy'] == found


# ---- codec_times='measured': the workers' own codec seconds, agreed -----------------

def report(seconds):
    """A codec_timer hook: every chunk of a codec takes ``seconds`` on the worker."""
    from kvstore_ext import chunking

    def timer(codec, workers, chunk_size):
        return {cost.signature(c.codec): (seconds, 0.0)
                for c in chunking.split(codec, chunk_size)}
    return timer


def settle_workers(schemes, shape):
    """Plan ``shape`` at step 0 on every scheme (one per rank), settle step 1 through
    one Sum round over all of them, and return each one's codec at step 1."""
    from mxnet import ndarray
    for scheme in schemes:
        scheme.num_workers = len(schemes)
        scheme.codec_for(shape, f32, step=0)
    pushed = []
    for rank, scheme in enumerate(schemes):      # what each worker puts in the round
        probe = Hylo(**scheme.params)
        probe.num_workers, probe.codec_timer = len(schemes), scheme.codec_timer
        probe.codec_for(shape, f32, step=0)
        probe.settle(1, rank, lambda a: pushed.append(a.asnumpy()) or a)
    total = np.sum(pushed, axis=0)
    for rank, scheme in enumerate(schemes):
        scheme.settle(1, rank, lambda a: ndarray.array(total, dtype=f32))
    return [s.codec_for(shape, f32, step=1) for s in schemes]


def test_slow_codec_times_flip_to_float32_fast_keep_compressed():
    """At a rate where the shipped table compresses, a codec timed slow on the workers
    sends the key float32 from step 1; at one where it does not, a fast codec
    compresses it."""
    shape = SHAPES[1]
    slow = Hylo(**RULE, policy='auto', link_rate=1e8)
    slow.codec_timer = report(10.0)
    assert not slow.codec_for(shape, f32, step=0).passthrough      # the shipped table
    assert slow.codec_timing_s is None
    assert all(c.passthrough for c in settle_workers([slow], shape))
    assert 0 <= slow.codec_timing_s < 60       # reported: what the timing cost, once
    fast = Hylo(**RULE, policy='auto', link_rate=1e13)
    fast.codec_timer = report(0.0)
    assert fast.codec_for(shape, f32, step=0).passthrough
    assert not any(c.passthrough for c in settle_workers([fast], shape))
    # the same timings with the shipped table change nothing
    for rate, timer in ((1e8, report(10.0)), (1e13, report(0.0))):
        shipped = Hylo(**RULE, policy='auto', link_rate=rate, codec_times='shipped')
        shipped.codec_timer = timer
        first = shipped.codec_for(shape, f32, step=0).passthrough
        assert shipped.codec_for(shape, f32, step=1).passthrough is first
        assert shipped.codec_timing_s is None


def test_agreed_codec_times_are_the_slowest_workers():
    """Workers that time their codecs differently still decide alike: each takes the
    slowest worker's seconds from the one Sum round."""
    shape = SHAPES[1]
    schemes = []
    for seconds in (0.0, 10.0, 0.0):
        scheme = Hylo(**RULE, policy='auto', link_rate=1e8)
        scheme.codec_timer = report(seconds)
        schemes.append(scheme)
    codecs = settle_workers(schemes, shape)
    assert all(c.passthrough for c in codecs)
    agreed = [s.codec_speeds.measured for s in schemes]
    assert agreed[0] == agreed[1] == agreed[2]
    assert all(v == (10.0, 0.0) for v in agreed[0].values())


def test_a_worker_that_cannot_time_falls_back_with_the_others(caplog):
    """A timer that fails on one worker (raises, or gives NaN): every worker still
    takes part in the round and takes the shipped table for that codec, alike; the
    failing rank is named in the log."""
    shape = SHAPES[1]

    def broken(codec, workers, chunk_size):
        raise RuntimeError('no clock')

    for bad in (broken, report(float('nan'))):
        schemes = []
        for timer in (report(10.0), bad):
            scheme = Hylo(**RULE, policy='auto', link_rate=1e8)
            scheme.codec_timer = timer
            schemes.append(scheme)
        with caplog.at_level('WARNING', logger='kvstore_ext'):
            codecs = settle_workers(schemes, shape)
        assert 'rank 1 could not time the codec' in caplog.text
        assert [s.codec_speeds.measured for s in schemes] == [{}, {}]
        shipped = Hylo(**RULE, policy='auto', link_rate=1e8, codec_times='shipped')
        shipped.num_workers = 2
        want = shipped.codec_for(shape, f32, step=1).passthrough
        assert [c.passthrough for c in codecs] == [want, want]
        caplog.clear()


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('shape', SHAPES)
def test_measure_times_the_codecs_step(shape, mode):
    """codec_timing.measure: each chunk of the codec timed on this machine; the servers'
    decode of a payload only where the servers decode (server mode)."""
    from kvstore_ext import chunking, codec_timing
    scheme = Hylo(**mode)
    scheme.num_workers = 2
    codec = scheme.codec_for(shape, f32)
    found = codec_timing.measure(codec, 2, 1 << 20)
    assert set(found) == {cost.signature(c.codec) for c in chunking.split(codec, 1 << 20)}
    for worker, slot in found.values():
        assert 0 < worker < 10
        assert (slot > 0) is (mode.get('aggregation') == 'server')


# ---- real jobs -------------------------------------------------------------------------

def run_job(tmp_path, job_env, kvstore, params, steps=3):
    out = tmp_path / kvstore.replace(':', '_') / str(len(os.listdir(str(tmp_path))))
    out.mkdir(parents=True)
    launch(out, job_env, 2, 1, [JOB, '--kvstore', kvstore, '--params', json.dumps(params),
                                '--steps', str(steps), '--out', str(out)])
    infos = [json.load(open(str(out / ('rank%d.json' % w)))) for w in range(2)]
    weights = [dict(np.load(str(out / ('rank%d.npz' % w)))) for w in range(2)]
    return infos, weights


BASE = {'size_threshold': 100}


# the shipped table: no timing round, so the bytes are exactly dist_sync's and Hylo's
SHIPPED = dict(BASE, **RULE, policy='auto', codec_times='shipped')


def test_dist_huge_link_rate_is_dist_sync(tmp_path, job_env):
    auto, auto_w = run_job(tmp_path, job_env, 'dist_sync_hylo',
                           dict(SHIPPED, link_rate=1e15))
    plain, plain_w = run_job(tmp_path, job_env, 'dist_sync_none', {})
    for rank in range(2):
        for step, plan in auto[rank]['compressed'].items():
            assert not any(plan.values()), (rank, step, plan)
        assert auto[rank]['stats'] == plain[rank]['stats']
        assert auto[rank]['stats']['push_bytes'] == auto[rank]['stats']['raw_bytes']
        for key in plain_w[rank]:
            assert np.array_equal(auto_w[rank][key], plain_w[rank][key]), key


def test_dist_tiny_link_rate_is_default_hylo(tmp_path, job_env):
    auto, auto_w = run_job(tmp_path, job_env, 'dist_sync_hylo',
                           dict(SHIPPED, link_rate=1e3))
    hylo, hylo_w = run_job(tmp_path, job_env, 'dist_sync_hylo', BASE)
    for rank in range(2):
        assert auto[rank]['compressed'] == hylo[rank]['compressed']
        assert any(auto[rank]['compressed']['0'].values())
        assert auto[rank]['stats'] == hylo[rank]['stats']
        assert auto[rank]['stats']['push_bytes'] < auto[rank]['stats']['raw_bytes']
        for key in hylo_w[rank]:
            assert np.array_equal(auto_w[rank][key], hylo_w[rank][key]), key


def test_dist_measured_rate_every_worker_decides_the_same(tmp_path, job_env):
    infos, weights = run_job(tmp_path, job_env, 'dist_sync_hylo',
                             dict(BASE, policy='auto', link_rate=0), steps=4)
    a, b = infos
    assert not any(a['compressed']['0'].values())        # measured: float32 first
    assert a['compressed'] == b['compressed']
    assert a['rate'] == b['rate'] and a['rate']['1'] > 0
    assert a['stats'] == b['stats']
    # the codecs were timed on each worker and agreed: the same seconds on both
    assert a['codec_seconds'] and a['codec_seconds'] == b['codec_seconds']
    for key in weights[0]:
        assert np.array_equal(weights[0][key], weights[1][key]), key


def test_dist_codec_times_differ_every_worker_decides_the_same(tmp_path, job_env):
    """Rank 0 times its codecs slow, rank 1 fast, at a given rate where the shipped
    table compresses: compressed at step 0, float32 from step 1 on both workers (the
    slowest worker's seconds), the same agreed seconds and weights on both."""
    params = dict(BASE, policy='auto', link_rate=1e6)
    out = tmp_path / 'differ'
    out.mkdir()
    launch(out, job_env, 2, 1, [JOB, '--kvstore', 'dist_sync_hylo', '--params',
                                json.dumps(params), '--steps', '3', '--out', str(out),
                                '--codec-seconds', json.dumps([5.0, 0.0])])
    a, b = [json.load(open(str(out / ('rank%d.json' % w)))) for w in range(2)]
    weights = [dict(np.load(str(out / ('rank%d.npz' % w)))) for w in range(2)]
    assert a['compressed'] == b['compressed']
    compressed = [k for k, v in a['compressed']['0'].items() if v]
    assert sorted(compressed) == ['conv', 'fc', 'wide']
    for step in ('1', '2'):
        assert not any(a['compressed'][step].values()), a['compressed'][step]
    assert a['codec_seconds'] == b['codec_seconds']
    assert a['codec_seconds'] and all(v == [5.0, 0.0] for v in a['codec_seconds'].values())
    for key in weights[0]:
        assert np.array_equal(weights[0][key], weights[1][key]), key


def test_dist_measured_rate_is_reported_and_logged_once(tmp_path, job_env):
    """kv.policy_decisions(): the agreed rate the plans used (the mean of the workers'
    own fits) and each key's choice, the same on both workers; rank 0 logs them in one
    line, once."""
    out = tmp_path / 'report'
    out.mkdir()
    proc = launch(out, job_env, 2, 1, [JOB, '--kvstore', 'dist_sync_hylo', '--params',
                                       json.dumps(dict(BASE, policy='auto', link_rate=0)),
                                       '--steps', '4', '--out', str(out)])
    a, b = [json.load(open(str(out / ('rank%d.json' % w)))) for w in range(2)]
    for info in (a, b):
        found = info['policy']
        assert found['rate_source'] == 'measured'
        assert found['rate_bits'] == info['rate']['3'] > 0
        assert found['compressed'] == info['compressed']['3']
        assert found['rate_fit']['rounds'] == 2 * len(info['compressed']['3'])
    assert a['policy']['compressed'] == b['policy']['compressed']
    fits = [a['policy']['rate_fit']['rate_bits'], b['policy']['rate_fit']['rate_bits']]
    assert a['policy']['rate_bits'] == pytest.approx(sum(fits) / 2, rel=1e-5)
    lines_s = [info['policy']['rate_fit']['latency_s'] for info in (a, b)]
    lines_s = [x for x in lines_s if x is not None and x > 0]
    assert a['policy']['round_s'] == b['policy']['round_s']
    assert a['policy']['round_s'] == pytest.approx(
        sum(lines_s) / len(lines_s) if lines_s else 0.0, rel=1e-4, abs=1e-9)
    lines = [l for l in proc.stdout.splitlines() if "policy='auto': link rate" in l]
    assert len(lines) == 1, proc.stdout[-3000:]
    assert '%.0f Mbit/s' % (a['policy']['rate_bits'] / 1e6) in lines[0]
    assert '(timed in %.2f s)' % a['policy']['codec_timing_s'] in lines[0], lines[0]
    compressed = sum(a['policy']['compressed'].values())
    assert '%d of 4 keys compressed' % compressed in lines[0], lines[0]


def test_dist_link_rate_differs_is_refused(job_env):
    """Workers given different rates would choose differently: every worker raises at
    the first key, naming link_rate (fingerprint.py)."""
    import test_dist_config_mismatch as mismatch
    proc, seconds = mismatch.launch(job_env, '--rank0-params',
                                    '{"policy": "auto", "link_rate": 1e9}')
    message = mismatch.assert_every_worker_raised(proc, seconds, 'bias')
    assert 'parameter link_rate: rank 0 has 1000000000.0; rank 1 has 0.0' in message, message
    assert "parameter policy: rank 0 has 'auto'; rank 1 has 'compress'" in message, message
