"""Hylo's conv codec: send the k output filters of ``grad + residual`` with the largest
L2 norms (indices + float32 values); the other filters stay in the residual."""
import math

import numpy as np

from .base import GatherCodec, check_encoded
from ..ops import op
from ..rounds import Gather
from ..wire import HEADER_WORDS, TOPK, topk_payload_words


class FilterTopKCodec(GatherCodec):
    name = 'topk'
    chunk_by_rows = True

    def __init__(self, shape, k, compressed_reply=False):
        super().__init__(shape)
        self.compressed_reply = bool(compressed_reply)
        filters = self.shape[0]
        if not 1 <= int(k) <= filters:
            raise ValueError('k must be between 1 and the %d filters, got %r' % (filters, k))
        self.k = int(k)
        self.filter_size = self.size // filters

    def chunk(self, start, stop):
        """A chunk of filters sends the same share of its filters (at least one)."""
        filters = stop - start
        k = min(max(math.ceil(self.k * filters / self.shape[0]), 1), filters)
        return type(self)((filters,) + self.shape[1:], k, self.compressed_reply)

    def payload_words(self):
        return topk_payload_words(self.k, self.filter_size)

    def encode(self, grad, residual):
        payload, status = op('kvx_topk_encode')(grad, residual, k=self.k)
        check_encoded(status)
        return payload

    def reply_request(self):
        """The servers send the top k filters of sum + their residual."""
        return (TOPK, self.size, self.k, self.filter_size, 0.0)

    def describe(self):
        return 'top %d of %d filters%s' % (self.k, self.shape[0], ', compressed reply'
                                           if self.compressed_reply else '')



class MomentumTopKCodec(FilterTopKCodec):
    """The conv top-k with DGC's momentum correction and factor masking (Lin et al.,
    "Deep Gradient Compression", ICLR 2018), for an SGD optimizer with momentum ``m``
    that runs unchanged on the workers (python/kvx_ref/momentum.py is the spec).

    Why: a filter that waits k steps in the residual reaches the optimizer as one
    lump, whose momentum then spreads it over the next ~1/(1-m) steps: its update
    lags by the wait *and* the momentum's tail. With 8 workers on a short run this
    cost cnn512 about 6 points (docs/RESULTS.md section 7). DGC accumulates the
    velocity instead of the gradient on the worker, ``u = m u + grad``, sends the top
    filters of ``u + residual`` and zeroes ``u`` on the filters sent (factor masking:
    their momentum left with them). Its optimizer applies plain SGD to the sum ``S``
    of what was sent. Here the optimizer keeps its momentum, so the step returns
    ``S - m S_prev``: the optimizer's buffer then holds ``S`` (times -lr) and moves
    the weights by exactly ``-lr S``. (Weight decay still goes through the
    optimizer's momentum; a changing learning rate leaves an error of
    ``m (lr_t - lr_(t-1)) S_prev``, which decays by m a step.)

    State: ``velocity`` (this worker's own: a void step keeps it) and ``delivered``
    (the previous S, the same on every worker), both checkpointed."""

    local_state = ('velocity',)

    def __init__(self, shape, k, compressed_reply=False, momentum=0.9):
        super().__init__(shape, k, compressed_reply)
        if not 0 < float(momentum) < 1:
            raise ValueError('momentum must be in (0, 1), got %r' % (momentum,))
        self.momentum = float(momentum)

    def chunk(self, start, stop):
        part = super().chunk(start, stop)
        return type(self)(part.shape, part.k, self.compressed_reply, self.momentum)

    def state_shapes(self):
        return {'velocity': self.shape, 'delivered': self.shape}

    def step(self, grad, state, num_workers, rank):
        from mxnet import ndarray
        velocity = state.get('velocity')
        velocity = grad.copy() if velocity is None else velocity * self.momentum + grad
        # raises on NaN/Inf before the residual or the velocity changes
        payload = self.encode(velocity, state.residual)
        filters = self.shape[0]
        sent = ndarray.one_hot(payload[HEADER_WORDS:HEADER_WORDS + self.k], filters).sum(0)
        state['velocity'] = ndarray.broadcast_mul(
            velocity.reshape((filters, -1)), (1 - sent).reshape((filters, 1))
        ).reshape(self.shape)
        if self.compressed_reply:
            total = yield Gather('payload', payload, self.size, self.reply_request(),
                                 self.payload_words())
        else:
            total = yield Gather('payload', payload, self.size)
        total = total.reshape(self.shape)
        previous = state.get('delivered')
        if previous is None:
            previous = ndarray.zeros(self.shape, dtype=np.float32)
        # a void round (another worker's NaN) is NaN everywhere: the step returns NaN,
        # the optimizer skips it, and the previous S stays (no wait for the result)
        state['delivered'] = ndarray.where(total == total, total, previous)
        return total - self.momentum * previous

    def describe(self):
        return '%s, momentum correction %g' % (super().describe(), self.momentum)
