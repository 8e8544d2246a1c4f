"""A scheme = validated parameters + a policy choosing a codec for each tensor."""
import time

import numpy as np

from .. import params as _params
from .. import policy as _policy
from ..codecs import FP32Codec
from ..params import Param

# Parameters every scheme accepts: how the transport cuts large tensors.
COMMON_PARAMS = {
    'chunk_size': Param('int', 1 << 20, 'largest chunk (elements) that travels as one key; '
                        'larger tensors are cut and spread over the servers; lower it to '
                        'spread a model with few large tensors over more servers',
                        low=1024, rank='leave'),
}

# policy='auto' (kvstore_ext/policy.py), for a scheme that offers it
POLICY_PARAMS = {
    'policy': Param('str', 'compress', "'compress': every tensor the scheme compresses is "
                    "compressed; 'auto': per tensor, at its first step, float32 or "
                    "compressed, whichever the cost model (docs/COST_MODEL.md) predicts "
                    "faster at link_rate, with the codec seconds of codec_times",
                    choices=('compress', 'auto'), rank='leave'),
    'link_rate': Param('float', 0.0, "policy='auto': every node's link rate in bits/s "
                       '(e.g. 1e9); 0: measured on the init/broadcast rounds and the first '
                       'step (sent float32), agreed by the workers, measured again every '
                       '%d steps on the tensors sent float32' % _policy.REMEASURE_STEPS,
                       low=0, rank='leave'),
    'codec_times': Param('str', 'measured', "policy='auto': the codecs' seconds it "
                         "weighs: 'measured' (each worker times the codecs it would "
                         'compress with on their shapes at step 1, the workers take the '
                         "slowest; with a given link_rate, step 0 decides by the shipped "
                         "table) or 'shipped' (the kernel table shipped with the package, "
                         'measured on another CPU alone: no timing, no round, decisions '
                         'known before a run, as advise and the cost model predict them)',
                         choices=('measured', 'shipped'), rank='leave'),
    'trial_steps': Param('int', 6, "policy='auto': the rule's plan is tried in the job "
                         'before it is kept: this many steps with every key float32, this '
                         "many with the rule's plan, this many with every key compressed, "
                         'and the fastest stays (plan_trial.py); again at a newly agreed '
                         "rate. 0: the rule's plan is kept untried",
                         low=0, rank='leave',
                         refused={1: "a plan's first step carries the switch and is not "
                                     'timed: one step would time nothing'}),
    'trial_start': Param('int', 30, "policy='auto': the first step the plans may be tried "
                         "at; until then the keys follow the rule's plan. A run's first steps "
                         'are its most fragile: plans switched there tipped one seed of six '
                         'of a small CNN over (plan_trial.py). 0: from the first decision',
                         low=0, rank='leave'),
    'trial_rounds': Param('int', 4, "policy='auto': at most this many rounds of the "
                          'plans: another round of the fastest and the plans neither beaten '
                          "by twice their steps' noise nor within 5% of it (plans 5-20% "
                          'apart on a noisy host; each switch of plan costs accuracy: '
                          'plan_trial.py). 1: one round, the medians decide',
                          low=1, rank='leave'),
}

# The size rule's parameter (Scheme.exempt), as most schemes declare it: one default
# everywhere, so that a comparison of schemes compresses the same tensors.
SIZE_THRESHOLD = Param('int', 32768, 'tensors with fewer elements go uncompressed (biases, '
                       'small layers); the same default in every scheme that declares it, so '
                       'that they compress the same tensors (PowerSGD decides by bytes '
                       'instead)', low=0, rank='leave')


class Scheme:
    """Subclasses set ``name`` (the kvstore type becomes ``dist_sync_<name>``),
    ``PARAMS`` (name -> params.Param, declared in rank order), ``REMOVED`` (name ->
    params.Removed: parameters that are gone, refused with their reason) and implement
    ``codec_for``."""

    name = None
    PARAMS = {}
    REMOVED = {}
    # Workers the codecs serve: the store sets it before it plans a key, so a policy may
    # choose by it (Hylo's agreement='auto'); 1 outside a store (plan, --list).
    num_workers = 1
    # A function returning the optimizer's current learning rate, once the store has
    # the optimizer (store.follow, or found: handover.py); a scheme whose codecs follow
    # the schedule reads it when it makes them (Hylo's conv masking). None: not known.
    learning_rate = None

    def __init__(self, **given):
        self.params = _params.validate(dict(COMMON_PARAMS, **self.PARAMS), given, self.name,
                                       self.REMOVED)
        self.check(self.params)
        # the parameters the user set: a handed-over optimizer momentum (handover.py)
        # never overrides them
        self.given = frozenset(given)
        # codecs policy='auto' was asked about before the workers agreed on codec times
        self._candidates = {}

    def check(self, params):
        """Checks that involve several parameters; raise ValueError."""

    def codec_for(self, shape, dtype, step=0):
        """The codec for a tensor of ``shape`` and ``dtype`` at ``step`` (how many steps
        its key has taken): at a key's first step, and at every step ``replans_at``."""
        raise NotImplementedError

    def replans_at(self, step):
        """True if ``codec_for`` may choose differently at ``step`` than before: the store
        then asks it again (every worker at the same step, so their plans agree), and
        keeps a key's codec if it encodes the same. Schemes that re-plan override this
        (warm-up, layer-wise adaptation)."""
        return False

    # -- policies that depend on measurements (layer-wise adaptation) ---------------
    # The store calls these; the defaults do nothing, so a scheme that chooses by
    # shape alone implements only ``codec_for``.
    def codec_for_key(self, key, shape, dtype, step=0):
        """The codec of kvstore key ``key``: what the store asks. A policy that gives
        layers of the same shape different codecs overrides this; by default the
        choice depends on the shape only (``codec_for``)."""
        return self.codec_for(shape, dtype, step=step)

    def bind(self, key, arrays):
        """``arrays``: the NDArrays a ``pushpull``/``push`` of ``key`` was given (one per
        device), handed over once per key and again whenever the caller passes other
        arrays, before the key is planned. A scheme that needs to know which tensor
        the key is beyond its shape (dAD matches a key to the Dense layer whose weight
        gradient these arrays are) overrides it; by default nothing happens."""

    def attach(self, net):
        """``net``: the Gluon network being trained, given by ``kv.attach(net)`` before
        its first forward pass. A scheme that compresses from what the layers compute
        rather than from the gradient alone hooks into them here (dAD captures its
        Dense layers' inputs and output gradients); by default nothing happens."""

    def observes(self, key, step, rank):
        """True if the scheme wants to see ``key``'s error-compensated gradient at
        ``step`` on the worker of ``rank`` (``observe``); the store forms it only then."""
        return False

    def observe(self, key, acc, step):
        """``acc``: what the key's codec compresses this step, before it encodes it
        (``Codec.compressed_input``: the gradient summed over this worker's devices
        plus its residual; with DGC's momentum correction the velocity plus the
        residual), a fresh float32 array, the scheme's to keep."""

    def settle(self, step, rank, share):
        """Called once at every ``step`` where ``replans_at`` holds, on every worker,
        before the first key is re-planned: the scheme may settle what its plans
        depend on. ``share(array)`` returns the float32 sum of ``array`` over the
        workers (a round through the transport; every worker must call it as often and
        with the same shape); a worker that should not contribute passes zeros."""
        self.settle_policy(share, rank, step)

    def state(self):
        """What the policy decided from measurements and must survive a checkpoint
        (JSON-serialisable, saved with the compression state); None: nothing."""
        return None

    def restore(self, state):
        """Take back what ``state`` gave (None from files without it)."""

    def param_specs(self):
        """{name: params.Param} declaring every entry of ``self.params`` (what a check
        of the workers' parameters shows by name, fingerprint.py)."""
        return dict(COMMON_PARAMS, **self.PARAMS)

    def exempt(self, shape, dtype):
        """True if a tensor goes uncompressed by the rule every scheme with a
        ``size_threshold`` shares: it is not float32 (the kernels encode float32), or
        it has fewer than ``size_threshold`` elements (biases, norms: few bytes, and
        the ones compression would hurt most). One rule, so that every scheme leaves
        the same tensors alone and a comparison of schemes compares the same layers."""
        size = int(np.prod(shape)) if len(shape) else 1
        return np.dtype(dtype) != np.float32 or size < self.params['size_threshold']

    # -- policy='auto' (kvstore_ext/policy.py): float32 or compressed, per key -----
    # A scheme offering it declares POLICY_PARAMS, passes its compressing codecs
    # through ``by_policy`` and lets ``replans_at`` hold where ``policy_replans_at`` does.
    link_meter = None           # this worker's measured link rate (link_rate=0)
    agreed_rate = 0.0           # bits/s the workers agreed on (link_rate=0)
    agreed_round_s = 0.0        # seconds of a round with no bytes, agreed with the rate (0
                                # with a given link_rate: nothing is timed)
    agreed_bytes = 0.0          # the link bytes of the rounds the agreed rate came from
    codec_speeds = None         # agreed codec seconds (codec_times='measured', codec_timing.py)
    codec_timing_s = None       # what timing and agreeing on them took this worker (once)
    trial = None                # the plans tried in the job (plan_trial.py)
    # A hook: (codec, workers, chunk_size) -> {cost.signature of a chunk codec: (worker s,
    # servers' s per payload)}, this worker's timing; None: codec_timing.measure
    codec_timer = None

    def by_policy(self, codec, step):
        """``codec``, or float32 where policy='auto' predicts that faster (policy.py):
        the given ``link_rate``, else the agreed measured one (float32 until agreed),
        with the agreed codec seconds once settled (codec_times='measured'), else the
        shipped table; then tried in the job against every key float32 and every key
        compressed (plan_trial.py)."""
        if self.params.get('policy', 'compress') != 'auto':
            return codec
        untimed = self.times_codecs() and self.codec_speeds is None
        if untimed:
            from ..cost import signature
            self._candidates.setdefault(signature(codec), codec)
        rate = self.params['link_rate'] or self.agreed_rate
        if rate <= 0:
            return self.uncompressed(codec.shape, np.float32) if step == 0 else codec
        servers, chunk_size = _policy.servers(), self.params['chunk_size']
        float32_wire = _policy.float32_wire_seconds(codec.shape, self.num_workers, servers,
                                                    rate, chunk_size, self.agreed_round_s)
        compressed = _policy.compresses(codec, self.num_workers, servers, rate, chunk_size,
                                        self.codec_speeds, self.agreed_round_s, float32_wire)
        if untimed:                 # not final: the codecs' seconds come at step 1
            return codec if compressed else self.uncompressed(codec.shape, np.float32)
        from .. import plan_trial
        trial = self.plan_trial()
        trial.priced(step, compressed, float32_wire)
        trial.begin(step)
        trial.noted(compressed)
        plan = trial.plan(step)
        if plan == plan_trial.SCHEME or plan == plan_trial.RULE and compressed:
            return codec
        return self.uncompressed(codec.shape, np.float32)

    def plan_trial(self):
        """policy='auto''s trial of the plans in the job (plan_trial.py), made at first use."""
        if self.trial is None:
            from ..plan_trial import PlanTrial
            self.trial = PlanTrial(self.params['trial_steps'], self.params['trial_start'],
                                   self.params['trial_rounds'])
        return self.trial

    def step_started(self, step):
        """Called by the store at the first key of every step: the trial's clock."""
        if self.trial is not None:
            self.trial.clock(step)

    def measures_link(self, step):
        """True if this worker times its rounds of ``step`` (init/broadcast: 0): with
        policy='auto' and link_rate=0, at the first step and the step before a re-plan."""
        if self.params.get('policy', 'compress') != 'auto' or self.params['link_rate']:
            return False
        if self.link_meter is None:
            self.link_meter = _policy.LinkMeter()
        return step == 0 or (step + 1) % _policy.REMEASURE_STEPS == 0

    def policy_replans_at(self, step):
        """Steps where policy='auto' re-plans: with a measured rate the first after the
        measured first step, then every REMEASURE_STEPS; with measured codec times
        the first (the workers time their codecs and agree there); where its trial
        switches plans."""
        return (self.measures_link(0) and (step == 1 or step % _policy.REMEASURE_STEPS == 0)
                or self.times_codecs() and step == 1
                or self.trial is not None and self.trial.replans_at(step))

    def times_codecs(self):
        """True if policy='auto' weighs codec seconds timed on the workers."""
        return (self.params.get('policy', 'compress') == 'auto'
                and self.params['codec_times'] == 'measured')

    def settle_policy(self, share, rank, step):
        """Agree on the codecs' seconds (once, codec_timing.py) and on the measured
        rate (one Sum round each); keep the agreed rate unless it moved by more than
        policy.RATE_CHANGE times on enough bytes (policy.adopts: then the plan is tried
        again); at the end of a round of the trial, agree on its plan, and where it
        begins, on the step before it (plan_trial.py)."""
        if self.trial is not None and self.trial.decides_at(step):
            self.trial.decide(share, self.num_workers, step)
        if self.trial is not None and self.trial.begins_at(step):
            self.trial.agree_before(share, self.num_workers)
        if self.times_codecs() and self.codec_speeds is None:
            from .. import codec_timing
            start = time.perf_counter()
            self.codec_speeds = codec_timing.settle(
                self._candidates, self.num_workers, rank, self.params['chunk_size'], share,
                self.codec_timer)
            self.codec_timing_s = time.perf_counter() - start
        if not self.measures_link(0):
            return
        rate, round_s, link_bytes = _policy.agree_rate(self.link_meter, self.num_workers,
                                                       share)
        self.link_meter.restart()
        if _policy.adopts(self.agreed_rate, self.agreed_bytes, rate, link_bytes):
            if self.agreed_rate > 0 and self.trial is not None:
                self.trial.retry()
            self.agreed_rate, self.agreed_round_s = rate, round_s
            self.agreed_bytes = link_bytes

    @staticmethod
    def uncompressed(shape, dtype):
        """Codec for tensors the scheme leaves alone: float32 pass-through."""
        return FP32Codec(shape)

    def plan(self, shapes):
        """{name: codec description} for a dict of shapes: what the policy decides."""
        return {k: self.codec_for(s, np.float32).describe() for k, s in shapes.items()}
