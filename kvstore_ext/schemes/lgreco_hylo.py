"""L-GreCo over Hylo's own knobs: each conv layer's filter count and each FC layer's
threshold scale, chosen so that the total size is minimal while the total compression
error stays within that of Hylo's defaults.

The policy is L-GreCo's (layerwise.py: rank 0 measures the last ``window`` steps'
compensated gradients, a knapsack chooses, the choice is shared, every worker
re-plans at multiples of ``adjust_freq``); the codecs are Hylo's (hylo.py), in either
aggregation mode. This module is the family: which values a layer may take, and what
each costs and loses on rank 0's measured sum ``S`` of a layer (chunk by chunk, as
the codec cuts the tensor; exact formulas, tested against the NumPy reference):

* **Conv** (``FilterTopKCodec``, homomorphic ``AdditiveTopKCodec``): the value is the
  filter count ``k``. Candidates: Hylo's layer rate times {0.5, 0.75, 1, 1.5, 2}, as
  ``ceil(rate * O)`` filters, capped at all ``O``. ``error`` = the norm of the filters
  the top ``k`` by L2 norm leave out: ``sqrt(sum of the O - k smallest filter norms^2)``.
* **FC** (``TernaryCodec``, homomorphic ``AdditiveTernaryCodec``): the value is
  ``fc_scale``. Candidates: ``fc_scale`` times the same factors ({1, 1.5, 2, 3, 4}
  around 2). ``t = scale * mean|S|``; the selected set is ``|S| >= t``; its code
  stands for ``v`` = 2t (Hylo's ``FC_VALUE``);
  ``error`` =
  ``sqrt(sum over the set of (|S| - v)^2 + sum over the rest of S^2)``. With a fixed
  ``fc_threshold`` the scale does nothing and the FC layers are not chosen for.
* ``size`` = the words a step pushes (``Codec.wire_words``, summed over chunks and
  rounds). Candidates that would not compress a layer at least 2x are left out (the
  default stays).

**What the FC knob can and cannot do.** A ternary payload's size is fixed by the
element count (base-3 digits, or base-(2n+1) in homomorphic mode), whatever the
threshold: every FC candidate costs the same bytes. So the knapsack trades conv bytes
only; on FC layers it picks, among equal sizes, the scale that uses least of the error
budget, and what that saves may pay for fewer conv filters. The FC knob is thus an
error reducer at equal bytes, and the bytes it frees are conv bytes. ``knobs='conv'``
(or ``'fc'``) restricts the choice to one kind.

In homomorphic mode every worker must encode with the same k and scale: the values
are shared before anyone re-plans (layerwise.py, step 4), and the agreed statistic
(per-filter scores, ``[sum|acc|, ...]``) keeps its shape when k or the scale changes,
so the store keeps it and every worker continues from the same agreement. The FC
error formula is server mode's (t from the measured sum itself); homomorphic mode's
agreed t is the mean of the workers' thresholds, close to it, and the same for every
candidate's ranking.
"""
import math

import numpy as np

from . import layerwise
from .base import POLICY_PARAMS
from .hylo import Hylo
from .layerwise import LayerwiseChoice
from .. import chunking
from ..codecs.base import innermost
from ..codecs import (FilterTopKCodec, TernaryCodec, AdditiveTernaryCodec,
                      AdditiveTopKCodec)
from ..params import Param

CONV_CODECS = (FilterTopKCodec, AdditiveTopKCodec)
FC_CODECS = (TernaryCodec, AdditiveTernaryCodec)


def pushed_words(chunks):
    """Words one step pushes for a tensor cut into ``chunks`` (steady state)."""
    return sum(words for c in chunks for _, _, words, _ in c.codec.wire_words(1))


def conv_errors(rows, chunkings):
    """Frobenius norm of the filters top-k leaves out, for each candidate's chunks
    (``rows``: the measured sum as O x F, float64; every candidate cuts alike)."""
    squared = np.zeros(len(chunkings))
    for j, chunk in enumerate(chunkings[0]):
        norms = np.sort((rows[chunk.start:chunk.stop] ** 2).sum(axis=1))[::-1]
        kept = np.concatenate([[0.0], np.cumsum(norms)])
        for i, chunks in enumerate(chunkings):
            squared[i] += kept[-1] - kept[chunks[j].codec.k]
    return np.sqrt(np.maximum(squared, 0.0))


def ternary_error(values, scale):
    """Frobenius norm of what Hylo's ternary rule loses on ``values`` (float64, flat):
    t = scale * mean|values|; |values| >= t sent as +-2t (``FC_VALUE``); the rest lost
    whole."""
    mag = np.abs(values)
    t = scale * mag.mean() if mag.size else 0.0
    if not t > 0:
        return math.sqrt(float((mag ** 2).sum()))
    sent = mag[mag >= t]
    return math.sqrt(float(((sent - 2 * t) ** 2).sum() + (mag[mag < t] ** 2).sum()))


class LGreCoHylo(LayerwiseChoice, Hylo):
    name = 'lgreco_hylo'
    family = 'Hylo knobs'
    # policy='auto' (policy.py) is Hylo's own: the layer-wise choice plans every key here
    PARAMS = dict({k: p for k, p in Hylo.PARAMS.items() if k not in POLICY_PARAMS},
                  **layerwise.PARAMS, **{
        'knobs': Param('str', 'all', "which layers are chosen for: 'all', 'conv' (filter "
                       "counts) or 'fc' (threshold scales); the others keep Hylo's "
                       "defaults", choices=('all', 'conv', 'fc'), rank='leave'),
    })

    def steady_step(self):
        """Chosen values apply after Hylo's warm-up."""
        return self.params['warmup_steps']

    # -- the family: Hylo's conv filter count and FC threshold scale ------------------
    def layer_default(self, shape, dtype):
        codec = self.codec_for(shape, dtype, step=self.steady_step())
        knobs = self.params['knobs']
        if isinstance(innermost(codec), CONV_CODECS) and knobs != 'fc':
            return codec.k
        if isinstance(innermost(codec), FC_CODECS) and knobs != 'conv' and \
                not self.params['fc_threshold'] > 0:
            return codec.scale
        return None

    def candidates(self, shape):
        if len(shape) >= 3:
            filters, rate = shape[0], self.conv_rate(int(np.prod(shape)))
            return sorted({min(filters, max(1, math.ceil(rate * f * filters - 1e-9)))
                           for f in layerwise.FACTORS})
        return layerwise.around(self.params['fc_scale'], integer=False)

    def codec_with(self, shape, dtype, value):
        if len(shape) >= 3:
            return self.conv_codec(shape, int(value))
        return self.fc_codec(shape, float(value))

    def layer_options(self, shape, summed):
        default = self.layer_default(shape, np.float32)
        options = []
        for value in self.candidates(shape):
            chunks = chunking.split(self.codec_with(shape, np.float32, value),
                                    self.params['chunk_size'])
            size = pushed_words(chunks)
            if value == default or summed.size >= layerwise.MIN_RATIO * size:
                options.append((value, chunks, size))
        if len(shape) >= 3:
            errors = conv_errors(summed.reshape((shape[0], -1)), [c for _, c, _ in options])
        else:
            flat = summed.reshape(-1)
            errors = [math.sqrt(sum(ternary_error(flat[c.start:c.stop], value)
                                    ** 2 for c in chunks))
                      for value, chunks, _ in options]
        return [(value, e, size) for (value, _, size), e in zip(options, errors)]

    def value_text(self, shape, value):
        if len(shape) >= 3:
            return 'k %d of %d filters' % (value, shape[0])
        return 'fc_scale %g' % value
