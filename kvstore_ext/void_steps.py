"""Void steps: what a key's step does when this worker's gradient holds NaN or Inf.

Why: MXNet's ``dist_sync`` answers a NaN with a NaN sum (NaN + x = NaN), and the
caller skips the step. A compressing store must give the same answer without losing
what it keeps between steps (the residual, a codec's state), and without leaving the
other workers waiting for this worker's rounds. So the worker takes part in every
round of the key with void (all-NaN) contributions, every worker's sum is NaN, and
this worker's state stays as it was (docs/DESIGN.md, "Errors and state").

Two ways to find the NaN: before anything is sent (``check_finite``, or the encoder
raising ``NonFiniteGradientError``: ``void_step`` then runs the rounds), or, for
single-round codecs whose encoders can push a void payload by themselves, after the
push (``deferred_step``; ``resolve`` reads the statuses at the key's next step), so
that no key waits for its gradient's backward pass before being pushed.
"""
import logging

import numpy as np

from .codecs.base import deferred_checks
from .errors import NONFINITE, VOID, NonFiniteGradientError, status_message
from .ops import op
from .rounds import drive, void

log = logging.getLogger('kvstore_ext')
_nan = []       # a 1-element float32 NaN array, made once (deferred_step)


def check_finite(key, grad):
    """Raise NonFiniteGradientError if ``grad`` holds NaN or Inf."""
    if int(op('kvx_finite_check')(grad.reshape((-1,))).asscalar()):
        raise NonFiniteGradientError(
            'key %r: gradient holds non-finite values (NaN or Inf)' % (key,))


def void_step(state, exchange, num_workers, rank):
    """This worker's gradient of the key is non-finite: take part in the key's
    rounds with void (all-NaN) contributions (rounds.void), so that the other
    workers are not left waiting and every worker's sum is NaN (the caller skips
    the step, as with dist_sync, where NaN + x = NaN). Returns the chunks' sums (NaN).

    The chunks' steps run on a zero gradient and a scratch copy of their state
    (``ChunkState.void`` set), only to make the same rounds as the other workers'
    steps. The residual stays as it was. State the codecs derive from round
    results (an agreed statistic, PowerSGD's Q) is taken from the scratch run: it
    saw the same NaN results as every other worker, so the workers' states still
    agree (the codecs recover from a NaN there at their next step); a codec's
    ``local_state`` stays as it was, as the residual does."""
    from mxnet import ndarray
    log.warning('key %r: non-finite gradient (NaN or Inf) on this worker (rank %d): '
                'it sent a void contribution, every worker\'s sum of this key is NaN '
                'this step; skip the step. The residual is unchanged.', state.key, rank)
    scratch = [cs.scratch() for cs in state.chunk_states]
    steps = [c.codec.step(ndarray.zeros(c.codec.shape, dtype=np.float32), s,
                          num_workers, rank)
             for c, s in zip(state.chunks, scratch)]
    drive(steps, lambda requests: exchange([(i, void(r)) for i, r in requests]))
    for chunk, cs, s in zip(state.chunks, state.chunk_states, scratch):
        cs.adopt_shared(s, chunk.codec.local_state)
    return [ndarray.full(c.codec.shape, np.nan, dtype=np.float32) for c in state.chunks]


def deferred_step(state, grad, step, exchange, num_workers, rank):
    """The key's step without waiting for its encoders (``Codec.deferred_checks``):
    waiting for an encoder's status waits for the backward pass to produce the
    gradient, and kept every later key from being pushed meanwhile (docs/DESIGN.md,
    "Deferred checks"). A bad gradient still voids the step: the encoder keeps the
    residual and pushes a void payload, so every worker's sum is NaN, and
    ``resolve`` reads the statuses at the key's next step (or at a save, or an
    inspection), logs, and puts back the local state the step replaced (DGC's
    velocity).

    A tensor of several chunks is void as a whole, as with the synchronous check:
    if any of its values is non-finite, engine ops set each chunk's first value
    of ``grad`` to NaN first, so that every chunk's encoder fails."""
    from mxnet import ndarray
    if len(state.chunks) > 1:
        bad = op('kvx_finite_check')(grad.reshape((-1,)))
        if not _nan:
            _nan.append(ndarray.full((1,), np.nan, dtype=np.float32))
        for chunk in state.chunks:      # in place, one op (not __setitem__: a copy)
            first = chunk.view(grad).reshape((-1,))[0:1]
            ndarray.where(bad, _nan[0], first, out=first)
    kept = [{name: cs.get(name) for name in chunk.codec.local_state}
            for chunk, cs in zip(state.chunks, state.chunk_states)]
    with deferred_checks() as statuses:
        steps = [c.codec.step(c.view(grad), cs, num_workers, rank)
                 for c, cs in zip(state.chunks, state.chunk_states)]
        parts = drive(steps, exchange)
    state.pending = (step, statuses, kept)
    return parts


def resolve(state, rank):
    """Read the statuses of the key's last deferred step (long done by now): if
    its gradient was non-finite, log as ``void_step`` does and give the chunks back
    the local state the void step replaced; any other failure is a bug, raised (its
    payload was void too, so no sum used it). A decoder's ``VOID`` (homomorphic: a
    worker's void contribution made the sum NaN) needs nothing: if the worker was
    this one, its encoder's status says so. Nothing pending: nothing to do."""
    if state.pending is None:
        return
    step, statuses, kept = state.pending
    state.pending = None
    codes = [int(status.asscalar()) for status, _ in statuses]
    if not any(code not in (0, VOID) for code in codes):
        return
    for cs, arrays in zip(state.chunk_states, kept):
        cs.put_back(arrays)
    failed = [(code, what) for code, (_, what) in zip(codes, statuses)
              if code not in (0, NONFINITE, VOID)]
    if failed:
        raise RuntimeError('key %r: a codec failed at step %d (%s): %s' % (
            state.key, step, failed[0][1], status_message(failed[0][0])))
    log.warning('key %r: non-finite gradient (NaN or Inf) on this worker (rank %d) at '
                'step %d: it sent a void contribution, every worker\'s sum of this key '
                'was NaN that step; skip the step. The residual is unchanged.',
                state.key, rank, step)


def resolve_all(states, rank):
    """``resolve`` every key with a deferred step (a save needs its state as the step
    left it)."""
    for state in states:
        resolve(state, rank)
