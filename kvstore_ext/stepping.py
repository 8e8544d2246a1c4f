"""One step of a planned key: the worker's devices summed, the chunks' codec steps run
through the transport, the sum written to every output.

Why a module of its own: store.py answers MXNet's calls (arguments, checks, what a
``pull`` returns); what a step does with a key's plan (planning.py) is one job, the
same for ``pushpull`` and ``push``, and a NaN in the gradient hands it over to
void_steps.py.
"""
import numpy as np

from mxnet.context import cpu

from . import chunking, policy
from .codecs.base import GatherCodec
from .errors import NonFiniteGradientError
from .ops import op
from .rounds import drive
from . import void_steps


def copy_into(src, dst):
    """``src.copyto(dst)`` unless they are the same array (e.g. broadcast in place)."""
    if src.handle.value != dst.handle.value:
        src.copyto(dst)


def run(store, state, values, outs, step):
    """Step ``step`` of the planned key ``state``: the sum over devices and workers of
    ``values`` (one array per device) written into every one of ``outs``."""
    flush = state.flush
    if state.plain:
        if flush is not None:
            values[0] += flush.as_in_context(values[0].context).astype(values[0].dtype)
        pushed, pulled = policy.pushpull_plain(store, state, values, outs, step)
        store._stats.record(state.key, state.raw_bytes, pushed, pulled)
        _settle_flush(state, flush, outs[0])
        return
    grad = sum_devices(values)
    if state.dtype != np.float32:
        grad = grad.astype(np.float32)
    if flush is not None:
        grad = grad + flush.as_in_context(grad.context)
    scheme = store._scheme
    if scheme.observes(state.key, step, store.rank):
        parts = [c.codec.compressed_input(c.view(grad), cs)
                 for c, cs in zip(state.chunks, state.chunk_states)]
        scheme.observe(state.key, chunking.assemble(state.chunks, parts, grad.shape), step)
    target = outs[0] if outs[0].dtype == np.float32 and outs[0].context == cpu() else None
    summed, pushed, pulled = exchange_step(store, state, grad, step, target)
    store._stats.record(state.key, state.raw_bytes, pushed, pulled)
    _settle_flush(state, flush, summed)
    if state.dtype != np.float32:
        summed = summed.astype(state.dtype)
    for o in outs:
        copy_into(summed, o)


def exchange_step(store, state, grad, step, target=None):
    """Run the chunks' steps (their rounds through the transport): (the float32
    sum over workers, written into ``target`` if given, bytes pushed, bytes
    pulled). A non-finite gradient makes the step void (void_steps.py)."""
    transport, num_workers, rank = store._transport, store.num_workers, store.rank
    traffic = [0, 0]
    # chunks whose step returns its Gather round's sum as it is: the transport
    # writes the sum straight into the output's part (no assembling copy)
    direct = (target is not None and len(state.chunks) > 1
              and all(type(c.codec).step is GatherCodec.step for c in state.chunks))
    # codecs that compute their sum themselves write it into the output's part (set,
    # or cleared, every step: a step without a float32 target must not write into the
    # last step's)
    sums_into = state.chunks[0].codec.sums_into
    into = sums_into and target is not None
    if sums_into:
        for c, cs in zip(state.chunks, state.chunk_states):
            cs.out = c.view(target) if into else None

    def exchange(requests):
        if direct:      # GatherCodec.step yields Gather rounds only
            for index, request in requests:
                request.out = state.chunks[index].view(target).reshape((-1,))
        results, pushed, pulled = transport.exchange(state.key, requests)
        traffic[0] += pushed
        traffic[1] += pulled
        return results

    voided = False
    if state.deferred and all(c.codec.deferrable(cs) for c, cs in
                              zip(state.chunks, state.chunk_states)):
        parts = void_steps.deferred_step(state, grad, step, exchange, num_workers, rank)
    else:
        try:
            if state.check_whole is not None and (state.check_whole or step == 0):
                void_steps.check_finite(state.key, grad)
            steps = [c.codec.step(c.view(grad), cs, num_workers, rank)
                     for c, cs in zip(state.chunks, state.chunk_states)]
            parts = drive(steps, exchange)
        except NonFiniteGradientError:
            parts, voided = void_steps.void_step(state, exchange, num_workers, rank), True
    if (direct and not voided) or (into and all(
            part is cs.out for part, cs in zip(parts, state.chunk_states))):
        return target, traffic[0], traffic[1]
    summed = chunking.assemble(state.chunks, parts, grad.shape, target)
    return summed, traffic[0], traffic[1]


def _settle_flush(state, flush, summed):
    """What a re-plan left owed (``flush``, added to this step's gradient) is paid if
    the step's sum is finite. A NaN or Inf on any worker makes the step void on every
    worker (its sum is NaN, the caller skips it), and the flush would be lost with it:
    it goes again with the next step. The check waits for the sum, once a re-plan."""
    if flush is not None:
        bad = op('kvx_finite_check')(summed.astype(np.float32, copy=False).reshape((-1,)))
        state.flush = flush if int(bad.asscalar()) else None


def sum_devices(values):
    """The worker's devices summed on CPU: the one CPU array itself (encoders only
    read it), or a fresh sum (inputs stay as they are)."""
    if len(values) == 1 and values[0].context == cpu():
        return values[0]
    total = values[0].copyto(cpu())
    for v in values[1:]:
        total += v.as_in_context(cpu())
    return total
