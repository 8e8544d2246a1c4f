"""Measure codec speeds on this machine, for the cost model (cost.MeasuredSpeeds).

Why: the kernel timings the cost model ships with were taken on another machine, and
its codec class table (bench/codec_times.py) on synthetic shapes, at the schemes'
defaults, on this project's machine. This times every codec a scheme plans for the
model's own shapes, the way the store runs it: a one-process store (rank 0 of 1)
pushes and pulls each tensor, which runs the codec's encode, the servers' decode of one
payload (the one-process transport calls the servers' code) and the worker's decode,
with the store's own Python work between. The servers' decode of one worker's payload
is timed on its own (``aggregate.decode_sum``) and taken out of the worker's share, so
that the model can count it once per worker at the servers. policy='auto' times its
candidates inside a job without a store (codec_timing.py), the same way but for that
Python.

Limits (docs/COST_MODEL.md): one worker, so a codec whose parameters depend on the
number of workers (the homomorphic digits per word, an agreement round from 8 workers)
is timed as planned for one; a codec planned differently at the model's worker count
(another class) falls back to the shipped timings. Wall-clock time on a shared machine
includes other programs' use of the cores.
"""
import time

import numpy as np

from . import chunking
from .cost import KernelSpeeds, MeasuredSpeeds, signature


def _best(seconds):
    return min(seconds) if seconds else 0.0


def unknown(name, params, shapes, known, chunk_size=1 << 20):
    """The names of ``shapes`` whose codecs, as scheme ``name`` with ``params`` plans them
    at one worker (what calibrate times) and cut into chunks, are not all in ``known``
    (signatures): what a speeds file lacks, so that a calibration can add only that."""
    from .cost import plan
    from .registry import SCHEMES
    codecs = plan(SCHEMES[name](**params), shapes, 1)
    out = []
    for key, codec in codecs.items():
        if codec is None or codec.passthrough:
            continue
        if any(signature(c.codec) not in known for c in chunking.split(codec, chunk_size)):
            out.append(key)
    return out


def calibrate(variants, shapes, repeats=3, chunk_size=1 << 20, known=()):
    """MeasuredSpeeds for every codec that the ``variants`` ([(label, scheme name,
    params)], cost.variants) plan for ``shapes`` ({name: shape}); the best of ``repeats``
    steps after a first (untimed) one, which makes keys and agrees. With ``known``
    (signatures already measured), a variant that plans no codec outside it is not run,
    and only the codecs outside it are returned (a variant runs on all the shapes: a
    scheme may plan a tensor by its neighbours)."""
    import mxnet as mx
    from .aggregate import decode_sum
    from .codecs import GatherCodec
    from .codecs.base import innermost
    measured = {}
    known = set(known)
    # dAD is modelled as its fallback (cost.plan), whose own variant is timed
    todo = [(name, params) for _, name, params in variants if name != 'dad' and (
        not known or unknown(name, params, shapes, known, chunk_size))]
    rng = np.random.default_rng(0)
    grads = {k: mx.nd.array(rng.standard_normal(s).astype(np.float32) * 0.01)
             for k, s in shapes.items()} if todo else {}
    for name, params in todo:
        kv = mx.kv.create('dist_sync_' + name)
        if params:
            kv.set_gradient_compression(dict(params))
        times = {k: [] for k in shapes}
        for rep in range(repeats + 1):
            for key in shapes:
                value = grads[key].copy()
                value.wait_to_read()
                start = time.perf_counter()
                kv.pushpull(key, value)
                value.wait_to_read()
                if rep:
                    times[key].append(time.perf_counter() - start)
        for key in shapes:
            codec = kv.plan(key).codec
            if codec is None or codec.passthrough:
                continue
            chunks = chunking.split(codec, chunk_size)
            for chunk in chunks:
                share = chunk.codec.size / codec.size
                slot = 0.0
                if isinstance(innermost(chunk.codec), GatherCodec):
                    payload = chunk.codec.encode(chunk.view(grads[key]).copy(),
                                                 mx.nd.zeros(chunk.codec.shape))
                    payload.wait_to_read()
                    slots = []
                    for _ in range(repeats):
                        start = time.perf_counter()
                        decode_sum([payload], (chunk.codec.size,)).wait_to_read()
                        slots.append(time.perf_counter() - start)
                    slot = _best(slots)
                worker = max(_best(times[key]) * share - slot, 0.0)
                if signature(chunk.codec) not in known:
                    measured[signature(chunk.codec)] = (worker, slot)
    return MeasuredSpeeds(measured, fallback=KernelSpeeds(),
                          source='calibrated on this machine (one worker, best of %d)'
                          % repeats)
