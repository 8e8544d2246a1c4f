"""What ``kv.plan(key)`` and ``kv.key_state(key)`` return: a key's plan and its state,
read-only, for tests and users.

Why: to check what a scheme chose for a layer, or what error feedback holds after a
step, one should not have to read the store's private per-key records (whose layout
changes with the code). These are snapshots: a ``KeyPlan`` names what the store
decided; a ``KeyState`` holds NumPy copies of the arrays, so changing them changes
nothing in the store, and reading them twice gives the state at each call.
"""
from collections import namedtuple
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from .memory import RESIDUAL

ChunkPlan = namedtuple('ChunkPlan', 'start stop codec')
ChunkPlan.__doc__ = ("One chunk of a key: rows [start, stop) of its codec's "
                     "chunk_layout (a conv tensor's filters, else flat elements) and the "
                     "chunk's codec.")


@dataclass(frozen=True)
class KeyPlan:
    """How the store sends one key (``kv.plan(key)``).

    ``scheme``: the scheme's name; ``shape``, ``dtype``: the key's; ``layer``: what the
    shape says of the layer, as the schemes tell layers apart: ``'conv'`` (3 or more
    axes, filters first), ``'dense'`` (2 axes), ``'vector'`` (biases, norms).

    Before the key's first step (declared by ``init``/``broadcast`` only) it has no
    plan yet: ``codec`` and the fields after it are None, ``chunks`` is empty.

    ``codec``: the key's codec (the scheme's choice at its last plan; the store's own
    object, to read, not to change); ``description``: ``codec.describe()``, what
    ``kv.codec_plan()`` lists; ``compressed``: False if the tensor travels as it is
    (MXNet's own pushpull, in its own dtype); ``error_feedback``: True if the key keeps
    a residual; ``chunks``: the ChunkPlans (large tensors travel as several);
    ``bytes_pushed`` / ``bytes_pulled``: what one steady-state step of the key sends and
    receives on this worker (``Codec.wire_words`` in float32 words; an uncompressed key
    in its own dtype; a first step's agreement round is not counted);
    ``mode``: how a NaN/Inf in the gradient is caught (docs/DESIGN.md, "Errors and
    state"): ``'plain'`` (uncompressed: it reaches the sum, as in dist_sync),
    ``'unchecked'`` (the codec keeps no state: it reaches the sum), ``'encoder'`` (the
    encoder finds it before anything is sent; the whole tensor is checked at step 0),
    ``'checked'`` (the whole tensor is checked before every step: several chunks or
    rounds), ``'deferred'`` (pushed without waiting; the encoders' statuses are read
    at the key's next step)."""

    key: Any
    scheme: str
    shape: Tuple[int, ...]
    dtype: np.dtype
    layer: str
    codec: Any = None
    description: Optional[str] = None
    compressed: Optional[bool] = None
    error_feedback: Optional[bool] = None
    chunks: Tuple[ChunkPlan, ...] = ()
    bytes_pushed: Optional[int] = None
    bytes_pulled: Optional[int] = None
    mode: Optional[str] = None


@dataclass(frozen=True)
class KeyState:
    """What one key holds between steps on this worker (``kv.key_state(key)``), as
    NumPy copies.

    ``steps``: the steps the key has taken (restored with a checkpoint);
    ``residual``: the error-feedback residual, of the key's shape (None if its codec
    keeps none); ``arrays``: every array the store keeps for the key, named as a
    checkpoint names them (``'residual'``, ``'<chunk>.<name>'``: ``'0.velocity'`` is
    DGC's momentum of chunk 0, ``'0.Q'`` PowerSGD's, ``'0.agreed'`` an agreed
    statistic); ``chunks``: per chunk, its arrays without the prefix (``{'velocity':
    ...}``); ``last``: per chunk, what its codec recorded of the last step (codec
    specific, for inspection; not saved)."""

    key: Any
    steps: int
    residual: Optional[np.ndarray]
    arrays: dict
    chunks: Tuple[dict, ...]
    last: Tuple[dict, ...]


def layer_kind(shape):
    """'conv', 'dense' or 'vector': what a tensor's shape says of its layer."""
    if len(shape) >= 3:
        return 'conv'
    return 'dense' if len(shape) == 2 else 'vector'


def _mode(record):
    if record.plain:
        return 'plain'
    if record.deferred:
        return 'deferred'
    if record.check_whole is None:
        return 'unchecked'
    return 'checked' if record.check_whole else 'encoder'


def plan_of(record, scheme_name, num_workers):
    """The KeyPlan of a store's per-key record (planning.KeyRecord)."""
    base = dict(key=record.key, scheme=scheme_name, shape=tuple(record.shape),
                dtype=np.dtype(record.dtype), layer=layer_kind(record.shape))
    codec = record.codec
    if codec is None:
        return KeyPlan(**base)
    if record.plain:
        pushed = pulled = int(np.prod(record.shape)) * np.dtype(record.dtype).itemsize
    else:
        rounds = [r for c in record.chunks for r in c.codec.wire_words(num_workers)]
        pushed = 4 * sum(int(r[2]) for r in rounds)
        pulled = 4 * sum(int(r[3]) for r in rounds)
    return KeyPlan(codec=codec, description=codec.describe(),
                   compressed=not codec.passthrough,
                   error_feedback=record.residual is not None,
                   chunks=tuple(ChunkPlan(c.start, c.stop, c.codec) for c in record.chunks),
                   bytes_pushed=pushed, bytes_pulled=pulled, mode=_mode(record), **base)


def _copy(array):
    return None if array is None else array.asnumpy().copy()


def state_of(record, arrays, steps):
    """The KeyState of a store's per-key record, its ``arrays`` ({name: NDArray} as
    memory.StateMemory keeps them) and step count."""
    copies = {name: _copy(array) for name, array in arrays.items()}
    count = len(record.chunks) if record.chunks else 0
    chunks = tuple({name[len('%d.' % i):]: array for name, array in copies.items()
                    if name.startswith('%d.' % i)} for i in range(count))
    last = tuple({name: (_copy(value) if hasattr(value, 'asnumpy') else value)
                  for name, value in cs.last.items()} for cs in record.chunk_states)
    residual = copies.get(RESIDUAL) if record.residual is not None else None
    return KeyState(key=record.key, steps=int(steps),
                    residual=None if residual is None else residual.copy(),
                    arrays=copies, chunks=chunks, last=last)
