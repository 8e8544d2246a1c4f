"""The KVStore plugin: what Gluon's Trainer and MXNet's Module talk to as
``kvstore='dist_sync_<scheme>'``.

This module answers MXNet's calls (their arguments, checks, what ``pull`` returns);
what a round does is in modules of their own. One ``pushpull`` for one key:

1. the scheme's policy picks the tensor's codec (at the first step, and again when
   the scheme re-plans: ``Scheme.replans_at``), and the tensor is cut into chunks
   (planning.py);
2. the worker's devices are summed (on CPU, where the kernels run), each chunk's
   codec runs its step (``Codec.step``): it encodes ``grad + residual`` (C++ op; the
   residual is updated in place) and yields rounds (rounds.py), which the transport
   exchanges, the chunks of a tensor in lockstep; the steps' float32 sums are
   assembled and written to every device's output (stepping.py);
3. a NaN or Inf in the gradient makes the step void on every worker, the state kept
   (void_steps.py).

``plan(key)`` and ``key_state(key)`` show what the store decided and holds for a key
(inspection.py).

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
import numpy as np

from mxnet.kvstore import KVStoreBase
from mxnet import ndarray
from mxnet.context import cpu

from . import (calls, inspection, mxnet_keys, planning, policy, policy_report, resume_workers,
               shutdown, sparse, stepping, void_steps)
from .handover import Handover
from .memory import StateMemory
from .params import as_params
from .stats import CommStats

_FLOAT_TYPES = (np.float16, np.float32, np.float64)
SERVERS_SUFFIX = '.servers'     # beside a worker's state file: the servers' residuals


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
        self._settled = 0           # the last step the scheme settled at (planning.settle)
        self._clocked = -1          # the last step the scheme was told of (step_started)
        self._learning_rate = None  # reads the optimizer's learning rate (follow)
        self._handover = Handover()  # the optimizer's momentum and rate (handover.py)
        self._policy_log = policy_report.PolicyLog()  # policy='auto''s line (rank 0)
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

    def attach(self, net):
        """Let the scheme see ``net`` (a Gluon Block), before its first forward pass: a
        scheme that compresses from what the layers compute hooks into them (dAD
        captures its Dense layers: kvstore_ext/dad.py); the others ignore it, so a
        script may call it whatever the kvstore type (``hasattr(kv, 'attach')``: MXNet's
        own kvstores have no such call)."""
        self._scheme.attach(net)

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
        planning.agree(self, state)
        result = policy.broadcast(self, key, value.as_in_context(cpu()))
        for o in calls.as_list(out):
            self._check_out(key, o)
            stepping.copy_into(result, o)
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
        if state is not None:
            void_steps.resolve(state, self.rank)
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
        if step > self._clocked:
            self._clocked = step
            self._scheme.step_started(step)
        planning.plan_if_due(self, state, step)
        self._policy_log.note(self, step)
        stepping.run(self, state, values, outs, step)
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
        planning.agree(self, state)
        state.stored = policy.broadcast(self, key, value.as_in_context(cpu())).copy()

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
            stepping.copy_into(state.stored, o)

    def _initialised(self, key):
        """The state of a key that ``init`` (or broadcast, or pushpull) declared."""
        self._check_key(key)
        state = self._keys.get(key)
        if state is None:
            raise RuntimeError('key %r was not initialised: call init(key, value) on every '
                               'worker first, as with MXNet\'s kvstores' % (key,))
        return state

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
            state = planning.KeyRecord(key, tuple(value.shape), dtype)
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

    def policy_decisions(self):
        """policy='auto''s link rate and choice per key so far (policy_report.py); None
        for another policy."""
        return policy_report.decisions(self)

    def codec_plan(self):
        """{key: codec description} for the keys seen so far."""
        return {k: (s.codec.describe() if s.codec else None) for k, s in self._keys.items()}

    def plan(self, key):
        """How ``key`` travels: an ``inspection.KeyPlan`` (scheme, layer kind, codec,
        whether compressed, chunks, bytes of a step each way, how a NaN is caught), a
        read-only snapshot of the key's plan at its last step. KeyError naming the key
        if the store has not seen it."""
        return inspection.plan_of(self._known(key), self._scheme.name, self.num_workers)

    def key_state(self, key):
        """What ``key`` holds between steps on this worker: an ``inspection.KeyState``
        (step count, residual, every array its codecs keep: momentum, agreed
        statistics, warm-start factors) as NumPy copies. A deferred step's statuses are
        read first (as before a save), so the arrays are what the step left. KeyError
        naming the key if the store has not seen it."""
        record = self._known(key)
        void_steps.resolve(record, self.rank)
        return inspection.state_of(record, self._memory.arrays_of(key),
                                   self._stats.pushes(key))

    def _known(self, key):
        try:
            if type(key) is bool:       # True == 1: never a kvstore key (_check_key)
                raise KeyError(key)
            return self._keys[key]
        except (KeyError, TypeError):
            known = sorted(map(repr, self._keys))
            raise KeyError('key %r is not a key of this %s: it was never given to init, '
                           'broadcast, push or pushpull (it has %d keys%s)'
                           % (key, self.type, len(known), (': ' + ', '.join(known[:5])
                                                           + (', ...' if known[5:] else ''))
                              if known else '')) from None

    def save_compression_state(self, fname):
        """Save this worker's per-key state (residuals and what codecs keep between
        steps), its parameters and byte counters (one file per worker). Rank 0 also
        has the servers save their residuals (``pull='compressed'``) in the directory
        ``fname + '.servers'``, on the servers' file system, after its last rounds are
        done (transport/ps.py). Call it on every worker after the same step; it is not
        collective (no worker waits for another's call), and a job resumes the state
        with as many workers as saved it (resume_workers.py)."""
        import json
        void_steps.resolve_all(self._keys.values(), self.rank)
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
