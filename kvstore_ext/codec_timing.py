"""policy='auto' with codec_times='measured': time, on each worker, the codecs the policy
would compress with, on their real shapes, and agree on the times (one Sum round).

Why: the policy weighs a codec's seconds against the bytes it saves. The shipped kernel
table (cost.KERNEL_TIMES) was measured on another CPU, one thread, alone; where the
workers and servers share the cores the codecs run several times slower, and the
policy compressed keys whose codec cost more than their bytes (docs/COST_MODEL.md,
docs/decisions/policy-measured-codec-times.md). Timed where the job runs, the codecs are
priced as they will run. Every worker must still decide the same for a key, so the
times are agreed: each worker fills its own slot of one Sum round and every worker
takes, per codec, the slowest worker's seconds (a synchronous step waits for the
slowest worker).

How a codec is timed (``measure``): a random gradient of its chunk's shape, its step
driven through the one-process transport (transport/local.py: the servers' own decode
and compressed reply), a first untimed step (a key's first step may run a round the
steady state does not), then the best of ``REPEATS`` steps; the servers' decode of one
payload (aggregate.decode_sum) is timed on its own and taken out of the worker's share,
as cost_calibrate.py does, so the model counts it once per worker at the servers. Not
through a one-process store as cost_calibrate.py times: inside a job
(``DMLC_ROLE=worker``) a new store would join the job's parameter servers, so the codec
is driven here without one, and the store's own Python per key is not in these times.
Synthetic, not the key's first compressed steps: until the workers agree, policy='auto'
sends a measured-rate key float32, so there is no real encode to time, and a codec's
speed depends on its shape, not on the values.
"""
import logging
import time

import numpy as np

from . import chunking
from .cost import signature
from .cost_calibrate import _best

log = logging.getLogger('kvstore_ext')

REPEATS = 3


def measure(codec, workers, chunk_size):
    """{chunk codec signature (cost.signature): (worker seconds, servers' seconds per
    worker's payload)} of one step of ``codec``, timed here (module docstring)."""
    from mxnet import ndarray
    from .aggregate import decode_sum
    from .codecs.base import GatherCodec, innermost
    from .memory import ChunkState
    from .rounds import drive
    from .transport.local import LocalTransport
    found = {}
    rng = np.random.default_rng(0)
    for chunk in chunking.split(codec, chunk_size):
        part = chunk.codec
        if signature(part) in found:
            continue
        transport = LocalTransport()
        grad = ndarray.array(rng.standard_normal(part.shape).astype(np.float32) * 0.01)
        residual = ndarray.zeros(part.shape, dtype=np.float32) if part.uses_residual \
            else None
        state = ChunkState(residual, {}, '0.')
        payloads = []

        def exchange(requests):
            payloads.extend(r.payload for _, r in requests if r.kind == 'gather')
            return transport.exchange('timing', requests)[0]

        steps = []
        for rep in range(REPEATS + 1):
            start = time.perf_counter()
            total, = drive([part.step(grad, state, workers, 0)], exchange)
            total.wait_to_read()
            if rep:
                steps.append(time.perf_counter() - start)
        slot = 0.0
        if payloads and isinstance(innermost(part), GatherCodec):
            decodes = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                decode_sum([payloads[-1]], (part.size,)).wait_to_read()
                decodes.append(time.perf_counter() - start)
            slot = _best(decodes)
        found[signature(part)] = (max(_best(steps) - slot, 0.0), slot)
    return found


def agree(measured, workers, rank, share):
    """One Sum round: this worker's ``measured`` ({signature: (worker s, slot s)}, the
    same signatures in the same order on every worker; negative: not timed) in its
    slot, zeros elsewhere; returns {signature: (the slowest worker's worker s, its slot
    s)}, the same on every worker, without the codecs some worker could not time (they
    fall back to the shipped table)."""
    from mxnet import ndarray
    names = list(measured)
    mine = np.zeros((workers, len(names), 2), dtype=np.float32)
    mine[rank] = [measured[n] for n in names]
    total = share(ndarray.array(mine.reshape(-1), dtype=np.float32)).asnumpy()
    total = total.reshape(workers, len(names), 2)
    slowest = total.max(axis=0)
    untimed = (total < 0).any(axis=(0, 2))
    return {n: (float(w), float(s)) for n, (w, s), bad in zip(names, slowest, untimed)
            if not bad}


def settle(candidates, workers, rank, chunk_size, share, timer=None):
    """cost.MeasuredSpeeds of the ``candidates`` ({signature: codec}, in the order
    policy='auto' was asked about them: the same on every worker), timed here by
    ``timer`` (default ``measure``; a Scheme's ``codec_timer`` hook) and agreed; codecs
    not among them fall back to the shipped table. None if there is nothing to time
    (then no round: every worker has the same candidates). A codec this worker cannot
    time (the timer raises, or leaves a chunk out) is logged and sent as untimed, so
    that every worker still takes part in the round and falls back alike."""
    from .cost import KernelSpeeds, MeasuredSpeeds
    timer = timer or measure
    measured = {}
    for codec in candidates.values():
        names = [signature(c.codec) for c in chunking.split(codec, chunk_size)]
        try:
            found = timer(codec, workers, chunk_size)
            seconds = [tuple(float(x) for x in found[n]) for n in names]
            if not all(0 <= x < float('inf') for pair in seconds for x in pair):
                raise ValueError('seconds %r: not finite numbers >= 0' % (seconds,))
        except Exception as err:        # noqa: BLE001  (any failure: the shipped table)
            log.warning("policy='auto': rank %d could not time the codec %r (%s: %s); every "
                        "worker takes the shipped kernel table for it", rank, codec,
                        type(err).__name__, err)
            seconds = [(-1.0, -1.0)] * len(names)
        for name, pair in zip(names, seconds):
            measured.setdefault(name, pair)
    if not measured:
        return None
    return MeasuredSpeeds(agree(measured, workers, rank, share), fallback=KernelSpeeds(),
                          source='timed on the workers, the slowest one (codec_timing.py)')
