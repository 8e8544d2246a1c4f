"""The KVStore plugin: what Gluon's Trainer and MXNet's Module talk to as
``kvstore='dist_sync_<scheme>'``.

One ``pushpull`` for one key:

1. sum the worker's devices (on CPU, where the kernels run);
2. the scheme's policy picks the tensor's codec (at the first step, and again when
   the scheme re-plans: ``Scheme.replans_at``), and the tensor is cut into chunks;
3. each chunk's codec runs its step (``Codec.step``): it encodes ``grad + residual``
   (C++ op; the residual is updated in place) and yields rounds (rounds.py), which
   the transport exchanges, the chunks of a tensor in lockstep;
4. the steps' float32 sums are assembled and written to every device's output.

A float32 tensor the scheme leaves uncompressed takes MXNet's own pushpull instead,
chunk by chunk on views of the arrays (no payload to build, no copy), so such tensors
cost what they cost in ``dist_sync``; like there, a NaN in them reaches the sum (no
residual is at stake).

Gluon's Trainer and Module (``mxnet/model.py`` ``_create_kvstore``) both read
``is_capable('optimizer')``, which is False, and choose ``update_on_kvstore=False``:
the optimizer runs on the workers on the summed gradient, exactly as with MXNet's
``dist_sync`` and ``update_on_kvstore=False``.

MXNet's classic calls are here too, for Module and hand-written loops: ``init`` (rank
0's value, fetched by every worker), ``push`` (one ``pushpull`` round whose sum the
store keeps) and ``pull`` (copies what the store keeps: the last push's sum, or the
init value if nothing was pushed since). Module itself calls ``init`` and then
``pushpull`` for dense gradients.
"""
import logging

import numpy as np

from mxnet.kvstore import KVStoreBase
from mxnet import ndarray
from mxnet.context import cpu

from . import calls, chunking, fingerprint, mxnet_keys, resume_workers, shutdown, sparse
from .codecs.base import GatherCodec, deferred_checks
from .handover import Handover
from .errors import NONFINITE, VOID, NonFiniteGradientError, status_message
from .memory import StateMemory
from .ops import op
from .params import as_params
from .rounds import drive, void
from .stats import CommStats

_FLOAT_TYPES = (np.float16, np.float32, np.float64)
log = logging.getLogger('kvstore_ext')
SERVERS_SUFFIX = '.servers'     # beside a worker's state file: the servers' residuals


class _Key:
    """What the store knows about one key: shape, dtype, its plan (codec, chunks, the
    chunks' state) and the arrays it last checked."""

    def __init__(self, key, shape, dtype):
        self.key, self.shape, self.dtype = key, shape, dtype
        self.raw_bytes = 4 * int(np.prod(shape))     # float32 equivalent
        self.codec = self.chunks = self.residual = None
        self.chunk_states = ()
        self.plain = False
        self.check_whole = None     # when a NaN is looked for before encoding (_plan)
        self.deferred = False       # encoders' statuses read at the next step (_plan)
        self.pending = None         # the last deferred step's statuses (_resolve)
        self.flush = None           # a residual a re-plan left over: sent with the next step
        self.stored = None          # what pull returns: init/broadcast value or last push's sum
        self.checked = ((), ())     # the arrays of the last pushpull, already checked

    def already_checked(self, values, outs):
        """True if these very arrays passed the checks before: an NDArray's shape and
        dtype never change, and Gluon passes the same gradient arrays every step, so
        the checks (several C API calls each) run once per key, not once per step."""
        done_values, done_outs = self.checked
        return (len(values) == len(done_values) and len(outs) == len(done_outs)
                and all(a is b for a, b in zip(values, done_values))
                and all(a is b for a, b in zip(outs, done_outs)))


def _copy(src, dst):
    """``src.copyto(dst)`` unless they are the same array (e.g. broadcast in place)."""
    if src.handle.value != dst.handle.value:
        src.copyto(dst)


class CompressedKVStore(KVStoreBase):
    """Base of every registered ``dist_sync_<scheme>`` type (see registry.py).

    Subclasses set ``scheme_class``. Started by a launcher (``DMLC_ROLE=worker``) it
    uses MXNet's parameter server; otherwise it is rank 0 of 1 in this process and
    still encodes and decodes every gradient.
    """

    scheme_class = None

    def __init__(self):
        from .transport import create_transport
        self._scheme = self.scheme_class()
        self._transport = create_transport(self)
        self._keys = {}
        self._memory = StateMemory()
        self._restored = False      # state came from a file: check it when keys are planned
        self._stats = CommStats()
        self._nan = None            # a 1-element NaN array (_deferred_step)
        self._settled = 0           # the last step at which the scheme settled (settle)
        self._learning_rate = None  # reads the optimizer's learning rate (follow)
        self._handover = Handover()  # the optimizer's momentum and rate (handover.py)
        shutdown.track(self)        # at exit: wait for the engine, report, release

    # -- identity -------------------------------------------------------------------
    @property
    def type(self):
        return type(self).__name__.lower()

    @property
    def rank(self):
        return self._transport.rank

    @property
    def num_workers(self):
        return self._transport.num_workers

    @property
    def scheme(self):
        return self._scheme

    @staticmethod
    def is_capable(capability):
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return False
        raise ValueError('Unknown capability: {}'.format(capability))

    # -- configuration --------------------------------------------------------------
    def set_gradient_compression(self, compression_params):
        """Set the scheme's parameters (Gluon's ``compression_params``, Module's, or
        MXNet's ``{'type': ..., ...}`` style as ``fit.py --gc-type`` passes it).

        ``type``, if given, must name this kvstore's scheme: the scheme is chosen by the
        kvstore type, so another type is refused with the type to create instead.
        Unknown keys and invalid values raise ValueError/TypeError. Only before the
        first round: codecs and residuals depend on the parameters.
        """
        if any(state.codec is not None for state in self._keys.values()):
            raise RuntimeError('set_gradient_compression must be called before the first '
                               'pushpull: codecs and residuals already exist')
        params = as_params(compression_params, self.type)
        kind = params.pop('type', self.scheme_class.name)
        if kind != self.scheme_class.name:
            ours = sorted(name for name, cls in KVStoreBase.kv_registry.items()
                          if issubclass(cls, CompressedKVStore))
            use = ('create the kvstore type %r for it' % ('dist_sync_%s' % kind)
                   if 'dist_sync_%s' % kind in ours else '%r is not one of them' % (kind,))
            raise ValueError('compression type %r does not match %s (scheme %r): with '
                             'kvstore_ext the scheme is the kvstore type (%s); %s'
                             % (kind, self.type, self.scheme_class.name, ', '.join(ours), use))
        self._scheme = self.scheme_class(**mxnet_keys.accept(self.scheme_class, params,
                                                             self.type))
        self._scheme.learning_rate = self._learning_rate

    def follow(self, source):
        """Hand the optimizer over to the scheme: ``source`` is a Gluon ``Trainer``, a
        ``Module``, an MXNet ``Optimizer`` (its momentum and learning rate), or a
        function returning the learning rate (the rate only). Why and what: handover.py.
        A Trainer or Module that calls the store is found without it; the call wins.
        Before the first pushpull."""
        self._handover.follow(self, source)

    def follow_learning_rate(self, source):
        """The former name of ``follow`` (the same call)."""
        self._handover.follow(self, source, name='follow_learning_rate')

    def set_optimizer(self, optimizer):
        raise NotImplementedError(
            '%s sums gradients and cannot run the optimizer on the servers: use '
            'update_on_kvstore=False, the optimizer then runs on the workers (Gluon\'s '
            'Trainer and Module choose it by themselves: is_capable("optimizer") is False)'
            % self.type)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError('no optimizer runs in %s; use save_compression_state '
                                  'for the residuals' % self.type)

    def load_optimizer_states(self, fname):
        raise NotImplementedError('no optimizer runs in %s; use load_compression_state '
                                  'for the residuals' % self.type)

    # -- data path ------------------------------------------------------------------
    def broadcast(self, key, value, out, priority=0):
        """Rank 0's ``value`` becomes every rank's ``out``; also declares the key."""
        if isinstance(key, (list, tuple)):
            calls.check_lengths('broadcast', key, values=value, outs=out)
            for k, v, o in zip(key, value, out):
                self.broadcast(k, v, o, priority)
            return
        self._check_key(key)
        value = value[0] if isinstance(value, (list, tuple)) else value
        state = self._declare(key, value)
        self._agree(state)
        result = self._transport.broadcast(key, value.as_in_context(cpu()))
        for o in calls.as_list(out):
            self._check_out(key, o)
            _copy(result, o)
        state.stored = result.copy()       # MXNet's broadcast is init + pull

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` over devices and workers (compressed) into ``out`` or ``value``.

        The sum goes to ``out`` only: the store keeps no copy, so a ``pull`` of the key
        before its next ``push`` raises rather than return an older value. A list of
        keys: one round per distinct key, a repeated key's values summed into every
        one of its outs, as MXNet does (calls.py)."""
        if isinstance(key, (list, tuple)):
            for k, values, outs in calls.pushpull_rounds(key, value, out, self._check_key):
                self._round(k, values, outs).stored = None
            return
        values = calls.as_list(value)
        outs = values if out is None else calls.as_list(out)
        self._round(key, values, outs).stored = None

    def _round(self, key, values, outs):
        """One round of ``key`` (pushpull's body): returns the key's state."""
        if not self._handover.done:
            self._handover.first_round(self)
        state = self._keys.get(key)
        if state is not None and state.pending is not None:
            self._resolve(state)
        if state is None or type(key) is bool or not state.already_checked(values, outs):
            self._check_key(key)
            state = self._declare(key, values[0])
            for v in values:
                self._check_value(key, v, state)
            for o in outs:
                self._check_out(key, o)
            state.checked = (tuple(values), tuple(outs))
            self._scheme.bind(key, values)
        step = self._stats.pushes(key)
        if state.codec is None or (step and self._scheme.replans_at(step)):
            if state.codec is None:
                self._agree(state)
            if step and step > self._settled:
                self._settle(step)
            self._plan(state, step)
        if state.plain:
            if state.flush is not None:
                self._flush_into(state, values[0])
            pushed, pulled = self._transport.pushpull_plain(key, state.chunks, values, outs)
            self._stats.record(key, state.raw_bytes, pushed, pulled)
            return state
        grad = self._sum_devices(values)
        if state.dtype != np.float32:
            grad = grad.astype(np.float32)
        if state.flush is not None:
            grad = grad + state.flush.as_in_context(grad.context)
            state.flush = None
        if self._scheme.observes(key, step, self.rank):
            parts = [c.codec.compressed_input(c.view(grad), cs)
                     for c, cs in zip(state.chunks, state.chunk_states)]
            self._scheme.observe(key, chunking.assemble(state.chunks, parts, grad.shape),
                                 step)
        target = outs[0] if outs[0].dtype == np.float32 and outs[0].context == cpu() else None
        summed, pushed, pulled = self._exchange_step(state, grad, step, target)
        self._stats.record(key, state.raw_bytes, pushed, pulled)
        if state.dtype != np.float32:
            summed = summed.astype(state.dtype)
        for o in outs:
            _copy(summed, o)
        return state

    # -- MXNet's classic interface: init, push, pull (Module, hand-written loops) ----
    def init(self, key, value):
        """Declare ``key`` (or a list of keys) with rank 0's ``value``; every worker
        calls it, as with MXNet's kvstores, and keeps rank 0's value for a ``pull``
        before the first ``push``. Once per key."""
        if isinstance(key, (list, tuple)):
            for k, v in calls.pairs('init', key, value, 'values'):
                self.init(k, v)
            return
        self._check_key(key)
        if key in self._keys:
            raise RuntimeError('key %r is already initialised (by init, broadcast or '
                               'pushpull): a kvstore initialises each key once' % (key,))
        value = value[0] if isinstance(value, (list, tuple)) else value
        state = self._declare(key, value)
        self._agree(state)
        state.stored = self._transport.broadcast(key, value.as_in_context(cpu())).copy()

    def push(self, key, value, priority=0):
        """One round of ``key``, as ``pushpull`` runs it: ``value`` (an array, or one
        per device, summed here first) is compressed and exchanged, and the decoded sum
        over workers is kept for ``pull``. Unlike MXNet's asynchronous push it returns
        once the round is done; every worker pushes a key equally often (dist_sync).
        ``priority`` is accepted for MXNet's signature: rounds run in call order."""
        if isinstance(key, (list, tuple)):
            if len(set(key)) != len(key):
                raise ValueError('push: a key appears twice in %r; push each key once a '
                                 'round (sum its values first)' % (key,))
            for k, v in calls.pairs('push', key, value, 'values'):
                self.push(k, v, priority)
            return
        state = self._initialised(key)
        stored = state.stored
        if stored is None:
            stored = ndarray.zeros(state.shape, ctx=cpu(), dtype=state.dtype)
        self._round(key, calls.as_list(value), [stored])
        state.stored = stored

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copy ``key``'s value into ``out`` (an array, or one per device): the sum of
        its last ``push``, or its ``init``/``broadcast`` value if it was not pushed
        since. Nothing travels: after a synchronous round every worker holds the same
        sum. Sparse outs are skipped (``ignore_sparse``, as MXNet) or refused."""
        if out is None:
            raise TypeError('pull needs out: the array(s) to write %r into' % (key,))
        if isinstance(key, (list, tuple)):
            for k, o in calls.pairs('pull', key, out, 'outs'):
                self.pull(k, o, priority, ignore_sparse)
            return
        state = self._initialised(key)
        if state.stored is None:
            raise RuntimeError('key %r: nothing to pull: its last round was a pushpull, '
                               'which writes the sum into its out only; use push then pull'
                               % (key,))
        for o in calls.as_list(out):
            if o.stype != 'default':
                if ignore_sparse:
                    continue
                raise TypeError('key %r: %s holds dense values; cannot pull into a %s '
                                'array' % (key, self.type, o.stype))
            self._check_out(key, o)
            _copy(state.stored, o)

    def _initialised(self, key):
        """The state of a key that ``init`` (or broadcast, or pushpull) declared."""
        self._check_key(key)
        state = self._keys.get(key)
        if state is None:
            raise RuntimeError('key %r was not initialised: call init(key, value) on every '
                               'worker first, as with MXNet\'s kvstores' % (key,))
        return state

    def _exchange_step(self, state, grad, step, target=None):
        """Run the chunks' steps (their rounds through the transport): (the float32
        sum over workers, written into ``target`` if given, bytes pushed, bytes
        pulled). A non-finite gradient makes the step void (``_void_step``)."""
        traffic = [0, 0]
        # chunks whose step returns its Gather round's sum as it is: the transport
        # writes the sum straight into the output's part (no assembling copy)
        direct = (target is not None and len(state.chunks) > 1
                  and all(type(c.codec).step is GatherCodec.step for c in state.chunks))

        def exchange(requests):
            if direct:      # GatherCodec.step yields Gather rounds only
                for index, request in requests:
                    request.out = state.chunks[index].view(target).reshape((-1,))
            results, pushed, pulled = self._transport.exchange(state.key, requests)
            traffic[0] += pushed
            traffic[1] += pulled
            return results

        voided = False
        if state.deferred and all(c.codec.deferrable(cs) for c, cs in
                                  zip(state.chunks, state.chunk_states)):
            parts = self._deferred_step(state, grad, step, exchange)
        else:
            try:
                if state.check_whole is not None and (state.check_whole or step == 0):
                    self._check_finite(state.key, grad)
                steps = [c.codec.step(c.view(grad), cs, self.num_workers, self.rank)
                         for c, cs in zip(state.chunks, state.chunk_states)]
                parts = drive(steps, exchange)
            except NonFiniteGradientError:
                parts, voided = self._void_step(state, exchange), True
        if direct and not voided:
            return target, traffic[0], traffic[1]
        summed = chunking.assemble(state.chunks, parts, grad.shape, target)
        return summed, traffic[0], traffic[1]

    def _deferred_step(self, state, grad, step, exchange):
        """The key's step without waiting for its encoders (``Codec.deferred_checks``):
        waiting for an encoder's status waits for the backward pass to produce the
        gradient, and kept every later key from being pushed meanwhile (docs/DESIGN.md,
        "Deferred checks"). A bad gradient still voids the step: the encoder keeps the
        residual and pushes a void payload, so every worker's sum is NaN, and
        ``_resolve`` reads the statuses at the key's next step (or at a save), logs,
        and puts back the local state the step replaced (DGC's velocity).

        A tensor of several chunks is void as a whole, as with the synchronous check:
        if any of its values is non-finite, engine ops set each chunk's first value
        of ``grad`` to NaN first, so that every chunk's encoder fails."""
        if len(state.chunks) > 1:
            bad = op('kvx_finite_check')(grad.reshape((-1,)))
            if self._nan is None:
                self._nan = ndarray.full((1,), np.nan, dtype=np.float32)
            for chunk in state.chunks:
                first = chunk.view(grad).reshape((-1,))[0:1]
                first[:] = ndarray.where(bad, self._nan, first)
        kept = [{name: cs.get(name) for name in chunk.codec.local_state}
                for chunk, cs in zip(state.chunks, state.chunk_states)]
        with deferred_checks() as statuses:
            steps = [c.codec.step(c.view(grad), cs, self.num_workers, self.rank)
                     for c, cs in zip(state.chunks, state.chunk_states)]
            parts = drive(steps, exchange)
        state.pending = (step, statuses, kept)
        return parts

    def _resolve_pending(self):
        """``_resolve`` every key with a deferred step (a save needs its state as the
        step left it)."""
        for state in self._keys.values():
            if state.pending is not None:
                self._resolve(state)

    def _resolve(self, state):
        """Read the statuses of the key's last deferred step (long done by now): if
        its gradient was non-finite, log as ``_void_step`` does and give the chunks back
        the local state the void step replaced; any other failure is a bug, raised (its
        payload was void too, so no sum used it). A decoder's ``VOID`` (homomorphic: a
        worker's void contribution made the sum NaN) needs nothing: if the worker was
        this one, its encoder's status says so."""
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
                    state.key, self.rank, step)

    def _void_step(self, state, exchange):
        """This worker's gradient of the key is non-finite: take part in the key's
        rounds with void (all-NaN) contributions (rounds.void), so that the other
        workers are not left waiting and every worker's sum is NaN (the caller skips
        the step, as with dist_sync, where NaN + x = NaN).

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
                    'this step; skip the step. The residual is unchanged.',
                    state.key, self.rank)
        scratch = [cs.scratch() for cs in state.chunk_states]
        steps = [c.codec.step(ndarray.zeros(c.codec.shape, dtype=np.float32), s,
                              self.num_workers, self.rank)
                 for c, s in zip(state.chunks, scratch)]
        drive(steps, lambda requests: exchange([(i, void(r)) for i, r in requests]))
        for chunk, cs, s in zip(state.chunks, state.chunk_states, scratch):
            cs.adopt_shared(s, chunk.codec.local_state)
        return [ndarray.full(c.codec.shape, np.nan, dtype=np.float32) for c in state.chunks]

    def _settle(self, step):
        """The scheme settles what its re-plans at ``step`` depend on (Scheme.settle),
        once per step, when the first key reaches it: every worker pushes its keys in
        the same order, so every worker gets here at the same point. Its rounds go
        through the transport under a key no user key can be (a tuple)."""
        self._settled = step

        def share(array):
            from .rounds import Sum
            results, pushed, pulled = self._transport.exchange(
                ('__scheme__', 'settle'), [(0, Sum('settle', array))])
            self._stats.record_extra(pushed, pulled)
            return results[0]

        self._scheme.settle(step, self.rank, share)

    def _agree(self, state):
        """Every worker's kvstore type, parameters and the key's shape and dtype must be
        this worker's, or every worker raises, naming what differs (fingerprint.py)."""
        fingerprint.agree(self._transport, self.type, state.key, state.shape,
                          state.dtype, self._scheme.params,
                          self._scheme.param_specs())

    def _plan(self, state, step):
        """Codec, chunks and chunk states of a key: at its first pushpull, and again
        when the scheme re-plans (a codec that encodes the same is kept)."""
        self._scheme.num_workers = self.num_workers
        codec = self._scheme.codec_for_key(state.key, state.shape, state.dtype, step=step)
        previous = state.codec
        if previous is not None and codec.same_as(previous):
            return
        state.codec = codec
        state.chunks = chunking.split(codec, self._scheme.params['chunk_size'])
        # plain: a tensor sent as it is: no payload to build, so each chunk takes
        # MXNet's own pushpull on a view of the arrays (no copies; MXNet sums the
        # devices), in the key's own dtype (float64 and float16 sum as in dist_sync,
        # not rounded through float32): the plugin then costs what dist_sync costs
        state.plain = codec.passthrough
        if codec.uses_residual:
            state.residual = self._memory.residual(state.key, state.shape)
        else:
            # error feedback loses nothing: what the residual holds goes with the next step
            state.residual = None
            state.flush = self._memory.take_residual(state.key)
        # A key whose step is one round of one chunk lets its encoder find a NaN before
        # anything is exchanged or changed. A tensor of several chunks, or a step with
        # an earlier round (an agreement, PowerSGD's P; a key's first step may run one
        # the steady state does not) is checked whole first: a NaN in the last chunk,
        # or found in a second round, must leave every state as it was. None: the key
        # keeps no state, a NaN just reaches the sum.
        state.check_whole = None
        if state.residual is not None or codec.state_shapes():
            state.check_whole = (len(state.chunks) > 1
                                 or len(codec.wire_words(self.num_workers)) > 1)
        # ... unless its encoders' statuses can wait (_deferred_step)
        state.deferred = (codec.deferred_checks
                          and len(codec.wire_words(self.num_workers)) == 1)
        state.chunk_states = self._memory.chunk_states(
            state.key, state.chunks, state.residual,
            keep=previous is None or type(previous) is type(codec),
            restored=previous is None and self._restored)

    @staticmethod
    def _flush_into(state, grad):
        grad += state.flush.as_in_context(grad.context).astype(grad.dtype)
        state.flush = None

    @staticmethod
    def _check_finite(key, grad):
        if int(op('kvx_finite_check')(grad.reshape((-1,))).asscalar()):
            raise NonFiniteGradientError(
                'key %r: gradient holds non-finite values (NaN or Inf)' % (key,))

    @staticmethod
    def _sum_devices(values):
        """The worker's devices summed on CPU: the one CPU array itself (encoders only
        read it), or a fresh sum (inputs stay as they are)."""
        if len(values) == 1 and values[0].context == cpu():
            return values[0]
        total = values[0].copyto(cpu())
        for v in values[1:]:
            total += v.as_in_context(cpu())
        return total

    # -- checks ---------------------------------------------------------------------
    @staticmethod
    def _check_key(key):
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError('kvstore keys are int or str, got %r' % (key,))

    def _declare(self, key, value):
        state = self._keys.get(key)
        if state is None:
            dtype = np.dtype(value.dtype)
            if dtype not in [np.dtype(t) for t in _FLOAT_TYPES]:
                raise TypeError('key %r: dtype %s cannot be summed by the parameter server '
                                '(float16/32/64 only)' % (key, dtype))
            if value.stype != 'default':
                raise TypeError(sparse.refusal(key, value.stype, self.type))
            if value.size == 0:
                raise ValueError('key %r: zero-size array (shape %s): there is nothing to '
                                 'sum; leave it out of the kvstore' % (key, value.shape))
            state = _Key(key, tuple(value.shape), dtype)
            self._keys[key] = state
        return state

    def _check_value(self, key, value, state):
        if value.stype != 'default':
            raise TypeError(sparse.refusal(key, value.stype, self.type))
        if tuple(value.shape) != state.shape or np.dtype(value.dtype) != state.dtype:
            raise ValueError('key %r holds %s %s, got %s %s' % (
                key, state.shape, state.dtype, tuple(value.shape), np.dtype(value.dtype)))

    def _check_out(self, key, out):
        state = self._keys[key]
        if out.stype != 'default':
            raise TypeError(sparse.refusal(key, out.stype, self.type))
        if tuple(out.shape) != state.shape:
            raise ValueError('key %r: output shape %s does not match %s'
                             % (key, tuple(out.shape), state.shape))

    # -- observability and state ----------------------------------------------------
    def comm_stats(self):
        """Cumulative bytes of this worker: raw (float32 equivalent), pushed, pulled."""
        return self._stats.as_dict()

    def codec_plan(self):
        """{key: codec description} for the keys seen so far."""
        return {k: (s.codec.describe() if s.codec else None) for k, s in self._keys.items()}

    def save_compression_state(self, fname):
        """Save this worker's per-key state (residuals and what codecs keep between
        steps), its parameters and byte counters (one file per worker). Rank 0 also
        has the servers save their residuals (``pull='compressed'``) in the directory
        ``fname + '.servers'``, on the servers' file system, after its last rounds are
        done (transport/ps.py). Call it on every worker after the same step; it is not
        collective (no worker waits for another's call), and a job resumes the state
        with as many workers as saved it (resume_workers.py)."""
        import json
        self._resolve_pending()
        arrays = self._memory.state()
        arrays['__meta__'] = ndarray.array(
            np.frombuffer(json.dumps({'type': self.type, 'rank': self.rank,
                                      'num_workers': self.num_workers,
                                      'params': self._scheme.params,
                                      'stats': self._stats.state(),
                                      'scheme': self._scheme.state()}).encode(), np.uint8),
            dtype=np.uint8)
        ndarray.save(fname, arrays)
        self._transport.save_server_state(fname + SERVERS_SUFFIX)

    def load_compression_state(self, fname):
        """Restore what ``save_compression_state`` wrote; before the first pushpull. The
        file is checked whole first (state_file.py): a malformed one raises ValueError
        naming the file and what is wrong, and this store stays as it was."""
        from . import state_file
        if any(state.codec is not None for state in self._keys.values()):
            raise RuntimeError('load_compression_state must come before the first pushpull')
        resume_workers.check_file(fname, self.rank)
        meta, arrays = state_file.read(fname)
        resume_workers.check_workers(meta, fname, self.num_workers)
        if meta['type'] != self.type or meta['rank'] != self.rank:
            raise ValueError('%s holds the state of %s rank %d, not of %s rank %d (residuals '
                             'belong to one worker)' % (fname, meta['type'], meta['rank'],
                                                        self.type, self.rank))
        scheme, stats = state_file.rebuild(fname, meta, self.scheme_class)
        self._transport.restore_server_state(fname + SERVERS_SUFFIX)
        scheme.learning_rate = self._learning_rate
        self._scheme, self._stats = scheme, stats
        self._memory.restore(arrays)
        self._restored = True
