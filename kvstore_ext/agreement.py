"""What the workers agree on before an additive (homomorphic) encode, for one chunk.

Additive payloads add up on the stock server only if every worker encodes with the
same parameters (the FC threshold, the conv filter set). Those come from a small
statistic of each worker's ``acc = grad + residual`` (codec.agreement: abs-sum for FC,
per-filter squared norms for conv), summed over workers. Two ways to get the sum:

* ``'round'``: a tiny sum-mode round before every encode. Exact (this step's acc),
  but each compressed key waits for one extra round trip before it can encode.
* ``'previous'``: the statistic travels at the tail of the previous step's payload,
  so the previous aggregate brings it, identical on every worker, at no extra round
  trip. It is taken after encoding, from ``grad + residual`` with the residual already
  updated: its prediction of the next step's acc (a filter just sent counts only its
  fresh gradient, so it is not picked again at once unless that is large, while
  unsent filters keep accumulating: no filter starves).
  The first step has no previous aggregate and runs one round.

The agreed statistic is training state in ``'previous'`` mode: ``save_compression_state``
saves it with the residuals, so a resumed run encodes exactly as an uninterrupted one.
"""

def tail_words(codec):
    """Words a chunk's payload carries for the next step's agreement."""
    return codec.agreement_words if codec.agreement_mode == 'previous' else 0


def settled(codec, agreement, num_workers):
    """What a chunk's encode and decode take: derived from the agreement, if any."""
    if agreement is None:
        return codec.settle(None, num_workers)
    return agreement.settled(num_workers)


class Agreement:
    """The agreed statistic of one additive chunk (``codec.agreement_words`` floats)."""

    def __init__(self, codec, restored=None):
        self.codec = codec
        self.mode = codec.agreement_mode        # 'round' or 'previous' (Hylo validates it)
        self.current = restored if self.mode == 'previous' else None   # for the next encode
        self.used = None        # what the last encode used (for inspection and tests)
        self._settled = None    # codec.settle(current): derived once a step

    @property
    def words(self):
        return self.codec.agreement_words

    @property
    def tail_words(self):
        return tail_words(self.codec)

    def needs_round(self):
        """True if this step must first run an agreement round."""
        return self.mode == 'round' or self.current is None

    def contribution(self, grad, residual):
        """This worker's share of the statistic, of ``grad + residual`` as they are now."""
        return self.codec.agreement(grad, residual)

    def settled(self, num_workers):
        """The codec's parameters derived from ``current`` (threshold, filter set),
        computed once for both the encode and the decode of a step."""
        if self._settled is None:
            self._settled = self.codec.settle(self.current, num_workers)
        return self._settled

    def agreed_by_round(self, summed):
        self.current = self.used = summed
        self._settled = None

    def agreed_by_previous(self, summed_tail):
        """After this step's decode: keep the tail of its aggregate for the next step (a
        copy: the pull buffer is overwritten by the next step)."""
        self.used = self.current
        self.current = summed_tail.copy()
        self._settled = None

    def saved(self):
        """The NDArray to checkpoint, or None if nothing carries over to the next step."""
        return self.current if self.mode == 'previous' else None
