"""policy='auto''s plan tried in the job before it is kept: a few steps with every key
float32, a few with the rule's plan, and the faster of the two stays.

Why: the rule (policy.py) prices a key by its codec seconds and its bytes, as if the
key travelled alone. In a job a compressed key costs more than that: its encoder waits
for its gradient, the plugin's operators run one after another in MXNet's engine (so
compressed keys' rounds follow one another: docs/DESIGN.md, "What a step may wait for in
the engine"), and the float32 transfer it replaces was partly hidden behind the backward
pass. On the emulated cluster at 1 Gbit/s and unshaped links the rule compressed one or
two of the resnet-like net's conv layers and the step took 1.10-1.15x the all-float32
step (docs/COST_MODEL.md). The job's own step times see every such cost, whatever its
cause, so the rule's plan is kept only if the job runs faster with it.

How (``PlanTrial``): from the step the rule first decides with its final inputs (the
agreed rate and codec seconds), ``steps`` steps go all float32, then ``steps`` with the
rule's plan. Each worker times its steps (from one step's first key to the next step's),
leaves out the first step of each phase (it carries the switch: a re-plan, a first
compressed round), and takes the median of the rest. One Sum round then gives every
worker the sum over workers of both medians, so every worker keeps the same plan: the
rule's if its sum is lower, else every key float32. A rule that compresses no key is
not tried. A re-plan at a newly agreed rate tries again.

The cost: ``steps`` steps at the slower plan, once (and at each new rate), against a
plan that may cost every step 10-15%.
"""
import statistics
import time

import numpy as np

# States of a trial.
FRESH = 'fresh'          # not begun: begins at the rule's first decision with final inputs
RUNNING = 'running'
DECIDED = 'decided'


class PlanTrial:
    """One worker's trial of the rule's plan against all float32 (module docstring).

    ``steps``: steps a phase (0: no trial; the rule's plan is kept untried). The store
    calls ``clock`` at each step's first key; the scheme asks ``float32(step)`` whether
    a key goes float32 by the trial, ``wants`` what the rule chose, ``replans_at`` where
    the trial switches, and ``decides_at`` where it agrees (``decide``)."""

    def __init__(self, steps):
        self.steps = int(steps)
        self.state = FRESH if self.steps > 0 else DECIDED
        self.start = None           # the step the trial began at
        self.switches = ()          # the steps where keys change plan (kept once decided)
        self.kept = True            # the rule's plan stays (False: every key float32)
        self.compresses = False     # the rule compressed some key while the trial ran
        self.times = {}             # step -> this worker's clock at the step's first key
        self.seconds = None         # agreed (float32 s, plan s): sums of the medians

    def begin(self, step):
        """Start a trial at ``step`` (the rule's first decision with final inputs)."""
        if self.state == FRESH:
            self.state, self.start, self.times = RUNNING, int(step), {}
            self.switches = (self.start + self.steps, self.start + 2 * self.steps)
            self.compresses, self.seconds = False, None

    def retry(self):
        """Try again at the rule's next decision (a newly agreed rate)."""
        if self.steps > 0:
            self.state, self.kept = FRESH, True

    def clock(self, step):
        """This worker's clock at the first key of ``step``."""
        if self.state == RUNNING:
            self.times[step] = time.perf_counter()

    def float32(self, step):
        """True if a key goes float32 at ``step`` whatever the rule says: the trial's
        float32 phase, or a trial that kept float32."""
        if self.state == RUNNING:
            return step < self.start + self.steps or not self.compresses
        return not self.kept

    def wants(self, compressed):
        """Note what the rule chose for a key during the float32 phase."""
        if self.state == RUNNING and compressed:
            self.compresses = True

    def replans_at(self, step):
        """The steps where keys change plan: the plan phase's first, and the step after
        it (where the trial decides, before its keys re-plan)."""
        return step in self.switches

    def decides_at(self, step):
        return self.state == RUNNING and step == self.start + 2 * self.steps

    def phase_seconds(self, first):
        """This worker's median step of the phase that began at step ``first``, its
        first step left out (0.0 if it timed fewer than one)."""
        steps = range(first + 1, first + self.steps)
        seconds = [self.times[s + 1] - self.times[s] for s in steps
                   if s in self.times and s + 1 in self.times]
        return statistics.median(seconds) if seconds else 0.0

    def decide(self, share, workers):
        """Agree on the plan (one Sum round, if the rule compressed some key): every
        worker keeps the rule's plan if the workers' medians with it sum lower.
        ``seconds``: the workers' mean median step of each phase."""
        if self.compresses:
            from mxnet import ndarray
            mine = [self.phase_seconds(self.start), self.phase_seconds(self.start + self.steps)]
            total = share(ndarray.array(mine, dtype=np.float32)).asnumpy()
            self.seconds = (float(total[0]) / workers, float(total[1]) / workers)
            self.kept = self.seconds[1] < self.seconds[0]
        self.state, self.times = DECIDED, {}

    def as_dict(self):
        """Where the trial is and what it found, for policy_report: 'start' (its first
        step), 'steps', 'decided', 'tried' (False: the rule compressed no key, so
        nothing was timed), the workers' mean median step of each phase ('float32_s',
        'plan_s') and 'kept' (the rule's plan stays); None before it began."""
        if self.start is None:
            return None
        return {'start': self.start, 'steps': self.steps, 'decided': self.state == DECIDED,
                'tried': self.seconds is not None,
                'float32_s': None if self.seconds is None else self.seconds[0],
                'plan_s': None if self.seconds is None else self.seconds[1],
                'kept': self.kept}
