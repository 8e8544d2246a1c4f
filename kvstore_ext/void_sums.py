"""Void sums: a codec that finds a NaN/Inf in its own summed rounds
(``Codec.finds_nonfinite_in_sums``), and what the store says when one does.

Why: the store's check of a key's whole gradient before its first round
(void_steps.check_finite) waits for the key's backward pass before anything is
pushed. A codec whose every worker's non-finite value reaches a round's sum does not
need it: every worker sees the same sums, so every worker finds the same non-finite
sum, voids the step and keeps its state as it was, the outcome of a void step
(void_steps.py). PowerSGD is such a codec: a NaN or Inf in row i of a worker's M makes
row i of its P = M Q non-finite (NaN * x = NaN, Inf * 0 = NaN, Inf * x = +-Inf, also
where Q has an all-zero row; tests/test_powersgd.py checks MXNet's ``dot``), and the
sum over workers keeps it.

The sums say that some worker's gradient was non-finite, not which: only then (the
rare path) does the store check this worker's own gradient, so that the worker whose
gradient it was logs the warning void_steps.void_step logs, naming its rank; the
others log at INFO that the sum was non-finite (another worker's gradient, or an
overflow): void_steps warns only on the worker whose gradient it was, too.
"""
import logging

from .ops import op

log = logging.getLogger('kvstore_ext')


def nonfinite(array):
    """True if ``array`` holds NaN or Inf (reads the result: waits for ``array``)."""
    return bool(int(op('kvx_finite_check')(array.reshape((-1,))).asscalar()))


def report(state, grad, rank):
    """After a step of ``state``'s key whose codec finds NaN in its sums: if a chunk's
    step was void (``last['void']``), log why, naming this worker if its own
    gradient ``grad`` was non-finite. Returns True if the step was void."""
    if not any(cs.last.get('void') for cs in state.chunk_states):
        return False
    if nonfinite(grad):
        log.warning('key %r: non-finite gradient (NaN or Inf) on this worker (rank %d): '
                    'its contribution made every worker\'s sum of this key NaN this '
                    'step; skip the step. The residual is unchanged.',
                    state.key, rank)
    else:
        log.info('key %r: a round\'s sum over workers was non-finite (another worker\'s '
                 'gradient held NaN or Inf, or the sum overflowed): the step is void on '
                 'every worker (rank %d skips it too); the residual is unchanged.',
                 state.key, rank)
    return True
