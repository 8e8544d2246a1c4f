"""Hylo: hybrid, layer-aware gradient compression (see shared/papers/hylo.md).

Per tensor, after the worker has summed its devices, with ``acc = grad + residual``:

1. **Size threshold.** Tensors with fewer than ``size_threshold`` elements (biases,
   batch-norm parameters, small layers) are sent uncompressed: their cost is small
   and compressing them hurts accuracy most.
2. **Conv weights** (3-D and more; output filters first): each output filter is
   scored by the L2 norm of its slice of ``acc``; the top ``k = ceil(rate * O)``
   filters are sent (indices + float32 values) and the others stay in the residual.
   The rate is layer-adaptive, smaller for larger layers::

       rate(n) = clip(conv_rate_max * sqrt(size_threshold / n), conv_rate_min, conv_rate_max)

   so a layer at the threshold sends ``conv_rate_max`` (0.3) of its filters and a layer
   100x larger a tenth of that (at least ``conv_rate_min``, 0.02). ``conv_rate`` fixes
   the rate for every conv layer instead. (With 0.1, a 51,200-weight layer sent 6 of
   64 filters a step, each filter waited ~10 steps, and short runs lost accuracy.)
   In homomorphic mode the formula's rate is multiplied by ``homomorphic_conv_scale``
   (2, at most 1): there every worker sends the same agreed filters, so a step updates
   k filters, where server mode's sum covers the union of each worker's own k.
   Doubled, cnn512's short run at 8 workers ended 1.65 points higher (16 seeds, lower
   train loss on all); at 4 workers the train loss fell on 13 of 16 seeds, the test
   accuracy gain is not resolved (docs/RESULTS.md section 15). It costs cnn512 3-5%
   more bytes; conv-heavy models pay more (resnet18 1.8x).
3. **FC weights** (2-D) and any other large tensor (1-D): the threshold adapts to the
   overall magnitude each step, ``t = fc_scale * mean|acc|`` (``fc_threshold > 0``
   fixes it instead); each value becomes 0 or +-v (2 bits of information, packed as
   base-3 digits) where |acc| >= t, and the error stays in the residual. The adaptive t
   is at most max|acc| (homomorphic: the mean of the workers' maxima), and where that
   cap decides, v = t: the largest value always goes, so a gradient of equal magnitudes
   (constant, sign-only, one element), which never reached 2 mean|acc|, arrives. The
   value v (``fc_value``):

   * ``'round'`` (the default): v = 2t, so that a code is acc rounded to the nearest
     multiple of 2t, clipped to +-1, and a sent value's residual stays within +-t;
   * ``'mean'``: the mean |acc| of the selected values, the least-squares value of the
     set (formerly the default): it leaves the tail of the largest values in the
     residual, and an MLP trained 48 steps by 8 workers lost 3.7 points to ``dist_sync``
     ('round' did not; docs/RESULTS.md section 7);
   * ``'t'``: v = t, MXNet's 2-bit rule, which drains a large accumulated value only t
     a step: the residual grew to ~5x the gradient and an MLP lost 7 points.

   The header carries v, so decoders do not depend on the rule.
4. **Aggregation.** ``aggregation='homomorphic'`` (the default) is
   the additive variant: workers agree on t and the filter set, so that the stock
   server adds their payloads as it adds float32 and workers pull the compressed sum
   (``agreement`` says how they agree: from the previous aggregate or by an extra
   round; see codecs/agreed.py and docs/DESIGN.md). The default, ``'auto'``, takes the
   conv filter set from a round from 8 workers on (``CONV_ROUND_WORKERS``) and
   everything else from the previous aggregate. ``aggregation='server'`` is the
   paper's design: the parameter server decodes every worker's payload to float32 and
   sums; workers pull float32, or, with ``pull='compressed'``, the sum re-encoded by
   the same codec at the server, whose own residual keeps what the reply leaves out
   (two-way compression, as DoubleSqueeze): the pull shrinks like the push, whatever
   the number of workers. Why homomorphic by default: both modes end within 0.5
   points of ``dist_sync`` on the accuracy matrix's 12 cells, but the additive one compresses
   pulls too (2.0-4.2x faster to 95% than ``dist_sync`` on a 200 Mbit/s link at 2-8
   workers, server mode 1.4-1.5x; docs/RESULTS.md section 9) and costs less CPU where
   the network is fast, because servers add instead of decoding every worker's
   payload in a Python updater (a step within 15% of ``dist_sync``'s on loopback,
   where server mode's is not; section 24). Its payload grows with the workers (base
   2n+1 digits), yet a step's bytes both ways stay below server mode's up to 1,024
   workers on the three models of section 9.
5. **Warm-up** (``warmup_steps``, default 0): the first steps of every compressed tensor
   go float32, as PyTorch's PowerSGD hook does; the scheme then re-plans the key
   (``replans_at``) to its compressed codec.
6. **Conv warm-up** (``conv_warmup_steps``, default 0: off): DGC's sparsity warm-up for the conv top-k.
   Over the first N steps (after ``warmup_steps``) a conv tensor's rate decays
   exponentially, ``target ** (step / N)``: all filters (float32) at the first step, the
   layer's target rate at step N; the scheme re-plans every step of the warm-up. With
   8 workers each worker picks its own filters, so a filter's update waits ~1/rate steps
   and momentum amplifies the stale updates; the warm-up keeps the first steps, where
   this costs most, nearly dense. Measured (docs/RESULTS.md section 7): N = 16 narrowed
   cnn512's 8-worker short-run loss in server mode from ~6 to ~3 points; neither the
   remaining loss's absence nor the gain over the default is shown, so it stays off.
7. **Momentum correction** (``momentum``, default 0: off; both aggregations): set it
   to the SGD optimizer's momentum and the conv top-k accumulates velocities instead
   of gradients, DGC-style (codecs/momentum.py), so that a filter's
   wait is not followed by the momentum's tail. MXNet never gives the kvstore the
   optimizer (Gluon and Module run it on the workers): unless set, the momentum is the
   optimizer's (SGD's or NAG's), handed over at the store's first step from the Trainer
   or Module that calls it, or from ``kv.follow(trainer)`` (kvstore_ext/handover.py);
   a script with neither is warned once. ``momentum_correction`` says where it applies: 'auto'
   (the default) from ``MOMENTUM_CORRECTION_WORKERS`` (8) workers on, 'on', 'off'.
   Without it the conv top-k is plain error feedback and the optimizer's momentum acts
   on what arrives. Why not always: the correction's factor masking zeroes a sent
   filter's velocity, so a filter sent every step moves by ``lr * grad``, a tenth of
   momentum SGD's step at m = 0.9, and Hylo's high conv rates send the important
   filters often. Measured on cnn512 (docs/RESULTS.md sections 7, 16, 17): at 4
   workers the correction cost 0.3 points on the short run (28 seeds) and 0.4 on the
   long one (8), and without it Hylo is within 0.5 points of `dist_sync` in both modes;
   at 2 workers it changes nothing (16 seeds); at 8 workers the 48-step run loses 5.8
   points without it (5 seeds). At 8 workers a worker sends a filter again after 1-4
   steps, so the masking moves conv filters by about a fifth of momentum SGD's step: a
   damping. The 48-step constant-lr run needs it (masked less, it ends lower); a long
   cosine run loses half a point to it (docs/RESULTS.md section 21).
   ``momentum_masking='lr'`` (the default) masks by the schedule: when the store
   follows the optimizer's learning rate (handed over with the momentum, or
   ``kv.follow``), masking zeroes a sent filter's
   velocity while the rate is at least 0.8 of its peak so far (``HighRateMasking``,
   ``HIGH_RATE``) and keeps it once a schedule has brought the rate below: a constant
   rate masks exactly as 'on'; without a followed rate it masks always (with a
   warning). ``HIGH_RATE``'s comment says why 0.8: where unmasked runs blew up. On
   cnn512's long cosine run at 8 workers, over 23 seeds, it ends within 0.5 points of
   ``dist_sync`` in both modes (server +0.19, homomorphic +0.24); over seeds 1-16 it ends 0.18 points above a masking of the share lr / peak,
   with a lower train loss on 14 of 16 seeds (docs/RESULTS.md section 23).
8. **FC momentum** (``fc_momentum_correction``, with ``momentum`` > 0): the FC ternary
   codes the worker's velocity ``u = m u + grad`` instead of its gradient, with error
   feedback on ``u`` and no masking, and the step returns ``S - m S_prev`` as the conv
   correction does (codecs/momentum.py). Why: with plain error feedback a value that
   waits reaches the optimizer as a lump whose momentum tail follows; an MLP trained 48
   steps by 8 workers learned more slowly than ``dist_sync`` (train loss 0.39 against
   0.36) and ended 0.7 points below it, 2.2-4.7 points on 6 seeds of 32. Coding the
   velocity ends within 0.5 of it in both modes, no seed of 48 2 points below
   (docs/RESULTS.md section 20). 'auto' (the default) applies it where the conv
   correction applies, from 8 workers on; forced on at 4 workers the MLP's short run
   gained nothing (12 seeds).
"""
import logging
import math

import numpy as np

from .base import Scheme
from ..codecs import (FilterTopKCodec, HighRateMasking, MomentumTopKCodec,
                      MomentumAdditiveTopKCodec, TernaryCodec, AdditiveTernaryCodec,
                      AdditiveTopKCodec, MomentumTernaryCodec, MomentumAdditiveTernaryCodec)
from ..params import Param

log = logging.getLogger('kvstore_ext')

# agreement='auto' takes 'conv_round' from this many workers on: at 8 workers the round
# beat the one-step-old filter scores of 'previous' by 3.2 points on cnn512's short run
# (16 seeds; docs/RESULTS.md section 15); at 4 the two end equal and 'previous' reads
# nothing (its keys push without waiting).
CONV_ROUND_WORKERS = 8

# momentum_correction='auto' corrects from this many workers on (why: item 7 above).
# Long runs at 8 workers would gain 0.3 points without it (10 seeds, docs/RESULTS.md
# section 17), but a kvstore cannot tell a long run from a short one.
MOMENTUM_CORRECTION_WORKERS = 8


class Hylo(Scheme):
    name = 'hylo'
    PARAMS = {
        'size_threshold': Param('int', 32768, 'tensors with fewer elements go uncompressed',
                                low=0),
        'conv_rate': Param('float', None, 'fixed share of filters sent per conv layer '
                           '(overrides conv_rate_min/max)', low=0, low_open=True, high=1,
                           optional=True),
        'conv_rate_min': Param('float', 0.02, 'smallest layer-adaptive conv rate',
                               low=0, low_open=True, high=1),
        'conv_rate_max': Param('float', 0.3, 'conv rate of a layer at the size threshold',
                               low=0, low_open=True, high=1),
        'homomorphic_conv_scale': Param('float', 2.0, 'homomorphic only: the layer-adaptive '
                                        'conv rate times this (at most 1): all workers send '
                                        'one agreed filter set, where in server mode each '
                                        'sends its own and the sum covers their union',
                                        low=1, high=100),
        # fc_scale >= 0.01: a code stands for at most 2t (fc_value 'round'; t for 't'),
        # so a value drains at most 2 * fc_scale * mean|acc| a step and the residual
        # must grow to 1 / (2 * fc_scale) steps of gradient before the sums carry it
        # (50 at 0.01; 1e-30 sent sums of ~0 for ever); with 'mean', 0.01 already
        # selects ~99% of Gaussian values, so a smaller scale would change nothing
        'fc_scale': Param('float', 2.0, 'FC threshold t = fc_scale * mean|acc| '
                          '(at least 0.01)', low=0.01),
        # fc_threshold is in the gradient's own units: any finite value >= 0 may fit
        'fc_threshold': Param('float', 0.0, 'fixed FC threshold if > 0 (else adaptive)',
                              low=0),
        'aggregation': Param('str', 'homomorphic', "'homomorphic' (additive payloads "
                             "the stock server sums; pulls compressed too) or 'server' "
                             "(decode at the server, as the paper)",
                             choices=('homomorphic', 'server')),
        'pull': Param('str', 'float32', "server aggregation only: what workers pull: "
                      "'float32' (the sum, as the paper) or 'compressed' (the servers "
                      "re-encode the sum with the same codec and a residual of their "
                      "own; homomorphic pulls are always compressed)",
                      choices=('float32', 'compressed')),
        'fc_value': Param('str', 'round', "FC value a nonzero code stands for: 'mean' "
                          "(mean |acc| of the selected values, the least-squares value of "
                          "the set), 'round' (2t: acc rounded to the nearest multiple of "
                          "2t, so a sent value's residual stays within +-t) or 't' (the "
                          "threshold, MXNet's 2-bit rule)",
                          choices=('t', 'mean', 'round')),
        'warmup_steps': Param('int', 0, 'the first this many steps of every compressed '
                              'tensor go float32 (dense warm-up)', low=0),
        'conv_warmup_steps': Param('int', 0, 'DGC-style conv sparsity warm-up: over the '
                                   'first this many steps of a conv tensor its rate decays '
                                   'exponentially from 1 (all filters, float32) to its '
                                   'target, re-planned every step', low=0),
        'momentum': Param('float', 0.0, "the SGD optimizer's momentum, for DGC's momentum "
                          'correction of the conv top-k and the FC velocity coding (0: off; '
                          "unless set, the optimizer's, handed over: handover.py)",
                          low=0, high=0.999),
        'momentum_correction': Param('str', 'auto', "with momentum > 0: where DGC's "
                                     "momentum correction applies: 'on', 'off' (plain "
                                     "error feedback) or 'auto' ('on' from %d workers on)"
                                     % MOMENTUM_CORRECTION_WORKERS,
                                     choices=('auto', 'on', 'off')),
        'momentum_masking': Param('str', 'lr', "with momentum: DGC's factor masking, "
                                  "whether a sent filter's velocity is zeroed: 'lr' (while "
                                  "the learning rate is at least 0.8 of its peak, when the "
                                  "store follows the optimizer's rate as the project's "
                                  "scripts make it do, else always: a constant rate masks "
                                  "as 'on', a decayed one not; docs/RESULTS.md section 23), "
                                  "'on' (always: it damps the conv steps, which a short "
                                  "constant-lr run at 8 workers needs) or 'off' (never)",
                                  choices=('lr', 'on', 'off')),
        'fc_momentum_correction': Param('str', 'auto', "with momentum > 0: whether the "
                                        "FC ternary codes the worker's velocity (u = m u + "
                                        "grad, error feedback on u, no masking): 'on', "
                                        "'off' (the gradient) or 'auto' ('on' from %d "
                                        "workers on)" % MOMENTUM_CORRECTION_WORKERS,
                                        choices=('auto', 'on', 'off')),
        'compress_layers': Param('str', 'all', "diagnostic (ablations): which large "
                                 "tensors are compressed ('all', 'conv' only, 'fc' only); "
                                 "the others go float32", choices=('all', 'conv', 'fc')),
        'agreement': Param('str', 'auto', "homomorphic only: how workers agree on t "
                           "and the filter set: 'previous' (statistic carried by the "
                           "previous aggregate), 'round' (an extra tiny round per step "
                           "and key), 'conv_round' (the round for conv layers only; more "
                           "accurate from 8 workers, docs/DESIGN.md) or 'auto' "
                           "('conv_round' from %d workers on, else 'previous')"
                           % CONV_ROUND_WORKERS,
                           choices=('auto', 'previous', 'round', 'conv_round')),
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

    def conv_k(self, shape, step=None):
        """Filters sent of a conv tensor of ``shape``; during the conv warm-up (``step``
        below ``conv_warmup_steps``) the rate is ``target ** (done / N)``, ``done`` the
        steps since the end of ``warmup_steps``: 1 at its start, the target at its end
        (DGC's exponential sparsity warm-up)."""
        filters = shape[0]
        rate = self.conv_rate(int(np.prod(shape)))
        n = self.params['conv_warmup_steps']
        if step is not None and n > 0:
            done = step - self.params['warmup_steps']
            if done < n:
                rate = rate ** (max(done, 0) / n)
        k = math.ceil(rate * filters - 1e-9)
        return min(max(k, 1), filters)

    def replans_at(self, step):
        p = self.params
        if step == p['warmup_steps'] > 0:
            return True
        done = step - p['warmup_steps']
        return p['conv_warmup_steps'] > 0 and 0 < done <= p['conv_warmup_steps']

    def codec_for(self, shape, dtype, step=0):
        if self.exempt(shape, dtype) or step < self.params['warmup_steps']:
            return self.uncompressed(shape, dtype)
        if self.params['compress_layers'] != 'all' and \
                (len(shape) >= 3) != (self.params['compress_layers'] == 'conv'):
            return self.uncompressed(shape, dtype)
        if len(shape) >= 3:
            k = self.conv_k(shape, step)
            if k == shape[0]:
                # all filters (conv warm-up's first steps): float32, no indices
                return self.uncompressed(shape, dtype)
            return self.conv_codec(shape, k)
        return self.fc_codec(shape, self.params['fc_scale'])

    def agreements(self):
        """(conv, FC) agreement of the homomorphic codecs: 'previous' or 'round'."""
        mode = self.params['agreement']
        if mode == 'auto':
            mode = 'conv_round' if self.num_workers >= CONV_ROUND_WORKERS else 'previous'
        if mode == 'conv_round':
            return 'round', 'previous'
        return mode, mode

    def corrects_momentum(self, setting='momentum_correction'):
        """Whether the conv top-k runs DGC's momentum correction (``momentum`` > 0 and
        ``momentum_correction`` on, or 'auto' with enough workers); with ``setting``
        'fc_momentum_correction', whether the FC ternary codes the velocity."""
        p = self.params
        if p['momentum'] <= 0 or p[setting] == 'off':
            return False
        return p[setting] == 'on' or self.num_workers >= MOMENTUM_CORRECTION_WORKERS

    def masking(self):
        """The conv codecs' ``masking``: True (all of a sent filter's velocity), False,
        or, with 'lr' and a known learning rate, the masking that follows it."""
        mode = self.params['momentum_masking']
        if mode != 'lr':
            return mode == 'on'
        if self.learning_rate is None:
            if not self._warned:
                self._warned = True
                log.warning("momentum_masking='lr', but the store does not follow the "
                            "optimizer's learning rate (kv.follow(trainer)): the "
                            "conv masking zeroes all of a sent filter's velocity, as 'on'")
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
        """The codec of a conv tensor sending ``k`` filters, in this aggregation mode."""
        p = self.params
        if p['aggregation'] == 'homomorphic':
            agreement = self.agreements()[0]
            if self.corrects_momentum():
                return MomentumAdditiveTopKCodec(shape, k, agreement, p['momentum'],
                                                 self.masking())
            return AdditiveTopKCodec(shape, k, agreement)
        if self.corrects_momentum():
            return MomentumTopKCodec(shape, k, p['pull'] == 'compressed', p['momentum'],
                                     self.masking())
        return FilterTopKCodec(shape, k, p['pull'] == 'compressed')

    def fc_codec(self, shape, scale):
        """The ternary codec of an FC (or other large) tensor with t = ``scale`` *
        mean|acc| (or ``fc_threshold``), in this aggregation mode."""
        p = self.params
        velocity = self.corrects_momentum('fc_momentum_correction')
        if p['aggregation'] == 'homomorphic':
            agreement = self.agreements()[1]
            if velocity:
                return MomentumAdditiveTernaryCodec(shape, scale, p['fc_threshold'],
                                                    agreement, p['fc_value'], p['momentum'])
            return AdditiveTernaryCodec(shape, scale, p['fc_threshold'], agreement,
                                        p['fc_value'])
        compressed = p['pull'] == 'compressed'
        if velocity:
            return MomentumTernaryCodec(shape, scale, p['fc_threshold'], p['fc_value'],
                                        compressed, p['momentum'])
        return TernaryCodec(shape, scale=scale, threshold=p['fc_threshold'],
                            value=p['fc_value'], compressed_reply=compressed)
