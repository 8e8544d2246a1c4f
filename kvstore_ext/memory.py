"""Per-key state of this worker: the error-feedback residual and whatever else a
key's codecs keep from one step to the next (an agreed statistic, warm-start factors,
momentum, ...), saved and restored with checkpoints, whatever the codec.

Keyed by the kvstore key, never by call order (GRACE and PyTorch both had bugs from
order-keyed state). A key has one residual (the tensor's shape; each chunk works on a
view of it) and, per chunk, the named arrays its codec declares
(``Codec.state_shapes``). When a scheme re-plans a key to a codec of the same kind,
the residual stays (it is the tensor's) and a chunk keeps an array if the new codec
declares the same name with the same shape (a re-plan that changes ``k`` keeps the
agreed filter scores); one that changes the kind starts afresh, after the old codec
has handed over what its state owes (``Codec.owed``, planning.py).

File names: ``<name>@<key>``, with ``name`` ``residual`` or ``<chunk>.<array>`` and
``key`` spelled by ``file_key`` (``i:3``, ``s:fc1_weight``); state names hold no ``@``,
so a key may hold anything.
"""
import numpy as np

RESIDUAL = 'residual'


def file_key(key):
    """A kvstore key as a string that keeps its type (int or str) through a file."""
    return ('i:%d' % key) if isinstance(key, int) else ('s:' + key)


def parse_file_key(name):
    """Inverse of file_key."""
    kind, _, rest = name.partition(':')
    return int(rest) if kind == 'i' else rest


class ChunkState:
    """What one chunk's codec sees of the key's state during a step.

    ``residual``: the chunk's view of the key's residual (None if its codec keeps
    none); ``get(name)`` / ``state[name] = array``: the arrays the codec declared, saved
    with checkpoints; ``last``: what the last step used, for inspection and tests (not
    saved); ``void``: True for the scratch copy a void step runs on (void_steps.void_step),
    so a step that reads inputs of its own beyond the gradient (dAD's captured rows)
    can tell that its round is only made for its shape; ``out``: the chunk's part of the
    output, set for this step by stepping.py for a codec that ``sums_into`` it."""

    def __init__(self, residual, arrays, prefix, void=False):
        self.residual = residual
        self.out = None
        self._arrays, self._prefix = arrays, prefix
        self.last = {}
        self.void = void

    def get(self, name):
        return self._arrays.get(self._prefix + name)

    def __setitem__(self, name, value):
        self._arrays[self._prefix + name] = value

    def scratch(self):
        """A copy to run a step on that must change nothing here (a void step)."""
        arrays = {name: array.copy() for name, array in self._arrays.items()
                  if name.startswith(self._prefix)}
        residual = self.residual.copy() if self.residual is not None else None
        return ChunkState(residual, arrays, self._prefix, void=True)

    def put_back(self, arrays):
        """Set the named arrays (None: absent) back to what they were before a step:
        ``{name: array}`` as ``get`` gave them."""
        for name, array in arrays.items():
            if array is None:
                self._arrays.pop(self._prefix + name, None)
            else:
                self._arrays[self._prefix + name] = array

    def adopt_shared(self, scratch, local=()):
        """Take the arrays ``scratch`` kept, except the residual and the codec's
        ``local`` state names: what a codec keeps besides them comes from round
        results, which every worker shares; its local state is this worker's own, like
        the residual, and stays as it was."""
        skip = {self._prefix + name for name in local}
        for name, array in scratch._arrays.items():
            if name not in skip:
                self._arrays[name] = array


class StateMemory:
    """Every key's state arrays: {key: {state name: NDArray}}."""

    def __init__(self):
        self._arrays = {}

    def residual(self, key, shape):
        """The residual of ``key`` (zeros at first, or what ``restore`` brought)."""
        arrays = self._arrays.setdefault(key, {})
        res = arrays.get(RESIDUAL)
        if res is None:
            from mxnet import ndarray
            res = arrays[RESIDUAL] = ndarray.zeros(shape, dtype=np.float32)
        elif res.shape != tuple(shape):
            raise ValueError('restored residual of key %r has shape %s, the tensor %s'
                             % (key, res.shape, tuple(shape)))
        return res

    def take_residual(self, key):
        """Remove and return the key's residual (None if it has none)."""
        return self._arrays.get(key, {}).pop(RESIDUAL, None)

    def chunk_states(self, key, chunks, residual, keep=True, restored=False):
        """One ChunkState per chunk. Arrays the chunks' codecs do not declare with the
        same shape are dropped (a re-plan; all of them unless ``keep``), or, right after
        a restore, rejected."""
        arrays = self._arrays.setdefault(key, {})
        if not keep:
            for name in [n for n in arrays if n != RESIDUAL]:
                del arrays[name]
        declared = {'%d.%s' % (i, name): tuple(shape) for i, c in enumerate(chunks)
                    for name, shape in c.codec.state_shapes().items()}
        for name in [n for n in arrays if n != RESIDUAL]:
            if declared.get(name) != arrays[name].shape:
                if restored:
                    raise ValueError('restored state %r of key %r (shape %s) does not fit '
                                     'its codec (%s)' % (name, key, arrays[name].shape,
                                                         declared.get(name, 'not kept')))
                del arrays[name]
        return [ChunkState(c.view(residual) if residual is not None else None, arrays,
                           '%d.' % i) for i, c in enumerate(chunks)]

    def arrays_of(self, key):
        """{state name: NDArray} of ``key`` (the store's own arrays: copy to keep)."""
        return dict(self._arrays.get(key, {}))

    def state(self):
        """{file name: NDArray} of every key's state (restored keys not yet used too)."""
        return {'%s@%s' % (name, file_key(key)): array
                for key, arrays in self._arrays.items() for name, array in arrays.items()}

    def restore(self, arrays):
        """Take what ``state()`` gave, replacing all state; each key's part is checked
        when the key is planned. Files of version 0.1 (``<key>`` residuals and
        ``agreed/<key>/<chunk>``) are read too."""
        self._arrays = {}
        for name, array in arrays.items():
            state_name, key = split_name(name)
            self._arrays.setdefault(parse_file_key(key), {})[state_name] = array


def split_name(name):
    """(state name, key as file_key spells it) of a name in a state file, of this
    version or of version 0.1."""
    if '@' in name:
        state_name, _, key = name.partition('@')
    elif name.startswith('agreed/'):
        key, _, chunk = name[len('agreed/'):].rpartition('/')
        state_name = '%s.agreed' % chunk
    else:
        state_name, key = RESIDUAL, name
    return state_name, key
