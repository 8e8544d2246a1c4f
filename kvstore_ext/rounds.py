"""Rounds: what a codec asks of the workers and servers during one step.

A codec's step is a generator (``Codec.step``): it yields a round request, receives the
round's result, and so on, and finally returns the float32 sum of the chunk over
workers. An agreement round, a payload round and PowerSGD's P and Q rounds are all
just rounds. A transport implements each round kind once; it never needs to know which
codec asked.

Round kinds:

* ``Sum``: every worker contributes an array of the same shape and dtype; the result is
  the element-wise sum over workers, of that dtype (the stock server adds float16,
  float32 or float64 keys; float32 containers make packed integer codes add exactly).
* ``Gather``: every worker contributes a self-describing payload (header first, see
  python/kvx_ref/wire.py); the servers decode every worker's payload and sum them; the
  result is the float32 sum of ``size`` elements. With a ``reply`` request
  (aggregate.py) the servers send the sum re-encoded by that codec, with a residual of
  their own, and the transport decodes it: the pull is compressed too.

Requests are named (``'payload'``, ``'agree'``, ``'P'``, ...): the transport keeps one
server key per (tensor key, chunk, name) and re-declares it when the round's kind or
shape changes, so a codec may run a round only on some steps (the first step's
agreement) and a scheme may re-plan a key between steps.

A worker whose gradient holds NaN or Inf sends ``void`` rounds instead (store.py):
every worker's result is then NaN, which the caller sees and skips, as with MXNet's
``dist_sync`` where NaN + x = NaN.

``drive`` runs the steps of all chunks of a tensor in lockstep: each stage's requests
go to the transport together, which pushes all of them before it pulls any, so the
chunks' round trips overlap.
"""


import numpy as np


class Sum:
    """Sum ``array`` (float32 NDArray) over workers."""

    kind = 'sum'
    __slots__ = ('name', 'array')

    def __init__(self, name, array):
        self.name, self.array = name, array

    @property
    def shape(self):
        return tuple(self.array.shape)

    @property
    def dtype(self):
        return self.array.dtype


class Gather:
    """Decode every worker's ``payload`` at the servers and sum: ``size`` floats,
    replied as float32 (``reply`` None) or re-encoded (``reply``: (codec id, n, a, b, c),
    ``reply_words`` long). ``out``: a float32 array of ``size`` elements the transport
    writes the result into and returns (the store sets it to its output's part: no
    copy afterwards), or None."""

    kind = 'gather'
    __slots__ = ('name', 'payload', 'size', 'reply', 'reply_words', 'out')

    def __init__(self, name, payload, size, reply=None, reply_words=0):
        self.name, self.payload, self.size = name, payload, int(size)
        self.reply, self.reply_words = reply, int(reply_words)
        self.out = None

    @property
    def shape(self):
        return (int(self.payload.size), self.size, self.reply, self.reply_words)

    @property
    def dtype(self):
        return self.payload.dtype


def void(request):
    """The same request with every value NaN: what a worker whose gradient was
    non-finite contributes, so that the others are not left waiting and every worker's
    result is NaN (a ``Sum`` adds NaN; a ``Gather`` payload whose first word is NaN is
    void at the servers' decode_slots)."""
    from mxnet import ndarray
    if request.kind == 'sum':
        return Sum(request.name, ndarray.full(request.array.shape, np.nan,
                                              dtype=request.array.dtype))
    return Gather(request.name, ndarray.full(request.payload.shape, np.nan, dtype=np.float32),
                  request.size, request.reply, request.reply_words)


def is_void(value):
    """True if ``value`` (a request, or a ``Sum`` round's result) is void: its first
    value is NaN. A sum with a void contribution is NaN everywhere, so the first word
    tells, and reading it costs a codec that reads its result anyway nothing."""
    if isinstance(value, (Sum, Gather)):
        value = value.array if value.kind == 'sum' else value.payload
    return bool(np.isnan(value.reshape((-1,))[0].asscalar()))


def void_sum(shape):
    """The float32 sum of a void step: NaN."""
    from mxnet import ndarray
    return ndarray.full(shape, np.nan, dtype=np.float32)


def drive(steps, exchange):
    """Run the step generators of a tensor's chunks to completion, in lockstep.

    ``exchange(requests)`` takes ``[(chunk index, request), ...]`` and returns their
    results in the same order. An exception in a step (a NaN found by an encoder)
    propagates before anything of that stage is exchanged. Returns each step's value.
    """
    results = [None] * len(steps)
    pending = []
    for index, step in enumerate(steps):
        _advance(steps, results, pending, index, lambda s=step: next(s))
    while pending:
        answers = exchange(pending)
        stage, pending = pending, []
        for (index, _), answer in zip(stage, answers):
            _advance(steps, results, pending, index,
                     lambda s=steps[index], a=answer: s.send(a))
    return results


def _advance(steps, results, pending, index, resume):
    try:
        pending.append((index, resume()))
    except StopIteration as done:
        results[index] = done.value
