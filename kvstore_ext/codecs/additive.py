"""Hylo's additive variant (``aggregation='homomorphic'``, after THC): payloads the
stock server simply adds, so the pull stays compressed (two-way compression).

Workers first agree on what makes their payloads add up, from a statistic of each
worker's ``acc`` summed over workers (agreed.py):

* FC (ternary): each worker contributes ``sum|acc|``; all then use
  ``t = scale * total / (num_workers * n)``, the mean of the thresholds each would
  have chosen alone; with ``value='round'`` (Hylo's rule) a code stands for 2t, with
  ``'t'`` for t. Delivery cap: each worker also contributes its max|acc|, and t
  is at most the mean of the workers' maxima C; capped (t >= C), t = C and a code
  stands for C. Why: with equal magnitudes (a constant or sign-only gradient) nothing
  reached ``scale`` * mean|acc|, and t grew with the residual, so nothing was ever
  sent. The worker with the largest max has max >= C, so a step where some acc is not
  all zero sends something (with ``'previous'`` agreement, C is the previous step's
  prediction), and a worker whose residual keeps growing passes C in time. The mean of
  the maxima, not their max: a max is not additive, the stock server only sums. Codes + 1 are packed as base-(2n+1) digits in float32 words, D
  digits a word with (2n+1)**D <= 2**24, so the server's float32 sum (in any order) is
  exactly the packing of the summed codes + n. Not float64: MXNet's dist server sums
  float64 pushes in float32 (measured), which would round words above 2**24.
* Conv (filter selection): each worker contributes its per-filter scores (squared
  L2 norms of ``acc``); all pick the same top-k filters of the summed scores and
  send only their values (no indices), which add.
"""
import math

import numpy as np

from .agreed import AgreedCodec
from .base import check_decoded, check_encoded
from .ternary import VALUE_RULES, VALUE_TEXT
from ..ops import host_array, op, shape_attr
from ..wire import ternary_sum_words


class AdditiveTernaryCodec(AgreedCodec):
    name = 'ternary-additive'

    def __init__(self, shape, scale=1.0, threshold=0.0, agreement='previous', value='t'):
        super().__init__(shape, agreement)
        if value not in VALUE_RULES:
            raise ValueError('value must be one of %s, got %r' % (tuple(VALUE_RULES), value))
        self.scale, self.threshold, self.value = float(scale), float(threshold), value
        # words: [sum|acc|, max|acc|]
        self.agreement_words = 0 if self.threshold > 0 else 2

    def chunk(self, start, stop):
        return type(self)((stop - start,), self.scale, self.threshold, self.agreement,
                          self.value)

    def sum_words(self, num_workers):
        return ternary_sum_words(self.size, num_workers)

    def statistic(self, grad, residual):
        from mxnet import ndarray
        return ndarray.concat(op('kvx_acc_abs_sum')(grad, residual),
                              op('kvx_acc_abs_max')(grad, residual), dim=0)

    def settle(self, agreed, num_workers):
        """(t, v), float32 values identical on every worker: t fixed or from the agreed
        total, at most the mean of the maxima C; v = t, or 2t for value 'round'; v = t =
        C when capped (python/kvx_ref/codecs.py, agreed_ternary)."""
        if self.threshold > 0:
            t = float(np.float32(self.threshold))
            return t, self.value_of(t)
        stats = agreed.asnumpy().astype(np.float64)
        t = float(np.float32(self.scale * stats[0] / (num_workers * self.size)))
        cap = float(np.float32(stats[-1] / num_workers))
        # not finite: a worker sent NaN/Inf; t = 0 lets our encoder report ours, if any
        if not (math.isfinite(t) and math.isfinite(cap)):
            return 0.0, 0.0
        if t >= cap:                                  # the delivery cap
            return cap, cap
        return t, self.value_of(t)

    def value_of(self, t):
        """v from t: 2t for 'round', else t; t also when 2t overflows float32 (encoder and decoder use
        the same v either way)."""
        v = float(np.float32(2 * t)) if self.value == 'round' else t
        return v if math.isfinite(v) else t

    def encode_sum(self, grad, residual, num_workers, settled):
        t, v = settled
        words, status = op('kvx_ternary_encode_sum')(grad, residual, threshold=t,
                                                     num_workers=num_workers,
                                                     value=v)
        check_encoded(status)
        return words

    def decode_sum(self, summed, num_workers, settled):
        out, status = op('kvx_ternary_decode_sum')(summed, threshold=settled[1],
                                                   num_workers=num_workers,
                                                   shape=shape_attr(self.shape))
        check_decoded(status, 'summed ternary payload')
        return out

    def kernel_cases(self):
        return ('ternary_encode_sum n=4', 'ternary_decode_sum n=4'), (), ()

    def describe(self):
        value = VALUE_TEXT[self.value]
        if self.threshold > 0:
            return 'ternary (additive), t = %g%s' % (self.threshold, value)
        return 'ternary (additive), t agreed (%s)%s' % (self.agreement, value)


class AdditiveTopKCodec(AgreedCodec):
    name = 'topk-additive'
    chunk_by_rows = True
    reports_sent = True

    def __init__(self, shape, k, agreement='previous'):
        super().__init__(shape, agreement)
        self.k = int(k)
        self.filter_size = self.size // self.shape[0]
        self.agreement_words = self.shape[0]

    def chunk(self, start, stop):
        filters = stop - start
        k = min(max(math.ceil(self.k * filters / self.shape[0]), 1), filters)
        return type(self)((filters,) + self.shape[1:], k, self.agreement)

    def sum_words(self, num_workers):
        return self.k * self.filter_size

    def statistic(self, grad, residual):
        return op('kvx_acc_filter_scores')(grad, residual)

    def settle(self, agreed, num_workers):
        """The k filters with the largest summed scores, ties to the lower index."""
        scores = agreed.asnumpy().astype(np.float64)
        scores[~np.isfinite(scores)] = np.inf
        order = np.lexsort((np.arange(scores.size), -scores))
        return host_array(np.sort(order[:self.k]))

    def step_sent(self, grad, state, num_workers, rank):
        """The agreed filters were sent (none after a void agreement round)."""
        state.last.pop('agreed', None)
        total = yield from self.step(grad, state, num_workers, rank)
        agreed = state.last.get('agreed')
        if agreed is None:      # a void agreement round: nothing was gathered
            from mxnet import ndarray
            return total, ndarray.zeros((0,), dtype=np.float32)
        return total, self.settle(agreed, num_workers)

    def encode_sum(self, grad, residual, num_workers, settled):
        values, status = op('kvx_topk_gather')(grad, residual, settled)
        check_encoded(status)
        return values

    def decode_sum(self, summed, num_workers, settled):
        out, status = op('kvx_topk_scatter')(summed, settled, shape=shape_attr(self.shape))
        check_decoded(status, 'summed filter values')
        return out

    def kernel_cases(self):
        return ('filter_scores F=4608', 'topk_gather F=4608 5%',
                'topk_scatter F=4608 5%'), (), ()

    def describe(self):
        return 'top %d of %d filters (additive, agreed (%s))' % (self.k, self.shape[0],
                                                                 self.agreement)
