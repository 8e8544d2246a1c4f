"""A plain key's step over ps-lite, made once: MXNet's own pushpull (or push and pull) of
its chunks, with their views and call arguments kept for as long as the key's plan and
arrays stay.

Why: a key the scheme leaves uncompressed must cost the worker what it costs in
``dist_sync``: one native pushpull (docs/DESIGN.md, "One step of `pushpull(key,
grads)`"). Made anew every step, its step cost several times that on the worker's
thread: two views per chunk
and array of a key cut into chunks (a reshape and a slice, C API calls each), the
chunk wires' look-up, the arrays' dtype (another C API call), and MXNet's Python
wrapper of pushpull, which builds ctypes arrays of keys and handles at every call.
None of that changes while the plan (its chunks) and the arrays do not, and Gluon
passes the same gradient arrays every step: so a route holds the views and the
ready ctypes arguments, and a step is one C call (``MXKVStorePushPull``, what
``KVStore.pushpull`` calls with int keys), or two for a key of several chunks (below).
Arrays pushed that are not the outs (a loop with separate outs) also need their push
ordered after the last pull (ps._after_last_round): that op's call is made ready too,
one ``MXImperativeInvokeEx`` per value and out a step.

A key of several chunks pushes every chunk, then pulls every chunk
(``MXKVStorePush`` of all, then ``MXKVStorePullWithSparse`` of all), not one pushpull a
chunk: the chunks are views of one array and share its engine variable, and MXNet's
pushpull of a key is one engine op that writes it, so the second chunk's pushpull
waited for the first one's whole round, every worker's push included. Pushes only read
the variable and run together; each pull waits for them and for the pull before it,
but by then the servers hold every chunk's sum and a pull is its bytes alone. MXNet's
``dist_sync`` sends a large key as one op sliced over the servers (which the plugin
turns off: a Gather key must stay whole on one server), so chunk by chunk was the
plugin's own cost: cnn512's 1.6M-element FC layer is two chunks, and every key sent
float32 through the plugin (``dist_sync_none``) took 1.06x ``dist_sync``'s step on
loopback at 4 workers, 1.00x pushed and pulled so (docs/RESULTS.md).

The route holds its arrays (and their views), so their handles stay valid while it
may call with them; it is replaced when the key is re-planned (new chunks) or called
with other arrays.
"""
from array import array
import ctypes

_PRIORITY = ctypes.c_int(0)
_DENSE_ONLY = ctypes.c_bool(True)       # MXNet's pull: ignore_sparse


class PlainRoute:
    """A plain key's native round on views of ``values`` and ``outs``
    (``wires``: the chunks' Sum wires, one per chunk of ``chunks``)."""

    def __init__(self, wires, chunks, values, outs):
        self.chunks, self.values, self.outs = chunks, tuple(values), tuple(outs)
        self.step_bytes = sum(w.step_bytes for w in wires)
        # pushes of a value that is not one of the outs wait for the last pull
        # (ps._after_last_round); Gluon's gradients are their own outs: none
        self.afters, self.scratch = _after_calls(
            self.outs, [v for v in self.values if not any(v is o for o in self.outs)])
        # held: the C calls below use their handles
        self.views = [([chunk.view(v) for v in self.values],
                       [chunk.view(o) for o in self.outs]) for chunk in chunks]
        keys = [wire.key for wire in wires]
        # (count, keys, handles) of every chunk's values, and of its outs
        self.pushed, self.pulled = (
            _call_args([(k, a) for k, arrays in zip(keys, side) for a in arrays])
            for side in zip(*self.views))

    def matches(self, chunks, values, outs):
        """True if a step of ``chunks`` on these very arrays can take this route."""
        return (chunks is self.chunks and len(values) == len(self.values)
                and len(outs) == len(self.outs)
                and all(a is b for a, b in zip(values, self.values))
                and all(a is b for a, b in zip(outs, self.outs)))

    def order(self):
        """The step's pushes wait for the last step's pulls into the outs (the no-op
        ``kvx_after(out, value)`` of ps._after_last_round, its arguments made once)."""
        from mxnet.base import _LIB, check_call
        for args in self.afters:
            check_call(_LIB.MXImperativeInvokeEx(*args))

    def run(self, kv):
        """The key's step on ``kv`` (MXNet's ``dist_sync``): one native pushpull, or for
        several chunks one push of them all, then one pull (module docstring)."""
        from mxnet.base import _LIB, check_call
        (pushes, push_keys, values), (pulls, pull_keys, outs) = self.pushed, self.pulled
        if len(self.views) == 1:
            check_call(_LIB.MXKVStorePushPull(kv.handle, pushes, push_keys, pulls, pull_keys,
                                              values, outs, _PRIORITY))
            return
        check_call(_LIB.MXKVStorePush(kv.handle, pushes, push_keys, values, _PRIORITY))
        check_call(_LIB.MXKVStorePullWithSparse(kv.handle, pulls, pull_keys, outs, _PRIORITY,
                                                _DENSE_ONLY))


def _call_args(pairs):
    """(count, int keys, array handles) of [(key, NDArray)], as MXNet's C calls take them."""
    from mxnet.base import c_array_buf, c_handle_array, mx_uint
    return (mx_uint(len(pairs)), c_array_buf(ctypes.c_int, array('i', [k for k, _ in pairs])),
            c_handle_array([a for _, a in pairs]))


def _after_calls(outs, values):
    """(ready arguments of ``MXImperativeInvokeEx`` for ``kvx_after(out, value)`` of
    every out and value, the scratch array they write), one scratch output per route:
    a shared one would order every key's pushes after every other key's. Through
    MXNet's Python op wrapper the call cost the thread about 60 us, ready about 18."""
    if not values:
        return [], None
    from mxnet import ndarray
    from mxnet.base import NDArrayHandle, _LIB, c_handle_array, c_str, check_call
    from ..ops import op
    op('kvx_after')                         # the library is loaded, the op registered
    creator = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(c_str('kvx_after'), ctypes.byref(creator)))
    scratch = ndarray.zeros((1,), dtype='float32')
    calls = []
    for out in outs:
        for value in values:
            inputs = c_handle_array([out, value])
            outputs = ctypes.cast(c_handle_array([scratch]), ctypes.POINTER(NDArrayHandle))
            count, stypes = ctypes.c_int(1), ctypes.POINTER(ctypes.c_int)()
            no_params = (ctypes.c_char_p * 0)()
            calls.append((creator, ctypes.c_int(2), inputs, ctypes.byref(count),
                          ctypes.byref(outputs), ctypes.c_int(0), no_params, no_params,
                          ctypes.byref(stypes)))
    return calls, scratch
