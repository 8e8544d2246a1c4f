"""L-GreCo's policy, whatever the compression parameter it chooses per layer.

Markov, Ramezanikebrya, Alistarh, "L-GreCo: Layerwise-adaptive gradient compression
for efficient data-parallel deep learning" (MLSys 2024, arXiv 2210.17357). The policy
is the same for every family of parameters (PowerSGD's rank: lgreco.py; Hylo's conv
filter count and FC threshold scale: lgreco_hylo.py); only what a candidate costs and
loses differs. ``LayerwiseChoice`` holds the policy, a family the rest. Per
``adjust_freq`` steps:

1. **Measure** (rank 0 only). Over the last ``window`` steps before a re-plan, rank 0
   adds up each layer's error-compensated gradient ``acc = grad + residual`` (what the
   codec compresses, ``velocity + residual`` with DGC's momentum correction; the store
   hands it over: ``Scheme.observe``) in float64.
2. **Options** (the family's ``layer_options``): for every candidate ``c`` of every
   layer, ``error(l, c)`` (Frobenius norm of what the codec with ``c`` would lose on
   that sum, chunk by chunk as the codec cuts the tensor) and ``size(l, c)`` (the
   words a step pushes); candidates that would not compress the layer at least 2x
   are left out, except the default.
3. **Choose** (knapsack.py): budget = sum over layers of ``error(l, default)``; errors
   in ``buckets`` buckets of budget / buckets; a dynamic programme picks the
   candidates of least total size within the budget (the default always fits).
4. **Share**: rank 0's choice (one float32 value a layer, layers in the order of their
   kvstore keys) reaches every worker through a Sum round in which only rank 0
   contributes non-zero values (``Scheme.settle``), so that every worker compresses
   every layer alike (additive codecs need it; so do reproducible runs). Every worker
   checks that each value is one of the layer's candidates.
5. **Switch**: every worker re-plans its keys at the same step (``replans_at``); the
   residual is kept (it is the tensor's). Changes are logged per layer.

The first ``adjust_freq`` steps use the default. Checkpoints keep the values in force
(``state``), not a measurement in progress: after a resume the next re-plan measures
only the steps of its window taken since.

A family (a Scheme subclass listed after this mixin) has a ``warmup_steps`` parameter
and implements ``layer_default``, ``candidates``, ``codec_with`` and
``layer_options``; ``steady_step`` and ``value_text`` have defaults.
"""
import logging

import numpy as np

from .. import knapsack
from ..memory import file_key, parse_file_key
from ..params import Param

# candidates: the default times these factors (L-GreCo's range, half to twice)
FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
MIN_RATIO = 2.0       # a candidate must compress its layer at least this much
log = logging.getLogger('kvstore_ext')

PARAMS = {
    'adjust_freq': Param('int', 32, 're-choose the layers\' parameters every this many '
                         'steps: set it to the steps of an epoch (L-GreCo re-chooses once '
                         'an epoch; 32 is one of the bundled MNIST runs at 4 workers)',
                         low=1, rank='tune'),
    'window': Param('int', 10, 'steps of compensated gradients measured before each '
                    're-choice (at most adjust_freq)', low=1, rank='leave'),
    'buckets': Param('int', knapsack.BUCKETS, 'the error budget is cut into this many '
                     'buckets (knapsack resolution)', low=1, rank='expert'),
}


class LayerwiseChoice:
    """The policy (see the module docstring); mix in before the family's Scheme."""

    family = 'parameters'     # what the log calls the values (e.g. 'ranks')

    # -- what a family defines --------------------------------------------------------
    def layer_default(self, shape, dtype):
        """The default value of a layer the family chooses for, or None (a tensor the
        policy leaves to the scheme's own ``codec_for``)."""
        raise NotImplementedError

    def candidates(self, shape):
        """Every value a layer of ``shape`` may take (sorted; holds the default)."""
        raise NotImplementedError

    def codec_with(self, shape, dtype, value):
        """The layer's codec with the family parameter ``value``."""
        raise NotImplementedError

    def layer_options(self, shape, summed):
        """[(value, error, size)] of the candidates for a layer whose measured sum of
        compensated gradients is ``summed`` (float64, the tensor's shape): those that
        compress it at least ``MIN_RATIO`` x, and the default always."""
        raise NotImplementedError

    def steady_step(self):
        """The first step at which chosen values apply (before: the scheme's own
        warm-ups, ``codec_for``)."""
        return self.params['warmup_steps']

    def value_text(self, shape, value):
        return '%g' % value

    # -- set-up and schedule ----------------------------------------------------------
    def check(self, params):
        super().check(params)
        if params['window'] > params['adjust_freq']:
            raise ValueError('window (%d) must not exceed adjust_freq (%d)'
                             % (params['window'], params['adjust_freq']))
        self._layers = {}       # key -> shape: keys the family chooses for
        self._choice = {}       # key -> value chosen at the last settle
        self._sums = {}         # key -> float64 array: rank 0's measurement
        self.history = []       # (step, {key: value}) of every settle (inspection)

    def replans_at(self, step):
        return super().replans_at(step) or \
            (step > 0 and step % self.params['adjust_freq'] == 0)

    def observes(self, key, step, rank):
        """Rank 0, the ``window`` steps before each multiple of ``adjust_freq``."""
        p = self.params
        return (rank == 0 and key in self._layers and step >= p['warmup_steps']
                and p['adjust_freq'] - step % p['adjust_freq'] <= p['window'])

    # -- the codec of a key -----------------------------------------------------------
    def codec_for_key(self, key, shape, dtype, step=0):
        default = self.layer_default(shape, dtype)
        if default is None:
            return self.codec_for(shape, dtype, step)
        self._layers[key] = tuple(shape)
        if step < self.steady_step():
            return self.codec_for(shape, dtype, step)
        return self.codec_with(shape, dtype, self._choice.get(key, default))

    # -- measurement, choice, sharing -------------------------------------------------
    def observe(self, key, acc, step):
        summed = acc.asnumpy().astype(np.float64)
        if not np.isfinite(summed).all():       # a void step: not a gradient to measure
            return
        if key in self._sums:
            self._sums[key] += summed
        else:
            self._sums[key] = summed

    def ordered_layers(self):
        return sorted(self._layers, key=file_key)

    def measure(self):
        """(keys, errors, sizes, default indices, values) of rank 0's measurement, or
        None if some layer was not measured."""
        keys = self.ordered_layers()
        if not keys or any(k not in self._sums for k in keys):
            return None
        errors, sizes, defaults, values = [], [], [], []
        for key in keys:
            shape = self._layers[key]
            options = self.layer_options(shape, self._sums[key])
            values.append([v for v, _, _ in options])
            errors.append(np.array([e for _, e, _ in options], float))
            sizes.append(np.array([s for _, _, s in options], float))
            defaults.append(values[-1].index(self.layer_default(shape, np.float32)))
        return keys, errors, sizes, defaults, values

    def choose(self):
        """{key: value} from rank 0's measurement (the values in force if incomplete)."""
        measured = self.measure()
        if measured is None:
            return {k: self.value_of(k) for k in self.ordered_layers()}
        keys, errors, sizes, defaults, values = measured
        picked = knapsack.choose(errors, sizes, defaults, self.params['buckets'])
        return {k: values[i][c] for i, (k, c) in enumerate(zip(keys, picked))}

    def value_of(self, key):
        return self._choice.get(key, self.layer_default(self._layers[key], np.float32))

    def settle(self, step, rank, share):
        if step % self.params['adjust_freq']:
            return                                   # the end of a warm-up only
        from mxnet import ndarray
        keys = self.ordered_layers()
        mine = np.zeros(max(len(keys), 1), np.float32)
        if rank == 0:
            chosen = self.choose()
            mine[:len(keys)] = [chosen[k] for k in keys]
        total = share(ndarray.array(mine, dtype=np.float32)).asnumpy()
        self._sums = {}
        choice = {}
        for key, sent in zip(keys, total):
            allowed = self.candidates(self._layers[key])
            match = [c for c in allowed if np.float32(c) == sent]
            if not match:
                raise RuntimeError('L-GreCo: rank 0 sent %r for key %r, not one of %s'
                                   % (float(sent), key, allowed))
            choice[key] = match[0]
        self.log_changes(step, choice)
        self._choice = choice
        self.history.append((step, dict(choice)))

    def log_changes(self, step, choice):
        """One line per re-plan that changes something: the layers whose value moved."""
        moved = ['%s: %s -> %s' % (k, self.value_text(self._layers[k], self.value_of(k)),
                                  self.value_text(self._layers[k], v))
                 for k, v in choice.items() if v != self.value_of(k)]
        if moved:
            log.info('L-GreCo at step %d, %s: %s', step, self.family, ', '.join(moved))

    # -- checkpoints ------------------------------------------------------------------
    def state(self):
        """The values in force (every worker holds the same), saved with checkpoints,
        with what the scheme below keeps (Hylo's masking peak)."""
        return dict(super().state() or {},
                    choice={file_key(k): v for k, v in self._choice.items()})

    def restore(self, state):
        super().restore(state)
        if state:
            self._choice = {parse_file_key(k): v for k, v in state['choice'].items()}


def around(default, integer):
    """Sorted candidates: ``default`` times FACTORS (integers rounded, at least 1)."""
    if integer:
        return sorted({max(1, int(round(default * f))) for f in FACTORS})
    return sorted({float(default * f) for f in FACTORS})
