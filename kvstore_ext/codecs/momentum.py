"""Top-k codecs with DGC's momentum correction and factor masking (Lin et al.,
"Deep Gradient Compression", ICLR 2018), for an SGD optimizer with momentum ``m`` that
runs unchanged on the workers (python/kvx_ref/momentum.py is the spec).

Why: a filter that waits in the residual reaches the optimizer as one lump, whose
momentum then spreads it over the next ~1/(1-m) steps: its update lags by the wait
*and* the momentum's tail. With 8 workers on a short run this cost cnn512 about 6
points (docs/decisions/hylo-momentum-correction.md). DGC accumulates the velocity instead of the
gradient on the worker, ``u = m u + grad``, sends the top filters of ``u + residual``
and zeroes ``u`` on the filters sent (factor masking: their momentum left with them);
its optimizer applies plain SGD to the sum ``S`` of what was sent. Here the optimizer
keeps its momentum, so the step returns ``S - m S_prev``: the optimizer's buffer then
holds ``S`` (times -lr) and moves the weights by exactly ``-lr S``. Weight decay still
goes through the optimizer's momentum; a changing learning rate leaves an error of
``m (lr_t - lr_(t-1)) S_prev``, which decays by m a step.

Whether a step masks (``masking``): always (True, DGC's rule), never (False), or as a
callable says at each step: ``HighRateMasking``, while the learning rate is near its
peak and not once a schedule has decayed it (docs/decisions/hylo-momentum-masking.md).

State: ``velocity`` (this worker's own: a void step keeps it) and ``delivered`` (the
previous S, the same on every worker), both checkpointed. Hylo's conv top-k in both
aggregation modes: ``MomentumTopKCodec`` (server-decoded, each worker's own filters)
and ``MomentumAdditiveTopKCodec`` (homomorphic, the agreed filters); and
``MomentumElementTopKCodec``, the element top-k of ``dist_sync_topk``.

Hylo's FC ternary codes the velocity too, *without* masking (``MomentumTernaryCodec``,
``MomentumAdditiveTernaryCodec``): error feedback on the velocity, as in
error-compensated momentum SGD, so that the weights move by the sent velocities, which
add up to momentum SGD's steps, only later. Every FC value is coded each step and
waits a few steps at most, so the stale momentum that masking guards a top-k against
barely arises; masked, the FC layers of an MLP trained 48 steps by 8 workers learned
too slowly (a train loss of 0.48 against 0.36) and ended a point below ``dist_sync``
(docs/decisions/hylo-fc-momentum-correction.md).
"""
import numpy as np

from .additive import AdditiveTernaryCodec, AdditiveTopKCodec
from .element_topk import ElementTopKCodec
from .ternary import TernaryCodec
from .topk import FilterTopKCodec
from ..wire import HEADER_WORDS, element_topk_index_words


# HighRateMasking masks while the learning rate is at least this share of its peak.
# Why 0.8: unmasked, 3 of 16 server-mode runs of cnn512's 128-step cosine schedule at 8
# workers blew up, each in its second epoch (rate 0.96-0.85 of the peak), and no run did
# later (docs/decisions/hylo-momentum-masking.md; a threshold read off one model's runs).
HIGH_RATE = 0.8


class HighRateMasking:
    """The masking that follows the learning rate: called at a step, True (zero a sent
    filter's velocity, DGC's masking) while the optimizer's rate is at least
    ``HIGH_RATE`` of its peak so far, False (keep it) once a schedule has brought it
    below.

    Why: at 8 workers Hylo's conv filters are resent after 1-4 steps, so the masking
    damps their steps to about a fifth of momentum SGD's. At a high rate that damping
    keeps the run stable (a 48-step run at a constant rate needs it, and unmasked runs
    blew up early in long ones); once the rate has decayed it only slows the filters,
    which cost a long cosine run half a point. A share proportional to the rate (lr /
    peak) still masked most of the steps and recovered little of it
    (docs/decisions/hylo-momentum-masking.md).

    ``read``: returns the current learning rate (``store.follow`` or the hand-over, handover.py); None,
    or a value that is not a finite number >= 0, masks fully. ``peak`` is saved with
    checkpoints (the scheme's state), so a resumed run masks as it would have."""

    def __init__(self, read=None, peak=0.0):
        self.read, self.peak = read, float(peak)

    def __call__(self):
        if self.read is None:
            return True
        lr = float(self.read())
        if not 0 <= lr < float('inf'):
            return True
        self.peak = max(self.peak, lr)
        return lr >= HIGH_RATE * self.peak


class MomentumCorrection:
    """The correction around a top-k codec's step (a mixin before the codec class):
    subclasses define ``corrected_round`` (a generator: the codec's rounds on the
    velocity, returning (the summed result, the indices of the ``chunk_layout`` rows
    sent: filters, or elements)). An index equal to the number of rows stands for
    nothing sent, so that a codec whose fixed-size payload holds fewer entries than it
    has room for (AdaComp's slot) can return one index per entry without a sync; a
    codec that never masks returns None."""

    local_state = ('velocity',)

    def _check_momentum(self, momentum, masking):
        if not 0 < float(momentum) < 1:
            raise ValueError('momentum must be in (0, 1), got %r' % (momentum,))
        self.momentum = float(momentum)
        self.masking = masking if callable(masking) else bool(masking)

    def masks_now(self):
        """Whether this step zeroes the velocity of the rows it sent."""
        return bool(self.masking()) if callable(self.masking) else self.masking

    def state_shapes(self):
        return dict(super().state_shapes(), velocity=self.shape, delivered=self.shape)

    def _next_velocity(self, grad, state):
        velocity = state.get('velocity')
        return grad.copy() if velocity is None else velocity * self.momentum + grad

    def compressed_input(self, grad, state):
        """The velocity, not the gradient, goes with the residual."""
        return self._next_velocity(grad, state) + state.residual

    def step(self, grad, state, num_workers, rank):
        from mxnet import ndarray
        velocity = self._next_velocity(grad, state)
        # a NaN/Inf raises in the encoder, before the residual or the velocity changes
        total, sent = yield from self.corrected_round(velocity, state, num_workers, rank)
        if sent is not None and sent.size and self.masks_now():
            # rows of chunk_layout: filters, or single elements (element top-k); row
            # ``rows`` is the padding's (nothing sent), cut off after the scatter
            rows = self.chunk_layout()[0]
            hit = ndarray.scatter_nd(ndarray.ones((sent.size,), dtype=np.float32),
                                     sent.reshape((1, -1)), shape=(rows + 1,))[:rows]
            velocity = ndarray.broadcast_mul(velocity.reshape((rows, -1)),
                                             (1 - hit).reshape((rows, 1))).reshape(self.shape)
        state['velocity'] = velocity
        total = total.reshape(self.shape)
        previous = state.get('delivered')
        if previous is None:
            previous = ndarray.zeros(self.shape, dtype=np.float32)
        # a void round (a worker's NaN) is NaN everywhere: the step returns NaN, the
        # optimizer skips it, and the previous S stays (no wait for the result)
        state['delivered'] = ndarray.where(total == total, total, previous)
        return total - self.momentum * previous

    def describe(self):
        masking = ('' if self.masking is True else ', no masking' if self.masking is False
                   else ', masking follows the learning rate')
        return '%s, momentum correction %g%s' % (super().describe(), self.momentum, masking)


class MomentumTopKCodec(MomentumCorrection, FilterTopKCodec):
    """Server-decoded: each worker sends the top-k filters of its own velocity +
    residual."""

    def __init__(self, shape, k, compressed_reply=False, momentum=0.9, masking=True):
        super().__init__(shape, k, compressed_reply)
        self._check_momentum(momentum, masking)

    def chunk(self, start, stop):
        part = FilterTopKCodec.chunk(self, start, stop)
        return type(self)(part.shape, part.k, self.compressed_reply, self.momentum,
                          self.masking)

    def corrected_round(self, velocity, state, num_workers, rank):
        payload = self.encode(velocity, state.residual)
        total = yield self.gather(payload)
        return total, payload[HEADER_WORDS:HEADER_WORDS + self.k]


class MomentumAdditiveTopKCodec(MomentumCorrection, AdditiveTopKCodec):
    """Homomorphic: the workers send the agreed filters of their velocity + residual."""

    def __init__(self, shape, k, agreement='previous', momentum=0.9, masking=True):
        super().__init__(shape, k, agreement)
        self._check_momentum(momentum, masking)

    def chunk(self, start, stop):
        part = AdditiveTopKCodec.chunk(self, start, stop)
        return type(self)(part.shape, part.k, self.agreement, self.momentum, self.masking)

    def corrected_round(self, velocity, state, num_workers, rank):
        state.last.pop('agreed', None)
        total = yield from AdditiveTopKCodec.step(self, velocity, state, num_workers, rank)
        agreed = state.last.get('agreed')
        if agreed is None:      # a void agreement round: nothing was gathered
            from mxnet import ndarray
            return total, ndarray.zeros((0,), dtype=np.float32)
        return total, self.settle(agreed, num_workers)


class MomentumElementTopKCodec(MomentumCorrection, ElementTopKCodec):
    """Element top-k (``dist_sync_topk``), DGC's own setting: each worker sends the k
    elements of its velocity + residual with the largest magnitudes."""

    def __init__(self, shape, ratio, momentum=0.9, masking=True):
        super().__init__(shape, ratio)
        self._check_momentum(momentum, masking)

    def chunk(self, start, stop):
        part = ElementTopKCodec.chunk(self, start, stop)
        return type(self)(part.shape, part.ratio, self.momentum, self.masking)

    def corrected_round(self, velocity, state, num_workers, rank):
        from mxnet import ndarray
        payload = self.encode(velocity, state.residual)
        total = yield self.gather(payload)
        width = element_topk_index_words(self.size) + 1
        entries = payload[HEADER_WORDS:].reshape((self.k, width))
        sent = ndarray.cast(entries[:, 0], 'int64')
        if width == 3:                # index = low word + high word * 2**24
            sent = sent + ndarray.cast(entries[:, 1], 'int64') * (1 << 24)
        return total, sent


class MomentumTernaryCodec(MomentumCorrection, TernaryCodec):
    """Server-decoded FC: each worker codes its velocity + residual; never masked."""

    def __init__(self, shape, scale=1.0, threshold=0.0, value='t', compressed_reply=False,
                 momentum=0.9):
        super().__init__(shape, scale, threshold, value, compressed_reply)
        self._check_momentum(momentum, False)

    def chunk(self, start, stop):
        return type(self)((stop - start,), self.scale, self.threshold, self.value,
                          self.compressed_reply, self.momentum)

    def corrected_round(self, velocity, state, num_workers, rank):
        total = yield self.gather(self.encode(velocity, state.residual))
        return total, None


class MomentumAdditiveTernaryCodec(MomentumCorrection, AdditiveTernaryCodec):
    """Homomorphic FC: the agreed t over the workers' velocity + residual; never
    masked."""

    def __init__(self, shape, scale=1.0, threshold=0.0, agreement='previous', value='t',
                 momentum=0.9):
        super().__init__(shape, scale, threshold, agreement, value)
        self._check_momentum(momentum, False)

    def chunk(self, start, stop):
        return type(self)((stop - start,), self.scale, self.threshold, self.agreement,
                          self.value, self.momentum)

    def corrected_round(self, velocity, state, num_workers, rank):
        total = yield from AdditiveTernaryCodec.step(self, velocity, state, num_workers,
                                                     rank)
        return total, None
