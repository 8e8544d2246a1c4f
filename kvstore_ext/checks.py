"""Status checks of the encoders' and decoders' outputs: raise now, or collect for later.

A module of its own because both sides use them: the codecs (codecs/), after their
encode ops, and the servers' re-encoding (aggregate.py); so neither imports the other.
"""
from .errors import VOID, NonFiniteGradientError, PayloadError, status_message

_deferred = None     # the list deferred_checks() collects statuses into, while active


class deferred_checks:
    """Within it, ``check_encoded`` collects ``(status, what)`` into the list ``with``
    gives instead of waiting for the encoder: the store reads them later (store.py)."""

    def __enter__(self):
        global _deferred
        self._outer, _deferred = _deferred, []
        return _deferred

    def __exit__(self, *exc):
        global _deferred
        _deferred = self._outer


def check_encoded(status, what='gradient', defer=True):
    """Raise if an encoder reported a non-finite input (status: 1-element NDArray), or
    collect the status if a ``deferred_checks`` is active (``defer=False``: never,
    for the servers' re-encoding)."""
    if defer and _deferred is not None:
        _deferred.append((status, what))
        return
    code = int(status.asscalar())
    if code:
        raise NonFiniteGradientError(
            '%s: %s; nothing was sent and the residual is unchanged'
            % (what, status_message(code)))


def check_decoded(status, what='payload'):
    """Raise if a decoder rejected a payload (``VOID``, a void sum decoded to NaN, only
    says the step was void); inside ``deferred_checks``, collect the status instead."""
    if _deferred is not None:
        _deferred.append((status, what))
        return
    code = int(status.asscalar())
    if code and code != VOID:
        raise PayloadError('%s rejected: %s' % (what, status_message(code)))
