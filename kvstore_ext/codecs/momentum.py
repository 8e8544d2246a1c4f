"""DGC's momentum correction and factor masking (Lin et al., "Deep Gradient
Compression", ICLR 2018) as a wrapper over any codec: ``MomentumCorrected(codec,
momentum, masking)``, for an SGD optimizer with momentum ``m`` that runs unchanged on
the workers (python/kvx_ref/momentum.py is the spec).

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

Why a wrapper: the correction is the same around every codec: the velocity goes in
the gradient's place (so the wrapped codec's error feedback, its residual, works on
``u + residual``), and masking needs only the rows the step sent. A codec says those
through ``Codec.step_sent`` (``reports_sent``: filters for the top-k codecs, elements
for element top-k and AdaComp); one that cannot say (the ternary codecs) is wrapped
with ``masking=False``. So Hylo's choice is a codec for the layer and the aggregation
mode, then whether to wrap it; dist_sync_topk and dist_sync_adacomp wrap theirs too.

Whether a step masks (``masking``): always (True, DGC's rule), never (False), or as a
callable says at each step: ``HighRateMasking``, while the learning rate is near its
peak and not once a schedule has decayed it (docs/decisions/hylo-momentum-masking.md).

State: ``velocity`` (this worker's own: a void step keeps it) and ``delivered`` (the
previous S, the same on every worker), both checkpointed under the chunk's prefix
beside the wrapped codec's own arrays (``0.velocity``, ``0.delivered``, ``0.agreed``).

Hylo's FC ternary codes the velocity too, *without* masking: error feedback on the
velocity, as in error-compensated momentum SGD, so that the weights move by the sent
velocities, which add up to momentum SGD's steps, only later. Every FC value is coded
each step and waits a few steps at most, so the stale momentum that masking guards a
top-k against barely arises; masked, the FC layers of an MLP trained 48 steps by 8
workers learned too slowly (a train loss of 0.48 against 0.36) and ended a point below
``dist_sync`` (docs/decisions/hylo-fc-momentum-correction.md).
"""
import numpy as np

from ..ops import op
from .base import Codec


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


class MomentumCorrected(Codec):
    """``codec`` with DGC's momentum correction (see the module docstring): its step
    runs ``codec``'s step on the velocity ``u = m u + grad``, zeroes ``u`` on the rows
    ``codec`` reports sent when ``masking`` says so, and returns ``S - m S_prev``.

    The wrapped codec keeps everything else: its rounds, chunking, error feedback and
    payloads; its parameters read through the wrapper (``codec.k``, ``codec.scale``).
    ``kind()`` is (this class, the wrapped codec's kind): a re-plan keeps the velocity
    when the wrapped codec stays of the same kind (planning.py)."""

    def __init__(self, codec, momentum=0.9, masking=True):
        super().__init__(codec.shape)
        if isinstance(codec, MomentumCorrected):
            raise ValueError('%r has momentum correction already' % (codec,))
        if not 0 < float(momentum) < 1:
            raise ValueError('momentum must be in (0, 1), got %r' % (momentum,))
        if masking is not False and not codec.reports_sent:
            raise ValueError('masking needs a codec that reports the rows it sent '
                             '(Codec.reports_sent); %r does not: wrap it with '
                             'masking=False' % (codec,))
        self.inner = codec
        self.momentum = float(momentum)
        self.masking = masking if callable(masking) else bool(masking)

    def __getattr__(self, name):
        # only reached for what this class does not define: the wrapped codec's
        # parameters and methods (k, scale, agreement, payload_words, encode, ...)
        if name == 'inner':
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- what the store reads of a codec: the wrapped codec's, but for the state -------
    name = property(lambda self: self.inner.name)
    uses_residual = property(lambda self: self.inner.uses_residual)
    chunk_by_rows = property(lambda self: self.inner.chunk_by_rows)
    deferred_checks = property(lambda self: self.inner.deferred_checks)
    passthrough = False      # the velocity is this step's to keep: never MXNet's own
    sums_into = True         # S - m S_prev goes straight into the output's part

    @property
    def local_state(self):
        return tuple(self.inner.local_state) + ('velocity',)

    def deferrable(self, state):
        return self.inner.deferrable(state)

    def chunk_layout(self):
        return self.inner.chunk_layout()

    def chunk(self, start, stop):
        return type(self)(self.inner.chunk(start, stop), self.momentum, self.masking)

    def wire_words(self, num_workers):
        return self.inner.wire_words(num_workers)

    def state_shapes(self):
        return dict(self.inner.state_shapes(), velocity=self.shape, delivered=self.shape)

    def kind(self):
        return (type(self), self.inner.kind())

    def same_as(self, other):
        return (type(self) is type(other) and self.momentum == other.momentum
                and self.masking == other.masking and self.inner.same_as(other.inner))

    # -- one step --------------------------------------------------------------------
    def masks_now(self):
        """Whether this step zeroes the velocity of the rows it sent."""
        return bool(self.masking()) if callable(self.masking) else self.masking

    def _next_velocity(self, grad, state):
        velocity = state.get('velocity')
        if velocity is None:
            return grad.copy()
        return op('kvx_momentum_velocity')(velocity, grad, momentum=self.momentum)

    def compressed_input(self, grad, state):
        """The velocity, not the gradient, goes with the residual."""
        return self.inner.compressed_input(self._next_velocity(grad, state), state)

    def owed(self, state, num_workers):
        """What the key owes the optimizer when it leaves this correction (a re-plan to
        float32, or to a codec of another kind), as a gradient for its next step:
        ``(1 - m) R + m u - m S_prev / N``, whose sum over the N workers is
        ``(1 - m) sum R + m sum u - m S_prev``.

        Why not the residual as it is: R holds velocities, not gradients, and the
        optimizer's buffer still holds ``S_prev``, which only this codec's next step
        would have taken out. Sent as a gradient, R would pass through the momentum
        once more (moving the weights by R / (1 - m), ten times what it owes at 0.9)
        and ``S_prev`` would add ``m S_prev / (1 - m)``. With the sum above, the
        buffer after that step is ``(1 - m) sum R + m sum u + g``: the unsent velocities
        move the weights by exactly R over the next steps (spread, not one lump) and
        the velocity goes on as momentum SGD's would (the optimizer's momentum is m,
        as everywhere in this correction)."""
        from mxnet import ndarray
        m = self.momentum
        residual = self.inner.owed(state, num_workers)
        velocity, delivered = state.get('velocity'), state.get('delivered')
        owed = ndarray.zeros(self.shape, dtype=np.float32)
        if residual is not None:
            owed += (1 - m) * residual.reshape(self.shape)
        if velocity is not None:
            owed += m * velocity
        if delivered is not None:
            owed -= (m / num_workers) * delivered
        return owed

    def step(self, grad, state, num_workers, rank):
        from mxnet import ndarray
        # a fresh array, this step's own: masking may zero its rows in place
        velocity = self._next_velocity(grad, state)
        # a NaN/Inf raises in the encoder, before the residual or the velocity changes
        total, sent = yield from self.inner.step_sent(velocity, state, num_workers, rank)
        if sent is not None and sent.size and self.masks_now():
            # rows of chunk_layout: filters, or single elements (element top-k); an
            # index of ``rows`` is a fixed-size payload's padding (nothing sent)
            if sent.dtype != np.int64:
                sent = ndarray.cast(sent, 'int64')
            op('kvx_zero_rows')(sent.reshape((-1,)), velocity,
                                rows=self.chunk_layout()[0])
        state['velocity'] = velocity
        total = total.reshape(self.shape)
        delivered = state.get('delivered')
        if delivered is None:
            delivered = state['delivered'] = ndarray.zeros(self.shape, dtype=np.float32)
        # out = S - m S_prev, and S becomes the delivered sum, in place (not local state:
        # every worker has the same). A void round (a worker's NaN) is NaN everywhere:
        # the step returns NaN, the optimizer skips it, and the previous S stays (no
        # wait for the result). The sum goes straight into the store's output if given.
        into = None if state.out is None else state.out.reshape(self.shape)
        out = op('kvx_momentum_deliver')(total, delivered, momentum=self.momentum, out=into)
        return out if state.out is None else state.out

    def describe(self):
        masking = ('' if self.masking is True else ', no masking' if self.masking is False
                   else ', masking follows the learning rate')
        return '%s, momentum correction %g%s' % (self.inner.describe(), self.momentum,
                                                 masking)

    def __repr__(self):
        return 'MomentumCorrected(%r, momentum=%g)' % (self.inner, self.momentum)
