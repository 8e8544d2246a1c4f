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


def test_phases_and_switches():
    trial = PlanTrial(3)
    trial.begin(1)
    trial.begin(2)                       # begun once: a later call changes nothing
    assert trial.start == 1 and trial.switches == (4, 7)
    trial.wants(True)
    assert [trial.float32(s) for s in range(1, 7)] == [True] * 3 + [False] * 3
    assert [s for s in range(12) if trial.replans_at(s)] == [4, 7]
    assert [s for s in range(12) if trial.decides_at(s)] == [7]
    nothing = PlanTrial(3)
    nothing.begin(1)
    nothing.wants(False)
    assert all(nothing.float32(s) for s in range(1, 7))    # no key to try


def test_median_leaves_out_each_phase_first_step(monkeypatch):
    """The first step of each phase carries the switch: a slow one does not count."""
    clock = Clock(monkeypatch)
    trial = PlanTrial(4)
    trial.begin(1)
    seconds = {1: 50.0, 2: 1.0, 3: 3.0, 4: 2.0, 5: 60.0, 6: 5.0, 7: 4.0, 8: 6.0}
    clock.run(trial, range(1, 10), lambda s: seconds.get(s, 0.0))
    assert trial.phase_seconds(1) == 2.0
    assert trial.phase_seconds(5) == 5.0


@pytest.mark.parametrize('plan_s, other_float32_s, other_plan_s, kept', [
    (1.0, 2.0, 2.5, True),      # both faster with the plan
    (1.0, 1.0, 3.5, False),     # faster here, much slower on the other worker: the sum
    (3.0, 2.0, 1.0, False),     # equal sums: not faster, every key float32
])
def test_decision_is_the_sum_over_workers(monkeypatch, plan_s, other_float32_s,
                                          other_plan_s, kept):
    clock = Clock(monkeypatch)
    trial = PlanTrial(3)
    trial.begin(1)
    trial.wants(True)
    clock.run(trial, range(1, 8), lambda s: 2.0 if s < 4 else plan_s)
    trial.decide(summing([other_float32_s, other_plan_s]), 2)
    assert trial.kept is kept
    assert trial.seconds == pytest.approx(((2.0 + other_float32_s) / 2,
                                           (plan_s + other_plan_s) / 2))
    assert all(trial.float32(s) is not kept for s in (7, 8, 500))
    assert trial.as_dict() == {'start': 1, 'steps': 3, 'decided': True, 'tried': True,
                               'float32_s': trial.seconds[0], 'plan_s': trial.seconds[1],
                               'kept': kept}


def test_no_key_compressed_no_round():
    trial = PlanTrial(2)
    trial.begin(0)
    trial.wants(False)

    def share(array):
        raise AssertionError('no round without a key to try')
    trial.decide(share, 2)
    assert trial.kept and trial.as_dict()['tried'] is False


def test_zero_steps_keeps_the_rule_untried():
    trial = PlanTrial(0)
    trial.begin(1)
    trial.wants(True)
    assert not trial.float32(1) and not any(trial.replans_at(s) for s in range(20))
    assert trial.as_dict() is None


def test_hylo_tries_its_plan_and_keeps_float32_if_slower(monkeypatch):
    """A given slow rate and the shipped table: the rule compresses from step 0, so the
    trial begins there: float32 for 2 steps, the plan for 2, then the plan was slower
    here and on the other worker: every key float32, re-planned at the decision step."""
    clock = Clock(monkeypatch)
    scheme = Hylo(policy='auto', link_rate=1e3, codec_times='shipped', trial_steps=2)
    scheme.num_workers = 2
    assert scheme.codec_for(CONV, f32, step=0).passthrough
    assert [s for s in range(10) if scheme.replans_at(s)] == [2, 4]
    assert not scheme.codec_for(CONV, f32, step=2).passthrough
    clock.run(scheme, range(0, 5), lambda s: 1.0 if s < 2 else 1.5)
    scheme.settle(4, 0, summing([1.0, 1.4]))
    assert scheme.codec_for(CONV, f32, step=4).passthrough
    assert scheme.replans_at(4)           # after the decision too: every key re-plans
    assert scheme.trial.as_dict()['kept'] is False


def test_a_new_rate_tries_again(monkeypatch):
    """A measured rate: the trial begins at step 1 (the rule's first decision); after
    it kept the plan, a rate a million times different re-plans at the re-measure step
    and tries again from there."""
    from mxnet import ndarray
    clock = Clock(monkeypatch)
    scheme = Hylo(policy='auto', link_rate=0.0, codec_times='shipped', trial_steps=2)
    scheme.num_workers = 1

    def rate_round(array):
        return array
    assert scheme.codec_for(CONV, f32, step=0).passthrough
    assert scheme.measures_link(0)        # as the store asks: the meter is made
    scheme.link_meter.add(1e3 / 8, 1.0)
    scheme.settle(1, 0, rate_round)
    assert scheme.codec_for(CONV, f32, step=1).passthrough        # the float32 phase
    assert not scheme.codec_for(CONV, f32, step=3).passthrough    # the plan's
    clock.run(scheme, range(1, 6), lambda s: 2.0 if s < 3 else 1.0)
    scheme.settle(5, 0, lambda a: ndarray.array(a.asnumpy(), dtype=f32))
    assert scheme.trial.kept and not scheme.codec_for(CONV, f32, step=5).passthrough
    step = policy.REMEASURE_STEPS
    scheme.link_meter.add(1e9 / 8, 1.0)
    scheme.settle(step, 0, rate_round)
    assert scheme.trial.state == plan_trial.FRESH
    scheme.codec_for(CONV, f32, step=step)
    assert scheme.trial.start == step and scheme.replans_at(step + 2)


def run_job(tmp_path, job_env, params, steps, slow_plan):
    out = tmp_path / str(len(os.listdir(str(tmp_path))))
    out.mkdir()
    launch(out, job_env, 2, 1, [JOB, '--kvstore', 'dist_sync_hylo', '--params',
                                json.dumps(params), '--steps', str(steps), '--out', str(out),
                                '--slow-plan', json.dumps(slow_plan)])
    infos = [json.load(open(str(out / ('rank%d.json' % w)))) for w in range(2)]
    weights = [dict(np.load(str(out / ('rank%d.npz' % w)))) for w in range(2)]
    return infos, weights


@pytest.mark.parametrize('slow_when, kept', [('compressed', False), ('float32', True)])
def test_dist_every_worker_keeps_the_same_plan(tmp_path, job_env, slow_when, kept):
    """Two workers; only rank 1's steps are slower (by 0.3 s) with one of the plans, so
    the trial's verdict is known: both workers keep the same plan, from the step the
    trial decided, with the same agreed seconds and the same weights."""
    params = {'size_threshold': 100, 'policy': 'auto', 'link_rate': 1e3,
              'codec_times': 'shipped', 'trial_steps': 3}
    infos, weights = run_job(tmp_path, job_env, params, 8, [[0.0, 0.3], slow_when])
    a, b = infos
    assert a['compressed'] == b['compressed']
    assert a['policy']['trial'] == b['policy']['trial']
    assert a['policy']['trial']['kept'] is kept and a['policy']['trial']['tried']
    rule = {'conv': True, 'fc': True, 'bias': False, 'wide': True}
    none = dict.fromkeys(rule, False)
    want = [none] * 3 + [rule] * 3 + [rule if kept else none] * 2
    assert [a['compressed'][str(s)] for s in range(8)] == want
    slower = a['policy']['trial']['plan_s' if slow_when == 'compressed' else 'float32_s']
    assert slower > 0.3 / 2      # rank 1's 0.3 s, over 2 workers
    for key in weights[0]:
        assert np.array_equal(weights[0][key], weights[1][key]), key
