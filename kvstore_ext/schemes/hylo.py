"""Hylo: hybrid, layer-aware gradient compression (see shared/papers/hylo.md).

Per tensor, after the worker has summed its devices, with ``acc = grad + residual``
(what is not sent stays in the residual: error feedback):

1. Tensors smaller than ``size_threshold`` elements go float32.
2. Conv weights (3-D and more, output filters first): the top ``k = ceil(rate * O)``
   filters by the L2 norm of their slice of ``acc`` are sent, with a layer-adaptive
   rate, smaller for larger layers::

       rate(n) = clip(conv_rate_max * sqrt(size_threshold / n), conv_rate_min, conv_rate_max)

   times ``homomorphic_conv_scale`` in homomorphic mode (every worker sends the same
   agreed filters there, so a step updates k filters, not the union of each worker's).
3. FC weights (2-D) and other large tensors: ``t = fc_scale * mean|acc|``, capped at
   max|acc| (where the cap decides, a code stands for t, so the largest value always
   goes); each value becomes 0 or +-2t where |acc| >= t: acc rounded to the nearest
   multiple of 2t, clipped to +-1, packed as base-3 digits (``FC_VALUE``).
4. Aggregation: ``'homomorphic'`` (workers agree on t and the filter set, from the
   previous aggregate or by a round, ``agreement``, so the stock server adds payloads
   and pulls are compressed) or ``'server'`` (the server decodes and sums).
5. From ``MOMENTUM_CORRECTION_WORKERS`` workers on, with the optimizer's momentum
   (handover.py), DGC's momentum correction: the conv top-k selects velocities, with
   factor masking while the learning rate is near its peak (``momentum_masking``), and
   the FC ternary codes the velocity.

The defaults, ranks and a tuning guide of every parameter are in ``PARAMS`` below and
in the table of docs/schemes/hylo.md, which ``python -m kvstore_ext.params_doc`` writes from them; the
evidence for each default is cited there, not restated here.
"""
import logging
import math

import numpy as np

from .base import POLICY_PARAMS, Scheme
from ..codecs import (AdditiveTernaryCodec, AdditiveTopKCodec, FilterTopKCodec,
                      HighRateMasking, MomentumCorrected, TernaryCodec)
from ..params import Param, Removed

log = logging.getLogger('kvstore_ext')

# agreement='auto' takes 'conv_round' from this many workers on: at 8 workers the round
# beat the one-step-old filter scores of 'previous' by 3.2 points on cnn512's short run
# (16 seeds; docs/decisions/hylo-agreement.md); at 4 the two end equal and 'previous' reads
# nothing (its keys push without waiting).
CONV_ROUND_WORKERS = 8

# momentum_correction='auto' corrects from this many workers on (why: docs/schemes/hylo.md).
# Long runs at 8 workers would gain 0.3 points without it (10 seeds,
# docs/decisions/hylo-momentum-correction.md), but a kvstore cannot tell a long run from a short one.
MOMENTUM_CORRECTION_WORKERS = 8

# What a nonzero FC code stands for: 2t, acc rounded to the nearest multiple of 2t
# (codecs/ternary.py's value rule 'round').
FC_VALUE = 'round'

# Options measured not to work (params.Removed): passing one raises with the reason.
_FC_VALUE = Removed(
    "an FC code always stands for 2t (acc rounded to the nearest multiple of 2t, the "
    "former fc_value='round'): 'mean' (the mean |acc| of the sent values) left the tail "
    "of the largest values in the residual and lost 3.7 points of an 8-worker MLP, 't' "
    "(MXNet's 2-bit rule) drained a large value only t a step and lost 7 "
    "(bench/results/hylo_conv_rate_fc_value_probes.json, bench/results/hylo_fc_value_round_short.json)",
    'the default: drop fc_value', former_default='round')
_AGREEMENT_ROUND = Removed(
    "an extra round for the FC threshold as well as the conv filters costs a round trip "
    "a step on every key; the round was measured to help only for conv layers from %d "
    "workers on (+3.2 points over 'previous' on cnn512, "
    "bench/results/hylo_agreement_auto_8w.json), which 'auto' takes" % CONV_ROUND_WORKERS,
    "agreement='auto' (the default) or 'conv_round'")
_MASKING_ON = Removed(
    "masking always equals 'lr' at a constant learning rate, and under a decaying "
    "schedule it cost half a point of cnn512's long run that 'lr' recovers "
    "(bench/results/hylo_masking_high_rate_8w_long.json)",
    "momentum_masking='lr' (the default)")


class Hylo(Scheme):
    name = 'hylo'
    # Declared in rank order (params.py): the 'tune' knobs first, most useful first.
    PARAMS = {
        'conv_rate_max': Param('float', 0.3, 'share of filters a conv layer at the size '
                               'threshold sends (larger layers send less: rate(n) = '
                               'conv_rate_max * sqrt(size_threshold / n)); raise it if conv '
                               'layers lag (more bytes), lower it for fewer conv bytes',
                               low=0, low_open=True, high=1, rank='tune'),
        # fc_scale >= 0.01: a code stands for at most 2t, so a value drains at most
        # 2 * fc_scale * mean|acc| a step and the residual must grow to
        # 1 / (2 * fc_scale) steps of gradient before the sums carry it (50 at 0.01;
        # 1e-30 sent sums of ~0 for ever)
        'fc_scale': Param('float', 2.0, 'FC threshold t = fc_scale * mean|acc| (capped at '
                          'max|acc|): values with |acc| >= t are sent as +-2t; the bytes do '
                          'not change with it, only how much waits in the residual; 1.0 and '
                          '3.0 were tried and did not beat 2.0', low=0.01, rank='tune'),
        'size_threshold': Param('int', 32768, 'tensors with fewer elements go uncompressed '
                                '(biases, batch norm, small layers); raise it to keep a '
                                'small, sensitive layer float32 (more bytes)', low=0,
                                rank='tune'),
        'conv_rate_min': Param('float', 0.02, 'smallest layer-adaptive conv rate (the '
                               "largest layers' floor); raise it for very large conv layers",
                               low=0, low_open=True, high=1, rank='tune'),
        'warmup_steps': Param('int', 0, 'the first this many steps of every compressed '
                              'tensor go float32, then the key is re-planned; 5 helped cnn512 '
                              'at 8 workers in server mode before the momentum correction '
                              'existed, nothing else', low=0, rank='tune'),
        'aggregation': Param('str', 'homomorphic', "'homomorphic': workers agree on the FC "
                             "threshold and the filter set, the stock server adds payloads, "
                             "pushes and pulls are compressed; 'server': the paper's design, "
                             "the server decodes every payload and sums (fewer bytes pushed, "
                             "float32 pulled, more server CPU)",
                             choices=('homomorphic', 'server'), rank='leave'),
        'momentum': Param('float', 0.0, "the SGD optimizer's momentum, for DGC's momentum "
                          'correction of the conv top-k and the FC velocity coding; unless '
                          "set, the optimizer's, handed over (handover.py): set it only for "
                          'a loop without a Trainer or Module (0: off)',
                          low=0, high=0.999, rank='leave'),
        'momentum_correction': Param('str', 'auto', "with momentum > 0: where DGC's "
                                     "momentum correction of the conv top-k applies: 'auto' "
                                     "(from %d workers on, where short runs need it; below, "
                                     "its masking cost a third of a point), 'on', 'off' "
                                     "(plain error feedback)" % MOMENTUM_CORRECTION_WORKERS,
                                     choices=('auto', 'on', 'off'), rank='leave'),
        'fc_momentum_correction': Param('str', 'auto', "with momentum > 0: whether the "
                                        "FC ternary codes the worker's velocity (u = m u + "
                                        "grad, error feedback on u, no masking): 'auto' "
                                        "(from %d workers on), 'on', 'off' (the gradient)"
                                        % MOMENTUM_CORRECTION_WORKERS,
                                        choices=('auto', 'on', 'off'), rank='leave'),
        'momentum_masking': Param('str', 'lr', "with the correction: DGC's factor masking "
                                  "of a sent filter's velocity: 'lr' (while the learning "
                                  "rate is at least 0.8 of its peak; always when the rate "
                                  "is not known) or 'off' (never: server mode trains "
                                  "unstably at a high rate)", choices=('lr', 'off'),
                                  rank='leave', removed={'on': _MASKING_ON}),
        'agreement': Param('str', 'auto', "homomorphic only: how workers agree on t and "
                           "the filter set: 'auto' ('conv_round' from %d workers on, else "
                           "'previous'), 'previous' (the statistic carried by the previous "
                           "aggregate, no extra round) or 'conv_round' (an extra tiny round "
                           "per step for conv layers)" % CONV_ROUND_WORKERS,
                           choices=('auto', 'previous', 'conv_round'), rank='leave',
                           removed={'round': _AGREEMENT_ROUND}),
        'homomorphic_conv_scale': Param('float', 2.0, 'homomorphic only: the layer-adaptive '
                                        'conv rate times this (at most 1): all workers send '
                                        'one agreed filter set, where in server mode each '
                                        'sends its own and the sum covers their union',
                                        low=1, high=100, rank='leave'),
        'pull': Param('str', 'float32', "server aggregation only: what workers pull: "
                      "'float32' (the sum) or 'compressed' (the servers re-encode the sum "
                      "with the same codec and a residual of their own: fewer bytes, "
                      "lower accuracy at 8 workers); homomorphic pulls are always "
                      "compressed", choices=('float32', 'compressed'), rank='leave'),
        **POLICY_PARAMS,
        'conv_rate': Param('float', None, 'a fixed share of filters for every conv layer '
                           'instead of the layer-adaptive rate (overrides conv_rate_min/'
                           'max): for comparisons with a fixed-rate top-k', low=0,
                           low_open=True, high=1, optional=True, rank='expert'),
        # fc_threshold is in the gradient's own units: any finite value >= 0 may fit
        'fc_threshold': Param('float', 0.0, 'a fixed FC threshold in the gradient\'s units '
                              'if > 0, instead of the adaptive fc_scale * mean|acc|: for '
                              'comparisons with MXNet\'s 2-bit rule', low=0, rank='expert'),
    }

    REMOVED = {
        'fc_value': _FC_VALUE,
        'conv_warmup_steps': Removed(
            "DGC's conv sparsity warm-up narrowed cnn512's 8-worker short-run loss from ~6 "
            "to ~3 points over 5 seeds, a gain over the default that was not shown, and "
            "left the loss open (bench/results/hylo_conv_warmup_8w.json); the momentum "
            "correction from 8 workers on is what closed it",
            "the default (no conv warm-up); warmup_steps for a dense warm-up, "
            "momentum_correction for the 8-worker loss", former_default=0),
        'compress_layers': Removed(
            'a diagnostic for ablations (conv or FC layers float32), not a training option '
            '(bench/results/hylo_momentum_correction_long.json)',
            'size_threshold to keep small layers float32, or kvstore dist_sync_none to '
            'compare against float32', former_default='all'),
    }

    _warned = False     # 'lr' without a learning rate: said once

    def __init__(self, **given):
        super().__init__(**given)
        # 'lr': one masking for every key; its peak is the scheme's state
        self._high_rate = HighRateMasking()

    def check(self, params):
        if params['pull'] == 'compressed' and params['aggregation'] != 'server':
            raise ValueError("pull='compressed' is server aggregation's option: add "
                             "aggregation='server' (homomorphic pulls, the default, are "
                             "always compressed)")
        if params['conv_rate_min'] > params['conv_rate_max']:
            raise ValueError('conv_rate_min (%g) must not exceed conv_rate_max (%g)'
                             % (params['conv_rate_min'], params['conv_rate_max']))

    def conv_rate(self, size):
        """Share of a conv layer's filters sent: ``conv_rate`` if fixed, else the
        layer-adaptive formula, times ``homomorphic_conv_scale`` in homomorphic mode."""
        p = self.params
        if p['conv_rate'] is not None:
            return p['conv_rate']
        rate = p['conv_rate_max'] * math.sqrt(max(p['size_threshold'], 1) / size)
        rate = min(max(rate, p['conv_rate_min']), p['conv_rate_max'])
        if p['aggregation'] == 'homomorphic':
            rate = min(rate * p['homomorphic_conv_scale'], 1.0)
        return rate

    def conv_k(self, shape):
        """Filters sent of a conv tensor of ``shape``: ceil(rate * O), at least 1."""
        filters = shape[0]
        k = math.ceil(self.conv_rate(int(np.prod(shape))) * filters - 1e-9)
        return min(max(k, 1), filters)

    def replans_at(self, step):
        return step == self.params['warmup_steps'] > 0 or self.policy_replans_at(step)

    def codec_for(self, shape, dtype, step=0):
        if self.exempt(shape, dtype) or step < self.params['warmup_steps']:
            return self.uncompressed(shape, dtype)
        if len(shape) >= 3:
            k = self.conv_k(shape)
            if k == shape[0]:
                # all filters (a rate of 1): float32, no indices
                return self.uncompressed(shape, dtype)
            return self.by_policy(self.conv_codec(shape, k), step)
        return self.by_policy(self.fc_codec(shape, self.params['fc_scale']), step)

    def conv_agreement(self):
        """How the homomorphic conv codecs agree on the filter set: 'round' (an extra
        round a step) or 'previous'. The FC codecs always take 'previous': an FC round
        (agreement='round') was removed."""
        mode = self.params['agreement']
        if mode == 'auto':
            mode = 'conv_round' if self.num_workers >= CONV_ROUND_WORKERS else 'previous'
        return 'round' if mode == 'conv_round' else 'previous'

    def corrects_momentum(self, setting='momentum_correction'):
        """Whether the conv top-k runs DGC's momentum correction (``momentum`` > 0 and
        ``momentum_correction`` on, or 'auto' with enough workers); with ``setting``
        'fc_momentum_correction', whether the FC ternary codes the velocity."""
        p = self.params
        if p['momentum'] <= 0 or p[setting] == 'off':
            return False
        return p[setting] == 'on' or self.num_workers >= MOMENTUM_CORRECTION_WORKERS

    def masking(self):
        """The conv codecs' ``masking``: False ('off'), or with 'lr' the masking that
        follows the learning rate, True (all of a sent filter's velocity) when it is not
        known."""
        if self.params['momentum_masking'] == 'off':
            return False
        if self.learning_rate is None:
            if not self._warned:
                self._warned = True
                log.warning("momentum_masking='lr', but the store does not follow the "
                            "optimizer's learning rate (kv.follow(trainer)): the "
                            "conv masking zeroes all of a sent filter's velocity at every step")
            return True
        self._high_rate.read = self.learning_rate
        return self._high_rate

    def state(self):
        """The masking's learning-rate peak (None when it does not follow one)."""
        peak = self._high_rate.peak
        return {'lr_peak': peak} if peak > 0 else None

    def restore(self, state):
        self._high_rate.peak = float((state or {}).get('lr_peak', 0.0))

    def conv_codec(self, shape, k):
        """The codec of a conv tensor sending ``k`` filters, in this aggregation mode,
        wrapped with DGC's momentum correction (its masking) when it applies."""
        p = self.params
        if p['aggregation'] == 'homomorphic':
            codec = AdditiveTopKCodec(shape, k, self.conv_agreement())
        else:
            codec = FilterTopKCodec(shape, k, p['pull'] == 'compressed')
        if self.corrects_momentum():
            return MomentumCorrected(codec, p['momentum'], self.masking())
        return codec

    def fc_codec(self, shape, scale):
        """The ternary codec of an FC (or other large) tensor with t = ``scale`` *
        mean|acc| (or ``fc_threshold``), in this aggregation mode, coding the velocity
        (momentum correction without masking) when ``fc_momentum_correction`` applies."""
        p = self.params
        if p['aggregation'] == 'homomorphic':
            codec = AdditiveTernaryCodec(shape, scale, p['fc_threshold'], 'previous',
                                         FC_VALUE)
        else:
            codec = TernaryCodec(shape, scale=scale, threshold=p['fc_threshold'],
                                 value=FC_VALUE, compressed_reply=p['pull'] == 'compressed')
        if self.corrects_momentum('fc_momentum_correction'):
            return MomentumCorrected(codec, p['momentum'], masking=False)
        return codec
