"""dAD's capture: what a Dense layer's weight gradient is made of.

For a Dense layer ``y = act(x W^T + b)`` over a batch, the weight gradient is
``D^T A``: ``A`` (rows x in) the layer's input (flattened to rows x in as the layer
flattens it), ``D`` (rows x out) the gradient of the loss w.r.t. the layer's output
*before* the activation. ``attach(net)`` makes every ``gluon.nn.Dense`` in ``net``
record the pair ``(A, D)`` of each backward pass; ``dist_sync_dad``
(schemes/dad.py) then sends them, or a low-rank factorisation of their product,
instead of the gradient.

    import kvstore_ext.dad
    net = build_net(); net.initialize(...)
    kvstore_ext.dad.attach(net)          # the one call; hybridize() before or after

How: each Dense's ``hybrid_forward`` gains one operator between its FullyConnected and
its activation, an identity on the FullyConnected output that also takes ``A`` as an
input, so it works in imperative *and* hybridized networks (the authors' hooks, and
``autograd.Function``, exist only imperatively). Its backward receives ``D`` (its
output gradient) and ``A`` together, so a pair is recorded only by a backward pass
(inference records nothing) and A and D of the same pass are always paired, whatever
the order of devices or passes. It passes D on unchanged and gives ``A`` a zero
gradient (the FullyConnected gives A its real one).

The operator is the plugin's ``kvx_dad_capture`` (cpp/ops/dad.cc: the rows are kept in
C++ until taken), or the same written as a Python ``CustomOp``: MXNet runs a CustomOp
on its own thread under the GIL in every forward and backward and the graph waits for
it: a cnn512 pass took 1.14x a plain one, 1.05x with the plugin's operator
(bench/dad_capture_cost.py). ``capture='auto'`` takes the plugin's, which runs on CPU
only, unless the process sees a GPU or ``MXNET_EXEC_ENABLE_ADDTO=1`` (MXNet would then
ask the capture to add to ``A``'s gradient, which the plugin's operator cannot be told).

Rows accumulate until the kvstore takes them at the layer's next push: several
devices and several backward passes before a step (``grad_req='add'``) concatenate,
so the sum stays exact. A capture is meant for a run with ``dist_sync_dad``: with
another kvstore nothing takes the rows (``detach(net)`` undoes ``attach``). With
``grad_req='write'`` and several backward passes per step, the gradient holds only
the last pass but the rows hold all: the kvstore's check (``check_gradient``) refuses
it.

Server processes import this module with ``mxnet`` only partly imported: MXNet is
imported inside the functions only.
"""
import itertools
import threading
import types
import weakref

OP_TYPE = 'kvx_dad_capture'          # the Python CustomOp's and the plugin op's name
CAPTURES = ('auto', 'plugin', 'python')
_LAYERS = {}                 # ident -> Layer, for every attached Dense still alive
_IDS = itertools.count()
_REGISTERED = []


class Layer:
    """One attached Dense layer: its captured (A, D) row blocks since the last take."""

    def __init__(self, block, ident, plugin):
        self._block = weakref.ref(block)
        self.ident, self.units = ident, int(block._units)
        self.plugin = plugin               # rows kept by the plugin's operator, not here
        self._pending = []
        self._taken = None
        self._lock = threading.Lock()      # the capture runs on MXNet's custom-op thread

    @property
    def block(self):
        return self._block()

    def record(self, a, d):
        with self._lock:
            self._pending.append((a, d))

    def pending_rows(self):
        if self.plugin:
            return _plugin_pending(self.ident)[0]
        with self._lock:
            return sum(int(a.shape[0]) for a, _ in self._pending)

    def take(self):
        """(A, D) as float32 NumPy arrays (rows x in, rows x out) of every pass since
        the last take, concatenated in capture order; None if there was none."""
        if self.plugin:
            return _copy_from_plugin(self.ident, take=True)
        with self._lock:
            pending, self._pending = self._pending, []
        return _concatenate(pending)

    def peek(self):
        """What ``take`` would return, left in place (for tests)."""
        if self.plugin:
            return _copy_from_plugin(self.ident, take=False)
        with self._lock:
            return _concatenate(list(self._pending))

    def rows_for_step(self, start):
        """What a step sends: the chunk starting at row 0 takes the captures, the
        other chunks of the layer (stepped after it, in lockstep: rounds.drive) reuse
        them."""
        if start == 0:
            self._taken = self.take()
        return self._taken

    def grad_handles(self):
        """Handles of the weight's gradient arrays (one per device), empty before the
        weight is initialised."""
        block = self.block
        if block is None or block.weight._grad is None:
            return set()
        return {g.handle.value for g in block.weight.list_grad()}

    def wait(self):
        """Wait for the weight's gradients: the capture ran before they were ready."""
        block = self.block
        if block is not None and block.weight._grad is not None:
            for g in block.weight.list_grad():
                g.wait_to_read()

    def __repr__(self):
        block = self.block
        return 'dad.Layer(%s, units=%d)' % (block.name if block is not None else '?',
                                            self.units)


def _concatenate(pairs):
    if not pairs:
        return None
    import numpy as np
    a = np.concatenate([x.asnumpy() for x, _ in pairs]).astype(np.float32, copy=False)
    d = np.concatenate([y.asnumpy() for _, y in pairs]).astype(np.float32, copy=False)
    return a, d


def _plugin_rows():
    """The plugin's C functions that hand its captured rows over (cpp/capi.h)."""
    import ctypes
    from . import _lib
    lib = _lib.capi()
    if lib.kvx_dad_pending.restype is not ctypes.c_int64:
        i64, f32p = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
        lib.kvx_dad_pending.argtypes = [i64, ctypes.POINTER(i64), ctypes.POINTER(i64)]
        lib.kvx_dad_copy.argtypes = [i64, i64, ctypes.c_int, f32p, f32p]
        lib.kvx_dad_forget.argtypes = [i64]
        lib.kvx_dad_forget.restype = None
        lib.kvx_dad_pending.restype = i64
    return lib


def _plugin_pending(ident):
    """(rows, width of A, width of D) the plugin holds for layer ``ident``."""
    import ctypes
    width_a, width_d = ctypes.c_int64(), ctypes.c_int64()
    rows = _plugin_rows().kvx_dad_pending(ident, ctypes.byref(width_a), ctypes.byref(width_d))
    return int(rows), width_a.value, width_d.value


def _copy_from_plugin(ident, take):
    """The plugin's rows of layer ``ident`` as (A, D), removed there if ``take``; None
    if it holds none."""
    import ctypes
    import numpy as np
    rows, width_a, width_d = _plugin_pending(ident)
    if rows == 0:
        return None
    a = np.empty((rows, width_a), np.float32)
    d = np.empty((rows, width_d), np.float32)
    f32p = ctypes.POINTER(ctypes.c_float)
    status = _plugin_rows().kvx_dad_copy(ident, rows, int(take), a.ctypes.data_as(f32p),
                                         d.ctypes.data_as(f32p))
    if status != 0:
        raise RuntimeError('kvstore_ext.dad: the rows of layer %d changed while copied'
                           % ident)
    return a, d


def layers():
    """The attached layers still alive."""
    for ident, layer in list(_LAYERS.items()):
        if layer.block is None:
            _LAYERS.pop(ident, None)
    return list(_LAYERS.values())


def _register_op():
    if _REGISTERED:
        return
    import mxnet as mx

    class Capture(mx.operator.CustomOp):
        def __init__(self, ident):
            super().__init__()
            self.ident = ident

        def forward(self, is_train, req, in_data, out_data, aux):
            self.assign(out_data[0], req[0], in_data[1])

        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            a, d = in_data[0], out_grad[0]
            layer = _LAYERS.get(int(self.ident))
            if layer is not None:
                cpu = mx.cpu()
                layer.record(a.reshape((-1, a.shape[-1])).copyto(cpu),
                             d.reshape((-1, d.shape[-1])).copyto(cpu))
            if req[0] in ('write', 'inplace'):
                in_grad[0][:] = 0
            self.assign(in_grad[1], req[1], d)

    @mx.operator.register(OP_TYPE)
    class CaptureProp(mx.operator.CustomOpProp):     # noqa: F841  (registered)
        def __init__(self, layer):
            super().__init__(need_top_grad=True)
            self.layer = layer

        def list_arguments(self):
            return ['a', 'out']

        def infer_shape(self, in_shape):
            return in_shape, [in_shape[1]], []

        def declare_backward_dependency(self, out_grad, in_data, out_data):
            return [out_grad[0], in_data[0]]

        def create_operator(self, ctx, shapes, dtypes):
            return Capture(self.layer)

    _REGISTERED.append(CaptureProp)


def _captured_forward(self, F, x, weight, bias=None):
    """Dense's forward with the capture between FullyConnected and the activation."""
    out = F.FullyConnected(x, weight, bias, no_bias=bias is None, num_hidden=self._units,
                           flatten=self._flatten, name='fwd')
    a = F.flatten(x) if self._flatten else x
    layer = self._kvx_dad
    if layer.plugin:
        import mxnet
        from . import _lib, ops
        capture = ops.op(OP_TYPE) if F is mxnet.ndarray else _lib.symbol_op(OP_TYPE)
        out = capture(a, out, layer=layer.ident)
    else:
        out = F.Custom(a, out, op_type=OP_TYPE, layer=layer.ident)
    if self.act is not None:
        out = self.act(out)
    return out


def _plugin_capture(capture):
    """Whether ``attach(capture=...)`` takes the plugin's operator (the module's
    docstring says when ``'auto'`` does not)."""
    import os
    import mxnet as mx
    if capture not in CAPTURES:
        raise ValueError('kvstore_ext.dad.attach: capture=%r, expected one of %s'
                         % (capture, ', '.join(CAPTURES)))
    add_to = os.environ.get('MXNET_EXEC_ENABLE_ADDTO', '0') == '1'
    if capture == 'plugin' and add_to:
        raise ValueError("kvstore_ext.dad.attach: capture='plugin' with "
                         "MXNET_EXEC_ENABLE_ADDTO=1 would overwrite the gradient of each "
                         "Dense layer's input (the plugin's operator is not told to add); "
                         "use capture='python' or 'auto'")
    if capture != 'auto':
        return capture == 'plugin'
    return mx.context.num_gpus() == 0 and not add_to


def _dense_blocks(block):
    from mxnet.gluon import nn
    if isinstance(block, nn.Dense):
        yield block
    for child in block._children.values():
        yield from _dense_blocks(child)


def _all_blocks(block):
    yield block
    for child in block._children.values():
        yield from _all_blocks(child)


def attach(net, capture='auto'):
    """Make every ``gluon.nn.Dense`` in ``net`` (``net`` itself included) record its
    (A, D) rows at each backward pass; returns their ``Layer`` objects. Idempotent (a
    layer attached before keeps its capture). Works before or after ``initialize`` and
    ``hybridize`` (a cached graph is rebuilt). ``capture``: ``'plugin'`` (float32 on
    CPU), ``'python'`` (any dtype and device) or ``'auto'`` (see the module's doc)."""
    from mxnet.util import is_np_array
    if is_np_array():
        raise RuntimeError('kvstore_ext.dad.attach: the numpy interface (npx.set_np) is '
                           'not supported; use the classic NDArray interface')
    plugin = _plugin_capture(capture)
    if not plugin:
        _register_op()
    attached = []
    for block in _dense_blocks(net):
        layer = getattr(block, '_kvx_dad', None)
        if layer is None:
            layer = Layer(block, next(_IDS), plugin)
            block._kvx_dad = layer
            block.hybrid_forward = types.MethodType(_captured_forward, block)
            _LAYERS[layer.ident] = layer
        attached.append(layer)
    _rebuild(net)
    return attached


def detach(net):
    """Undo ``attach``: the Dense layers of ``net`` forward as before."""
    for block in _dense_blocks(net):
        layer = block.__dict__.pop('_kvx_dad', None)
        if layer is not None:
            del block.hybrid_forward
            _LAYERS.pop(layer.ident, None)
            if layer.plugin:
                _plugin_rows().kvx_dad_forget(layer.ident)
    _rebuild(net)


def _rebuild(net):
    """Drop cached graphs, so that a hybridized network traces the new forward."""
    for block in _all_blocks(net):
        clear = getattr(block, '_clear_cached_op', None)
        if clear is not None:
            clear()
