"""Additive codecs whose workers must first agree on something: the step they share.

Additive payloads add up on the stock server only if every worker encodes with the
same parameters (the FC threshold, the conv filter set). Those come from a small
statistic of each worker's ``acc = grad + residual`` (``statistic``: abs-sum for FC,
per-filter squared norms for conv), summed over workers. Two ways to get the sum
(``agreement``):

* ``'round'``: a tiny ``Sum`` round (``'agree'``) before every encode. Exact (this
  step's acc), but each compressed key waits for one extra round trip before it can
  encode.
* ``'previous'``: the statistic travels at the tail of the previous step's payload,
  so the previous aggregate brings it, identical on every worker, at no extra round
  trip. It is taken after encoding, from ``grad + residual`` with the residual already
  updated: its prediction of the next step's acc (a filter just sent counts only its
  fresh gradient, so it is not picked again at once unless that is large, while
  unsent filters keep accumulating: no filter starves). It is chunk state
  (``'agreed'``), checkpointed with the residual. The first step has none and runs
  one round.

A void round (a worker's non-finite gradient, rounds.py) ends the step on every worker
at once, with a NaN sum: after a void agreement nothing is encoded, and a void payload
leaves the carried statistic as it was.

One step (``AgreedCodec.step``), numbered as in the code:

1. the agreed statistic: carried from the previous aggregate, or summed by a round;
2. ``settle``: what every worker derives from it (threshold, filter set), once;
3. ``encode_sum``: the additive payload (residual updated in place), plus, in
   ``'previous'`` mode, the statistic of the updated acc at its tail;
4. one ``Sum`` round (``'payload'``);
5. ``decode_sum`` of the summed payload; the summed tail is the next step's agreement.
   Nothing of the sum is read here (a void sum decodes to NaN), so the store may defer
   the statuses (``deferred_checks``) from the second step of ``'previous'`` on.
"""
from .base import Codec
from ..rounds import Sum, is_void, void_sum

MODES = ('previous', 'round')


class AgreedCodec(Codec):
    """Base of additive codecs. Subclasses set ``agreement_words`` (0: nothing to agree
    on) and implement ``statistic``, ``settle``, ``encode_sum``, ``decode_sum`` and
    ``sum_words``."""

    agreement_words = 0

    def __init__(self, shape, agreement='previous'):
        super().__init__(shape)
        if agreement not in MODES:
            raise ValueError('agreement must be one of %s, got %r' % (MODES, agreement))
        self.agreement = agreement

    @property
    def carries(self):
        """True if the payload carries the next step's agreement at its tail."""
        return self.agreement_words > 0 and self.agreement == 'previous'

    def state_shapes(self):
        return {'agreed': (self.agreement_words,)} if self.carries else {}

    def step(self, grad, state, num_workers, rank):
        residual = state.residual
        # 1. the agreed statistic
        agreed = state.get('agreed')
        if self.agreement_words and agreed is None:
            agreed = yield Sum('agree', self.statistic(grad, residual))
            if is_void(agreed):       # a worker's NaN: every worker stops here
                return void_sum(self.shape)
        state.last['agreed'] = agreed
        # 2. what every worker derives from it
        settled = self.settle(agreed, num_workers)
        # 3. the additive payload, with the next step's statistic at its tail
        words = self.encode_sum(grad, residual, num_workers, settled)
        if self.carries:
            from mxnet import ndarray
            words = ndarray.concat(words, self.statistic(grad, residual), dim=0)
        # 4. one round
        summed = yield Sum('payload', words)
        # 5. decode, without reading the sum (that would wait for the round, and hold
        # back every later key): a void sum (a worker's NaN) decodes to NaN everywhere
        # (the decoders' VOID, cpp/op_util.h void_sum), and the summed tail becomes the
        # next step's agreement unless the sum was void (an engine op; a copy: the pull
        # buffer is reused)
        if self.carries:
            from mxnet import ndarray
            body = summed.size - self.agreement_words
            void = ndarray.broadcast_to(summed[0:1] != summed[0:1],
                                        shape=(self.agreement_words,))
            state['agreed'] = ndarray.where(void, agreed, summed[body:])
            summed = summed[:body]
        return self.decode_sum(summed, num_workers, settled)

    @property
    def deferred_checks(self):
        """One round a step ('previous'), and encoders and decoders that handle a void
        step without a read (cpp/ops.cc): the store need not wait for them."""
        return self.carries

    def deferrable(self, state):
        """Not the first step: it has no carried statistic and runs the agreement
        round, whose result it must read."""
        return self.carries and state.get('agreed') is not None

    def wire_words(self, num_workers):
        words = self.sum_words(num_workers) + (self.agreement_words if self.carries else 0)
        rounds = [('payload', 'sum', words, words)]
        if self.agreement_words and not self.carries:
            rounds.insert(0, ('agree', 'sum', self.agreement_words, self.agreement_words))
        return rounds

    # -- what a subclass defines ----------------------------------------------------
    def sum_words(self, num_workers):
        """Length of the additive payload (float32 words) for ``num_workers``."""
        raise NotImplementedError

    def statistic(self, grad, residual):
        """Small float32 array each worker contributes; the sum is what all agree on."""
        raise NotImplementedError

    def settle(self, agreed, num_workers):
        """What every worker derives from the agreed sum (``agreed`` is None if the codec
        needs no agreement): the parameters ``encode_sum`` and ``decode_sum`` take."""
        return None

    def encode_sum(self, grad, residual, num_workers, settled):
        raise NotImplementedError

    def decode_sum(self, summed, num_workers, settled):
        raise NotImplementedError
