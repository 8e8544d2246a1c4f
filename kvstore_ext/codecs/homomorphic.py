"""Hylo's homomorphic variant (after THC): payloads the stock server can simply add.

Workers first agree on what makes their payloads additive, from a statistic of each
worker's ``acc`` summed over workers (agreement.py: a tiny sum-mode round, or the
statistic carried by the previous step's aggregate):

* FC (ternary): each worker contributes ``sum|acc|``; all then use
  ``t = scale * total / (num_workers * n)``, the mean of the thresholds each would
  have chosen alone. Codes + 1 are packed as base-(2n+1) digits in float32 words, D
  digits a word with (2n+1)**D <= 2**24, so the server's float32 sum (in any order) is
  exactly the packing of the summed codes + n. Not float64: MXNet's dist server sums
  float64 pushes in float32 (measured), which would round words above 2**24.
* Conv (filter selection): each worker contributes its per-filter scores (squared
  L2 norms of ``acc``); all pick the same top-k filters of the summed scores and
  send only their values (no indices), which add.

The pull then stays compressed (two-way compression): decoding happens on workers.
"""
import math

import numpy as np

from .base import Codec, check_decoded, check_encoded
from ..ops import op, shape_attr


def digits_per_float32(base):
    """Largest D with base**D <= 2**24, so every packed word, and the sum of the
    workers' words, is an integer float32 holds exactly."""
    digits, power = 0, 1
    while power * base <= 1 << 24:
        power *= base
        digits += 1
    return digits


class HomTernaryCodec(Codec):
    name = 'ternary-sum'
    additive = True
    sum_dtype = np.float32

    def __init__(self, shape, scale=1.0, threshold=0.0, agreement='round'):
        super().__init__(shape)
        self.scale, self.threshold = float(scale), float(threshold)
        self.agreement_words = 0 if self.threshold > 0 else 1
        self.agreement_mode = agreement

    def chunk(self, start, stop):
        return type(self)((stop - start,), self.scale, self.threshold, self.agreement_mode)

    def sum_words(self, num_workers):
        return -(-self.size // digits_per_float32(2 * num_workers + 1))

    def agreement(self, grad, residual):
        return op('kvx_acc_abs_sum')(grad, residual)

    def settle(self, agreed, num_workers):
        """float32 t, identical on every worker: fixed, or from the agreed total."""
        if self.threshold > 0:
            return float(np.float32(self.threshold))
        total = float(agreed.asscalar())
        t = float(np.float32(self.scale * total / (num_workers * self.size)))
        # not finite: a worker sent NaN/Inf; t = 0 lets our encoder report ours, if any
        return t if math.isfinite(t) else 0.0

    def encode_sum(self, grad, residual, num_workers, settled):
        words, status = op('kvx_ternary_encode_sum')(grad, residual, threshold=settled,
                                                     num_workers=num_workers)
        check_encoded(status)
        return words

    def decode_sum(self, summed, num_workers, settled):
        out, status = op('kvx_ternary_decode_sum')(summed, threshold=settled,
                                                   num_workers=num_workers,
                                                   shape=shape_attr(self.shape))
        check_decoded(status, 'summed ternary payload')
        return out

    def describe(self):
        return 'ternary (additive), t agreed (%s)' % self.agreement_mode


class HomTopKCodec(Codec):
    name = 'topk-sum'
    additive = True
    chunk_by_rows = True

    def __init__(self, shape, k, agreement='round'):
        super().__init__(shape)
        self.k = int(k)
        self.filter_size = self.size // self.shape[0]
        self.agreement_words = self.shape[0]
        self.agreement_mode = agreement

    def chunk(self, start, stop):
        filters = stop - start
        k = min(max(math.ceil(self.k * filters / self.shape[0]), 1), filters)
        return type(self)((filters,) + self.shape[1:], k, self.agreement_mode)

    def sum_words(self, num_workers):
        return self.k * self.filter_size

    def agreement(self, grad, residual):
        return op('kvx_acc_filter_scores')(grad, residual)

    def settle(self, agreed, num_workers):
        """The k filters with the largest summed scores, ties to the lower index."""
        scores = agreed.asnumpy().astype(np.float64)
        scores[~np.isfinite(scores)] = np.inf
        order = np.lexsort((np.arange(scores.size), -scores))
        from mxnet import ndarray
        return ndarray.array(np.sort(order[:self.k]), dtype=np.float32)

    def encode_sum(self, grad, residual, num_workers, settled):
        values, status = op('kvx_topk_gather')(grad, residual, settled)
        check_encoded(status)
        return values

    def decode_sum(self, summed, num_workers, settled):
        out, status = op('kvx_topk_scatter')(summed, settled, shape=shape_attr(self.shape))
        check_decoded(status, 'summed filter values')
        return out

    def describe(self):
        return 'top %d of %d filters (additive, agreed (%s))' % (self.k, self.shape[0],
                                                                 self.agreement_mode)
