"""policy='auto''s plans tried in the job before one is kept: a few steps with every
key float32, a few with the rule's plan, a few with every key compressed, and the fastest
stays.

Why: the rule (policy.py) prices a key by its codec seconds and its bytes, as if the
key travelled alone. In a job a key costs otherwise: a compressed key's encoder waits for
its gradient, the plugin's operators run one after another in MXNet's engine (so
compressed keys' rounds follow one another: docs/DESIGN.md, "What a step may wait for in
the engine"), and a float32 transfer partly hides behind the backward pass. On the
emulated cluster at 1 Gbit/s and unshaped links the rule compressed one or two of the
resnet-like net's conv layers where every key float32 was faster, and sent the vgg-like
net float32 at 8 workers where Hylo's plan was faster (docs/COST_MODEL.md). The job's own
step times see every such cost, whatever its cause, so the plan is chosen by them.

How (``PlanTrial``): from the step the rule first decides with its final inputs (the
agreed rate and codec seconds), or from step ``start`` if that is later (until then the
keys follow the rule's plan), ``steps`` steps go all float32 (``FLOAT32``), then
``steps`` with the rule's plan (``RULE``) if it compresses some key, then ``steps`` with
every key the scheme would compress compressed (``SCHEME``) if the rule sent some of them
float32: one round. Each worker times its steps (from one step's first key to the next
step's), leaves out the first step of each plan (it carries the switch: a re-plan, a
first compressed round), and takes each plan's median over the rounds so far, with its
noise (the median's standard error, from the steps' median absolute deviation). One Sum
round gives every worker the workers' sums of both, so every worker takes the same
decision: the faster compressed plan if it beats float32 by ``KEEP_MARGIN``, else every
key float32 (compression delays part of the gradient in the residual: a plan that is not
clearly faster is not worth it). A plan is out of the running once the choice beats it
by ``CLEAR`` times their joint noise, or once it is within ``INDIFFERENT`` of the
choice (as good, for a policy whose promise is a step within 5% of the better fixed
choice); while some plan is in neither case, another round of the choice and those
plans, up to ``rounds`` (``trial_rounds``). Where the plans differ many-fold (slow links)
one round decides; where they differ by 5-20% and their steps are noisy (several workers
on few cores: a plan's steps spread by 12-49% around their median at 4 workers on 2
cores) more rounds resolve them. Plans that close are not worth more rounds: every
switch of plan costs the run accuracy (a key leaving its codec hands its residual over
in one step, one entering starts with none), and on loopback at 4 workers, where the
plans are within a few percent, rounds of every plan ran to the short run's end (10
switches) and ended 1.3 points below ``dist_sync`` over 8 seeds, one round 0.3
(docs/COST_MODEL.md, "Accuracy"). A re-plan at a newly agreed rate tries again.

Where float32 cannot win, it is not tried: at a slow link its steps cost the most
(23 s each at 8 workers and 50 Mbit/s on the vgg-like net, where Hylo's plan takes
4.5). The steps before the trial run the rule's plan; the workers agree on their
median (one Sum round where the trial begins), and if every key float32 would spend
more than ``SKIP_FLOAT32`` times that step on the busiest link alone (the cost model's
float32 wire seconds of the keys the scheme would compress, summed: a bound no overlap
with compute can beat), the trial times only the compressed plans.

Why not from the first steps (``start``, ``trial_start``, 30 by default): a run's first
steps are its most fragile, and a plan switched there can tip it over. On cnn512 at 4
workers and a constant rate of 0.05 with momentum 0.9, Hylo's own run of one seed of six
jumped to a loss of 4.5 at step 15 and recovered; the trial, which had switched float32
to compressed at step 7 and back at step 13, jumped to 9 there and spent the rest of the
epoch at chance, ending 5 points below ``dist_sync`` (and 2 on the long schedule).
Begun at step 30, and made to end on float32 as that seed's had, six seeds ended at
most 0.7 points below ``dist_sync`` (0.1 above on average), that seed 0.3 above
(docs/COST_MODEL.md, "Accuracy").

The cost: a few steps at slower plans, once (and at each new rate), against a plan that
may cost every step 10% or more.
"""
import statistics
import time

import numpy as np

# The plans a trial times, in order.
FLOAT32, RULE, SCHEME = 'float32', 'rule', 'scheme'
# A compressed plan is kept only if its step is this much shorter than float32's.
KEEP_MARGIN = 0.03
# Float32 is not tried if its wire seconds alone exceed this many times the rule's step.
SKIP_FLOAT32 = 2.0
# A plan is out of the running once the choice beats it by this many times their joint
# noise ...
CLEAR = 2.0
# ... or once it is within this fraction of the choice's step (as good as the choice).
INDIFFERENT = 0.05
# The standard error of a median of n normal samples: MEDIAN_SE * MAD / sqrt(n) (the MAD
# scaled to a standard deviation, 1.4826, times the median's efficiency, 1.2533).
MEDIAN_SE = 1.4826 * 1.2533

# States of a trial.
FRESH = 'fresh'          # not begun: begins at the rule's first decision with final
                         # inputs at or after its earliest step
RUNNING = 'running'
DECIDED = 'decided'


class PlanTrial:
    """One worker's trial of the plans (module docstring).

    ``steps``: steps a plan (0: no trial; the rule's plan is kept untried); ``start``:
    the first step a trial may begin at (``begin`` waits for it); ``rounds``: at most
    this many rounds of the plans. The store
    calls ``clock`` at each step's first key; the scheme tells ``noted`` what the rule
    chose for a key, asks ``plan(step)`` which plan its keys follow, ``replans_at``
    where the trial switches, and ``decides_at`` where it agrees (``decide``)."""

    def __init__(self, steps, start=0, rounds=1):
        self.steps, self.earliest, self.max_rounds = int(steps), int(start), int(rounds)
        self.state = FRESH if self.steps > 0 else DECIDED
        self.start = None           # the step the trial began at
        self.kept = RULE            # the plan that stays once decided
        self.compresses = False     # the rule compressed some key (RULE is tried)
        self.declines = False       # the rule sent some key float32 (SCHEME is tried)
        self.reruns = []            # the plans of each round after the first, in order
        self.times = {}             # step -> this worker's clock at the step's first key
        self.seconds = None         # {plan: the workers' mean median step}, once agreed
        self.noise = None           # {plan: the workers' mean standard error of it}
        self.decided_at = None      # the step it decided at
        self.worker_steps = None    # {plan: this worker's timed step seconds}, once agreed
        self.before = {}            # step -> clock at its first key, before the trial
        self.before_s = 0.0         # the workers' mean median step before it (agree_before)
        self.pricing = (None, 0.0, False)   # (step, float32 wire s, a key compressed) of
                                            # the rule's decision being made
        self.last_priced = (0.0, False)     # ... of the last complete decision
        self.skips_float32 = False  # float32 cannot win: not tried (SKIP_FLOAT32)

    def begin(self, step):
        """Start a trial at ``step`` (the rule's decision with final inputs), unless it
        is before ``start``: then the rule's plan stays, and the keys re-plan at
        ``start`` (``replans_at``), whose decision begins it."""
        if self.state == FRESH and step >= self.earliest:
            self.state, self.start, self.times, self.reruns = RUNNING, int(step), {}, []
            self.compresses = self.declines = False
            self.seconds = self.noise = self.decided_at = self.worker_steps = None
            wire, compressed = self.last_priced
            self.skips_float32 = bool(compressed and self.before_s > 0
                                      and wire > SKIP_FLOAT32 * self.before_s)
            self.before, self.before_s = {}, 0.0

    def retry(self):
        """Try again at the rule's next decision (a newly agreed rate)."""
        if self.steps > 0:
            self.state, self.kept = FRESH, RULE
            self.before, self.before_s = {}, 0.0

    def priced(self, step, compressed, wire_seconds):
        """What the rule chose for a key at ``step`` and the float32 wire seconds of its
        tensor (policy.float32_wire_seconds), called as each key is planned, before
        ``begin``: a step's sums are complete when the next decision's first key
        comes, so the trial weighs the decision before the one it begins at."""
        at, wire, any_compressed = self.pricing
        if step != at:
            if at is not None:
                self.last_priced = (wire, any_compressed)
            at, wire, any_compressed = step, 0.0, False
        self.pricing = (at, wire + wire_seconds, any_compressed or compressed)

    def begins_at(self, step):
        """True at ``trial_start``, where the trial begins after steps of the rule's
        plan: the workers then agree on their step (``agree_before``)."""
        return self.state == FRESH and self.earliest > 0 and step == self.earliest

    def agree_before(self, share, workers):
        """One Sum round: the workers' mean of their median step before the trial (the
        first clocked step left out: it carries the rule's re-plan)."""
        from mxnet import ndarray
        steps = sorted(self.before)[1:]
        mine = _median([self.before[s + 1] - self.before[s] for s in steps
                        if s + 1 in self.before])
        total = share(ndarray.array([mine, 1.0 if mine > 0 else 0.0],
                                    dtype=np.float32)).asnumpy()
        self.before_s = float(total[0] / total[1]) if total[1] == workers else 0.0

    def noted(self, compressed):
        """What the rule chose for a key (called as each key is planned)."""
        if self.state == RUNNING:
            self.compresses = self.compresses or compressed
            self.declines = self.declines or not compressed

    def plans(self):
        """The plans this trial times, in order (every key's choice is made at the
        trial's first step, so this is fixed from the next step on)."""
        compressed = [RULE] * self.compresses + [SCHEME] * self.declines
        return compressed if self.skips_float32 and compressed else [FLOAT32] + compressed

    @property
    def rounds(self):
        """Rounds of the plans so far (the one running included)."""
        return 1 + len(self.reruns)

    def schedule(self):
        """The plan of each phase so far: the first round's plans, then each later
        round's (the plans still in the running)."""
        return self.plans() + [p for plans in self.reruns for p in plans]

    def plan(self, step):
        """The plan keys follow at ``step``: FLOAT32, RULE or SCHEME."""
        if self.state != RUNNING:
            return self.kept
        schedule = self.schedule()
        return schedule[min((step - self.start) // self.steps, len(schedule) - 1)]

    def clock(self, step):
        """This worker's clock at the first key of ``step`` (before the trial too)."""
        if self.state == RUNNING:
            self.times[step] = time.perf_counter()
        elif self.state == FRESH:
            self.before[step] = time.perf_counter()

    def _end(self):
        return self.start + self.steps * len(self.schedule())

    def replans_at(self, step):
        """The steps where keys change plan: each plan's first, and the step after the
        round's last plan (where the trial decides, or begins another round, before its
        keys re-plan)."""
        if self.state == RUNNING:
            return step > self.start and (step - self.start) % self.steps == 0 \
                and step <= self._end()
        if self.state == FRESH:
            return step == self.earliest
        return step == self.decided_at

    def decides_at(self, step):
        return self.state == RUNNING and step == self._end()

    def phase_steps(self, first):
        """This worker's step seconds of the plan that began at step ``first``, its first
        step left out."""
        steps = range(first + 1, first + self.steps)
        return [self.times[s + 1] - self.times[s] for s in steps
                if s in self.times and s + 1 in self.times]

    def plan_steps(self):
        """{plan: this worker's timed steps of it, over the rounds so far}."""
        found = {}
        for i, p in enumerate(self.schedule()):
            found.setdefault(p, []).extend(self.phase_steps(self.start + i * self.steps))
        return found

    def decide(self, share, workers, step):
        """At the end of a round (``step``): one Sum round of every worker's medians and
        their noise (none if float32 is the only plan), so that every worker takes the
        same decision: keep a plan, or, while the choice is not clear and rounds are
        left, run another round of the plans still in the running."""
        plans = self.reruns[-1] if self.reruns else self.plans()
        kept = plans[0]
        if len(plans) > 1:
            from mxnet import ndarray
            self.worker_steps = self.plan_steps()
            mine = [_median(self.worker_steps[p]) for p in plans] + \
                [_median_error(self.worker_steps[p]) for p in plans]
            total = share(ndarray.array(mine, dtype=np.float32)).asnumpy() / workers
            # (a plan out of the running keeps the medians of its last round)
            self.seconds = {**(self.seconds or {}), **dict(zip(plans, map(float, total)))}
            self.noise = {**(self.noise or {}),
                          **dict(zip(plans, map(float, total[len(plans):])))}
            kept, unresolved = self._choice(plans)
            if unresolved and self.rounds < self.max_rounds:
                self.reruns.append([p for p in plans if p == kept or p in unresolved])
                return
        self.kept = kept
        self.state, self.times, self.decided_at = DECIDED, {}, step

    def _choice(self, plans):
        """(the plan of ``plans`` to keep by the agreed medians, the others still in
        the running: neither beaten by CLEAR times their joint noise with the choice,
        nor within INDIFFERENT of its step). Float32 is weighed at (1 - KEEP_MARGIN)
        its step: the margin a compressed plan must beat it by."""
        weight = {p: self.seconds[p] * (1 - KEEP_MARGIN) if p == FLOAT32 else
                  self.seconds[p] for p in plans}
        kept = min(plans, key=weight.get)
        unresolved = []
        for p in plans:
            gap = weight[p] - weight[kept]
            noise = (self.noise[kept] ** 2 + self.noise[p] ** 2) ** 0.5
            if p != kept and INDIFFERENT * weight[kept] <= gap <= CLEAR * noise:
                unresolved.append(p)
        return kept, unresolved

    def as_dict(self):
        """Where the trial is and what it found, for policy_report: 'start' (its first
        step), 'steps', 'plans' (in the order tried), 'schedule' (the plan of each
        phase so far: the first round's, then the plans each later round ran), 'rounds',
        'decided', 'seconds' ({plan: the workers' mean median step}; None: nothing was
        timed, float32 the only plan), 'noise' ({plan: the workers' mean standard error
        of that median}), 'worker_steps' ({plan: this worker's timed steps in seconds}:
        what its median came from), 'kept' (the plan that stays) and 'float32_skipped'
        (float32 was not tried: SKIP_FLOAT32); None before it began."""
        if self.start is None:
            return None
        return {'start': self.start, 'steps': self.steps, 'plans': self.plans(),
                'schedule': self.schedule(), 'rounds': self.rounds,
                'decided': self.state == DECIDED,
                'seconds': self.seconds, 'noise': self.noise,
                'worker_steps': self.worker_steps,
                'kept': self.kept if self.state == DECIDED else None,
                'float32_skipped': self.skips_float32}


def _median(seconds):
    return statistics.median(seconds) if seconds else 0.0


def _median_error(seconds):
    """The standard error of ``seconds``' median, from their median absolute deviation
    (robust to the odd step a garbage collection or a neighbour stretches)."""
    if len(seconds) < 2:
        return 0.0
    middle = statistics.median(seconds)
    deviation = statistics.median(abs(t - middle) for t in seconds)
    return MEDIAN_SE * deviation / len(seconds) ** 0.5
