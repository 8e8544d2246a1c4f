"""policy='auto''s trial of the rule's plan against every key float32 (plan_trial.py):
the phases, the clock, the agreement, and in a two-worker job the same plan kept on both
workers, whichever way the job's own step times go."""
import json
import os

import numpy as np
import pytest

import kvstore_ext  # noqa: F401  (registers the schemes)
from kvstore_ext import plan_trial, policy
from kvstore_ext.plan_trial import PlanTrial
from kvstore_ext.schemes import Hylo

from test_dist_aggregate import launch

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'dist_jobs', 'policy_job.py')
f32 = np.float32
CONV = (512, 256, 3, 3)


class Clock:
    """time.perf_counter for plan_trial: the seconds ``step_seconds[s]`` between the
    first keys of step s and s + 1."""

    def __init__(self, monkeypatch):
        self.now = 0.0
        monkeypatch.setattr(plan_trial.time, 'perf_counter', lambda: self.now)

    def run(self, trial_or_scheme, steps, seconds):
        """Clock ``steps`` (a range), each taking ``seconds(step)``."""
        clock = getattr(trial_or_scheme, 'step_started', None) or trial_or_scheme.clock
        for step in steps:
            clock(step)
            self.now += seconds(step)


def summing(*others):
    """share(): this worker's array plus the other workers' (numpy lists)."""
    from mxnet import ndarray

    def share(array):
        return ndarray.array(array.asnumpy() + np.sum(others, axis=0), dtype=f32)
    return share


def test_plans_and_switches():
    """float32 first, then the rule's plan if it compresses a key, then every key
    compressed if the rule sent one float32; a switch at each plan's first step and
    the decision at the step after the last."""
    from kvstore_ext.plan_trial import FLOAT32, RULE, SCHEME
    for compressed, plans in (([True, False], [FLOAT32, RULE, SCHEME]),
                              ([True, True], [FLOAT32, RULE]),
                              ([False], [FLOAT32, SCHEME])):
        trial = PlanTrial(3)
        trial.begin(1)
        trial.begin(2)                   # begun once: a later call changes nothing
        for c in compressed:
            trial.noted(c)
        assert trial.start == 1 and trial.plans() == plans
        assert [trial.plan(s) for s in range(1, 1 + 3 * len(plans))] == \
            [p for p in plans for _ in range(3)]
        end = 1 + 3 * len(plans)
        assert [s for s in range(30) if trial.replans_at(s)] == list(range(4, end + 1, 3))
        assert [s for s in range(30) if trial.decides_at(s)] == [end]


def test_median_leaves_out_each_plan_first_step(monkeypatch):
    """The first step of each plan carries the switch: a slow one does not count."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(4)
    trial.begin(1)
    seconds = {1: 50.0, 2: 1.0, 3: 3.0, 4: 2.0, 5: 60.0, 6: 5.0, 7: 4.0, 8: 6.0}
    clock.run(trial, range(1, 10), lambda s: seconds.get(s, 0.0))
    assert sorted(trial.phase_steps(1)) == [1.0, 2.0, 3.0]
    assert sorted(trial.phase_steps(5)) == [4.0, 5.0, 6.0]


@pytest.mark.parametrize('here, other, kept', [
    ([2.0, 1.0, 1.5], [2.0, 1.0, 1.5], 'rule'),       # the rule's plan fastest
    ([2.0, 1.0, 0.5], [2.0, 1.0, 0.5], 'scheme'),     # every key compressed fastest
    ([2.0, 1.0, 3.0], [2.0, 3.5, 3.0], 'float32'),    # faster here, not in the sum
    ([2.0, 1.97, 3.0], [2.0, 1.97, 3.0], 'float32'),  # 1.5% faster: within the margin
])
def test_decision_is_the_sum_over_workers(monkeypatch, here, other, kept):
    clock = Clock(monkeypatch)
    trial = PlanTrial(3)
    trial.begin(1)
    trial.noted(True)
    trial.noted(False)
    clock.run(trial, range(1, 11), lambda s: here[min((s - 1) // 3, 2)])
    trial.decide(summing(other + [0.0] * 3), 2, 10)     # (no noise on the other)
    assert trial.kept == kept
    assert trial.seconds == pytest.approx(
        {p: (a + b) / 2 for p, a, b in zip(('float32', 'rule', 'scheme'), here, other)})
    assert all(trial.plan(s) == kept for s in (10, 11, 500))
    assert trial.replans_at(10) and not trial.replans_at(13)    # its keys re-plan
    found = trial.as_dict()
    steps = found.pop('worker_steps')      # this worker's own steps, the first left out
    assert found == {'start': 1, 'steps': 3, 'plans': ['float32', 'rule', 'scheme'],
                     'schedule': ['float32', 'rule', 'scheme'], 'rounds': 1, 'decided': True, 'seconds': trial.seconds,
                     'noise': trial.noise, 'kept': kept, 'float32_skipped': False}
    for plan, x in zip(('float32', 'rule', 'scheme'), here):
        assert steps[plan] == pytest.approx([x, x])


def test_close_plans_run_another_round(monkeypatch):
    """Plans 5% or more apart but closer than twice their noise: the trial runs the
    plans again (float32 first), pools each plan's steps over the rounds, and keeps a
    plan once it is clear; every step of the extra round is a plan switch the keys
    re-plan at."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(4, rounds=3)
    trial.begin(1)
    trial.noted(True)
    # round 1 (steps 1-8): float32 1.00 +- 0.2, rule 0.85 +- 0.2: not clear
    noisy = {2: 0.8, 3: 1.0, 4: 1.2, 6: 0.65, 7: 0.85, 8: 1.05}
    clock.run(trial, range(1, 10), lambda s: noisy.get(s, 5.0) if s < 9 else 1.0)
    trial.decide(summing([0.0] * 4), 1, 9)
    assert trial.state == plan_trial.RUNNING and trial.rounds == 2
    assert trial.noise['float32'] > 0.05 and trial.seconds['rule'] == pytest.approx(0.85)
    assert trial.replans_at(9) and not trial.decides_at(9) and trial.decides_at(17)
    assert [trial.plan(s) for s in (9, 12, 13, 16)] == ['float32'] * 2 + ['rule'] * 2
    # round 2 (steps 9-16): float32 steady at 1.0, the rule at 0.6: clear over both rounds
    clock.run(trial, range(10, 18), lambda s: 1.0 if s < 13 else 0.6)
    trial.decide(summing([0.0] * 4), 1, 17)
    assert trial.state == plan_trial.DECIDED and trial.kept == 'rule'
    assert trial.decided_at == 17 and trial.replans_at(17)
    found = trial.as_dict()
    assert found['schedule'] == ['float32', 'rule'] * 2 and found['rounds'] == 2
    steps = found['worker_steps']
    assert sorted(steps['float32']) == pytest.approx([0.8, 1.0, 1.0, 1.0, 1.0, 1.2])
    assert sorted(steps['rule']) == pytest.approx([0.6, 0.6, 0.6, 0.65, 0.85, 1.05])


def test_plans_within_indifferent_end_the_trial(monkeypatch):
    """Plans within INDIFFERENT (5%) of the fastest are as good as it: however noisy,
    no second round (each switch of plan costs accuracy), and float32 stays unless a
    compressed plan beats it by KEEP_MARGIN."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(3, rounds=4)
    trial.begin(0)
    trial.noted(True)
    trial.noted(False)
    # float32 1.0 (weighed 0.97), the rule 0.98, every key compressed 1.01, each +- 0.5
    centre = {0: 1.0, 1: 0.98, 2: 1.01}
    clock.run(trial, range(0, 10),
              lambda s: centre[min(s // 3, 2)] + (0.0, -0.5, 0.5)[s % 3])
    trial.decide(summing([0.0] * 6), 1, 9)
    assert trial.noise['rule'] > 0.3
    assert trial.state == plan_trial.DECIDED and trial.kept == 'float32'
    assert trial.as_dict()['rounds'] == 1


def test_a_plan_clearly_beaten_is_not_run_again(monkeypatch):
    """Three plans, float32 clearly the slowest, the two compressed plans 10% apart and
    noisy: the next round runs those two only (fewer switches), and the pooled steps
    decide between them."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(3, rounds=4)
    trial.begin(0)
    trial.noted(True)
    trial.noted(False)
    # round 1 (steps 0-8): float32 3.0 steady, the rule 1.0 +- 0.4, every key 1.1 +- 0.4
    first = {0: (3.0, 3.0, 3.0), 1: (1.0, 0.6, 1.4), 2: (1.1, 0.7, 1.5)}
    clock.run(trial, range(0, 9), lambda s: first[s // 3][s % 3])
    trial.decide(summing([0.0] * 6), 1, 9)
    assert trial.state == plan_trial.RUNNING and trial.reruns == [['rule', 'scheme']]
    assert [trial.plan(s) for s in range(9, 15)] == ['rule'] * 3 + ['scheme'] * 3
    assert [s for s in range(9, 20) if trial.replans_at(s)] == [9, 12, 15]
    assert trial.decides_at(15)
    # round 2 (steps 9-14): the rule steady at 1.0, every key at 1.6
    clock.run(trial, range(9, 16), lambda s: 1.0 if s < 12 else 1.6)
    trial.decide(summing([0.0] * 4), 1, 15)
    assert trial.state == plan_trial.DECIDED and trial.kept == 'rule'
    found = trial.as_dict()
    assert found['schedule'] == ['float32', 'rule', 'scheme', 'rule', 'scheme']
    assert found['seconds']['float32'] == pytest.approx(3.0)    # its round-1 median
    assert sorted(found['worker_steps']) == ['float32', 'rule', 'scheme']


def test_plans_never_clear_stop_at_the_last_round(monkeypatch):
    """Plans 7% apart whose noise never resolves them: the trial stops after ``rounds``
    rounds and keeps the faster by the medians."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(3, rounds=2)
    trial.begin(0)
    trial.noted(True)
    # float32 1.0 (weighed 0.97), the rule 0.9, each +- 0.5, in both rounds
    clock.run(trial, range(0, 13),
              lambda s: (1.0, 0.9)[s // 3 % 2] + (0.0, -0.5, 0.5)[s % 3])
    trial.decide(summing([0.0] * 4), 1, 6)
    assert trial.state == plan_trial.RUNNING and trial.decides_at(12)
    trial.decide(summing([0.0] * 4), 1, 12)
    assert trial.state == plan_trial.DECIDED and trial.kept == 'rule'
    assert trial.as_dict()['rounds'] == 2


def test_the_workers_noise_is_agreed(monkeypatch):
    """The decision to run another round is the workers' together: a plan clear on this
    worker (no noise here) but not on the other (its noise in the sum) runs again."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(3, rounds=2)
    trial.begin(0)
    trial.noted(True)
    clock.run(trial, range(0, 7), lambda s: 1.0 if s < 3 else 0.9)
    # the other worker: the same medians, and a noise of 0.2 on each plan
    trial.decide(summing([1.0, 0.9, 0.2, 0.2]), 2, 6)
    assert trial.state == plan_trial.RUNNING
    assert trial.noise == pytest.approx({'float32': 0.1, 'rule': 0.1})


def test_no_key_to_try_no_round():
    trial = PlanTrial(2)
    trial.begin(0)

    def share(array):
        raise AssertionError('no round without a plan to try')
    trial.decide(share, 2, 2)
    assert trial.kept == 'float32' and trial.as_dict()['seconds'] is None


def test_a_trial_waits_for_its_first_step():
    """start=5: a decision before step 5 keeps the rule's plan and begins nothing; the
    keys re-plan at step 5, whose decision begins the trial with float32."""
    trial = PlanTrial(3, start=5)
    for step in (1, 2, 4):
        trial.begin(step)
        trial.noted(True)
        assert trial.plan(step) == plan_trial.RULE and trial.as_dict() is None
    assert [s for s in range(12) if trial.replans_at(s)] == [5]
    trial.begin(5)
    trial.noted(True)
    assert trial.start == 5 and trial.plan(5) == plan_trial.FLOAT32
    assert trial.plan(8) == plan_trial.RULE and trial.decides_at(11)


def test_hylo_keeps_the_rule_plan_until_the_trial_start():
    """Hylo with a given rate: steps 0-3 run the rule's plan (trial_start=4), the trial
    begins at 4 with every key float32."""
    scheme = Hylo(policy='auto', link_rate=5e9, codec_times='shipped', trial_steps=2,
                  trial_start=4, size_threshold=100)
    scheme.num_workers = 2
    rule = [not scheme.codec_for(CONV, f32, step=s).passthrough for s in range(4)]
    assert rule == [True] * 4
    assert [s for s in range(1, 12) if scheme.replans_at(s)] == [4]
    assert scheme.codec_for(CONV, f32, step=4).passthrough
    assert scheme.trial.start == 4 and scheme.replans_at(6)


@pytest.mark.parametrize('rate, tried', [(1e6, ['rule']), (5e9, ['float32', 'rule'])])
def test_float32_is_not_tried_where_its_wire_alone_loses(monkeypatch, rate, tried):
    """Steps 1-3 run the rule's plan (1 s each, agreed at step 4 where the trial
    begins). At 1 Mbit/s the conv layer's float32 round alone takes 38 s on the link,
    more than twice that step: the trial times only the rule's plan. At 5 Gbit/s
    (0.008 s) float32 is tried first, as always."""
    clock = Clock(monkeypatch)
    scheme = Hylo(policy='auto', link_rate=rate, codec_times='shipped', trial_steps=2,
                  trial_start=4, size_threshold=100)
    scheme.num_workers = 1
    assert not scheme.codec_for(CONV, f32, step=0).passthrough      # the rule's plan
    clock.run(scheme, range(1, 5), lambda s: 1.0)
    scheme.settle(4, 0, lambda a: a)
    assert scheme.trial.before_s == pytest.approx(1.0)
    plan = scheme.codec_for(CONV, f32, step=4)
    assert scheme.trial.plans() == tried and plan.passthrough == (tried[0] == 'float32')
    assert scheme.trial.as_dict()['float32_skipped'] == (tried == ['rule'])
    from kvstore_ext import policy_report
    said = policy_report.line({'rate_bits': rate, 'rate_source': 'given', 'rate_fit': None,
                               'round_s': 0.0, 'codec_times': 'shipped',
                               'codec_timing_s': None, 'trial': scheme.trial.as_dict(),
                               'compressed': {'conv': True}})
    assert ('float32 not tried' in said) == (tried == ['rule']), said
    if tried == ['rule']:          # one plan: kept at the end of its steps, no round
        clock.run(scheme, range(5, 7), lambda s: 1.0)
        assert scheme.trial.decides_at(6)
        scheme.trial.decide(lambda a: pytest.fail('a round for one plan'), 1, 6)
        assert scheme.trial.kept == 'rule' and not scheme.codec_for(CONV, f32, 6).passthrough


def test_no_steps_before_no_skip():
    """A trial from the first decision has no step of the rule's plan to weigh: every
    plan is tried, whatever the rate."""
    scheme = Hylo(policy='auto', link_rate=1e6, codec_times='shipped', trial_steps=2,
                  trial_start=0, size_threshold=100)
    scheme.num_workers = 1
    assert scheme.codec_for(CONV, f32, step=0).passthrough
    assert scheme.trial.plans() == ['float32', 'rule']


def test_one_step_is_refused():
    """A plan's first step is not timed: one step a plan would time nothing."""
    with pytest.raises(ValueError, match='trial_steps must not be 1'):
        Hylo(policy='auto', trial_steps=1)
    Hylo(policy='auto', trial_steps=2)


def test_zero_steps_keeps_the_rule_untried():
    trial = PlanTrial(0)
    trial.begin(1)
    trial.noted(True)
    assert trial.plan(1) == 'rule' and not any(trial.replans_at(s) for s in range(20))
    assert trial.as_dict() is None


def test_hylo_tries_its_plans_and_keeps_the_fastest(monkeypatch):
    """A given rate (5 Gbit/s) and the shipped table: the rule compresses the large conv
    layer and not the small one from step 0, so the trial begins there: float32 for 2 steps, the
    rule's plan for 2, every key compressed for 2; every key compressed was fastest,
    here and on the other worker: both keys compressed from the decision step."""
    clock = Clock(monkeypatch)
    small = (40, 8, 3, 3)
    scheme = Hylo(policy='auto', link_rate=5e9, codec_times='shipped', trial_steps=2,
                  trial_start=0,
                  size_threshold=100)
    scheme.num_workers = 2
    assert policy.compresses(scheme.conv_codec(CONV, scheme.conv_k(CONV)), 2, 1, 5e9)
    assert not policy.compresses(scheme.conv_codec(small, scheme.conv_k(small)), 2, 1, 5e9)
    plans = [(scheme.codec_for(CONV, f32, step=s).passthrough,
              scheme.codec_for(small, f32, step=s).passthrough) for s in (0, 2, 4)]
    assert plans == [(True, True), (False, True), (False, False)]
    assert [s for s in range(10) if scheme.replans_at(s)] == [2, 4, 6]
    clock.run(scheme, range(0, 7), lambda s: [1.0, 0.9, 0.5][min(s // 2, 2)])
    scheme.settle(6, 0, summing([1.0, 0.9, 0.6, 0.0, 0.0, 0.0]))
    assert scheme.trial.kept == 'scheme' and scheme.replans_at(6)
    assert not scheme.codec_for(CONV, f32, step=6).passthrough
    assert not scheme.codec_for(small, f32, step=6).passthrough


def test_a_new_rate_tries_again(monkeypatch):
    """A measured rate: the trial begins at step 1 (the rule's first decision); after
    it kept the plan, a rate a million times different re-plans at the re-measure step
    and tries again from there; a rate from few bytes does not."""
    from mxnet import ndarray
    clock = Clock(monkeypatch)
    scheme = Hylo(policy='auto', link_rate=0.0, codec_times='shipped', trial_steps=2,
                  trial_start=0)
    scheme.num_workers = 1

    def rate_round(array):
        return array
    assert scheme.codec_for(CONV, f32, step=0).passthrough
    assert scheme.measures_link(0)        # as the store asks: the meter is made
    scheme.link_meter.add(1e3 / 8, 1.0)
    scheme.settle(1, 0, rate_round)
    assert scheme.codec_for(CONV, f32, step=1).passthrough        # the float32 plan
    assert not scheme.codec_for(CONV, f32, step=3).passthrough    # the rule's
    clock.run(scheme, range(1, 6), lambda s: 2.0 if s < 3 else 1.0)
    scheme.settle(5, 0, lambda a: ndarray.array(a.asnumpy(), dtype=f32))
    assert scheme.trial.kept == 'rule'
    assert not scheme.codec_for(CONV, f32, step=5).passthrough
    step = policy.REMEASURE_STEPS
    scheme.link_meter.add(1e9 / 8, 1.0)
    scheme.settle(step, 0, rate_round)
    assert scheme.trial.state == plan_trial.FRESH
    scheme.codec_for(CONV, f32, step=step)
    assert scheme.trial.start == step and scheme.replans_at(step + 2)
    # a rate 125 times slower, from one round of 1 kB: not evidence of a new link
    # (policy.RATE_EVIDENCE); the rate stays and the trial runs on
    scheme.link_meter.add(1e3, 1e-3)
    scheme.settle(step + 2, 0, rate_round)
    assert scheme.agreed_rate == pytest.approx(1e9, rel=1e-6)
    assert scheme.trial.state == plan_trial.RUNNING and scheme.trial.start == step


def run_job(tmp_path, job_env, params, steps, slow_plan):
    out = tmp_path / str(len(os.listdir(str(tmp_path))))
    out.mkdir()
    launch(out, job_env, 2, 1, [JOB, '--kvstore', 'dist_sync_hylo', '--params',
                                json.dumps(params), '--steps', str(steps), '--out', str(out),
                                '--slow-plan', json.dumps(slow_plan)])
    infos = [json.load(open(str(out / ('rank%d.json' % w)))) for w in range(2)]
    weights = [dict(np.load(str(out / ('rank%d.npz' % w)))) for w in range(2)]
    return infos, weights


@pytest.mark.parametrize('slow_when, kept', [('compressed', 'float32'), ('float32', 'rule')])
def test_dist_every_worker_keeps_the_same_plan(tmp_path, job_env, slow_when, kept):
    """Two workers; only rank 1's steps are slower (by 0.3 s) while keys go one way, so
    the trial's verdict is known: both workers keep the same plan, from the step the
    trial decided, with the same agreed seconds and the same weights. (The rule
    compresses every key Hylo would at this rate: two plans, float32 and the rule's.)"""
    params = {'size_threshold': 100, 'policy': 'auto', 'link_rate': 1e3,
              'codec_times': 'shipped', 'trial_steps': 3, 'trial_start': 0}
    infos, weights = run_job(tmp_path, job_env, params, 8, [[0.0, 0.3], slow_when])
    a, b = infos
    assert a['compressed'] == b['compressed']
    trial, other = a['policy']['trial'], b['policy']['trial']
    for found in (trial, other):          # each worker's own steps: 2 timed a plan
        steps = found.pop('worker_steps')
        assert sorted(steps) == ['float32', 'rule'] and all(len(v) == 2 for v in steps.values())
    assert trial == other
    assert trial['plans'] == ['float32', 'rule'] and trial['kept'] == kept
    rule = {'conv': True, 'fc': True, 'bias': False, 'wide': True}
    none = dict.fromkeys(rule, False)
    want = [none] * 3 + [rule] * 3 + [rule if kept == 'rule' else none] * 2
    assert [a['compressed'][str(s)] for s in range(8)] == want
    slower = trial['seconds']['rule' if slow_when == 'compressed' else 'float32']
    assert slower > 0.3 / 2      # rank 1's 0.3 s, over 2 workers
    for key in weights[0]:
        assert np.array_equal(weights[0][key], weights[1][key]), key
