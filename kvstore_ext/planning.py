"""How a key gets its codec: at its first step, and again at every step where the
scheme re-plans (``Scheme.replans_at``).

Why a module of its own: planning is where the workers must stay in step. Every
worker plans a key at the same step from the same inputs: before its first plan the
workers' configurations are compared (fingerprint.py), and before the first re-plan of
a step the scheme settles what its choice depends on (a round of its own). And a plan
fixes everything a step then reads (codec, chunks, residual, how a NaN is caught:
stepping.py, void_steps.py), so it is made in one place.
"""
import numpy as np

from . import chunking, fingerprint


class KeyRecord:
    """What the store knows about one key: shape, dtype, its plan (codec, chunks, the
    chunks' state) and the arrays it last checked."""

    def __init__(self, key, shape, dtype):
        self.key, self.shape, self.dtype = key, shape, dtype
        self.raw_bytes = 4 * int(np.prod(shape))     # float32 equivalent
        self.codec = self.chunks = self.residual = None
        self.chunk_states = ()
        self.plain = False
        self.agreed = False         # its fingerprint was compared (agree)
        self.check_whole = None     # when a NaN is looked for before encoding (plan)
        self.deferred = False       # encoders' statuses read at the next step (plan)
        self.pending = None         # the last deferred step's statuses (void_steps.resolve)
        self.flush = None           # what a re-plan left owed (Codec.owed): sent with the next step
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


def plan_if_due(store, state, step):
    """Plan ``state``'s key if it has no codec yet or the scheme re-plans at ``step``:
    the workers' configurations are compared first (agree_due), and the scheme
    settles once per step before its first re-plan."""
    if state.codec is not None and not (step and store._scheme.replans_at(step)):
        return
    if state.codec is None and agree_due(store, state):
        agree(store, state)
    if step and step > store._settled:
        settle(store, step)
    plan(store, state, step)


def agree(store, state):
    """Every worker's kvstore type, parameters and the key's shape and dtype must be
    this worker's, or every worker raises, naming what differs (fingerprint.py)."""
    fingerprint.agree(store._transport, store.type, state.key, state.shape,
                      state.dtype, store._scheme.params, store._scheme.param_specs())
    state.agreed = True


def agree_due(store, state):
    """True if a key about to get its first codec must be compared first: a key that
    ``init``/``broadcast`` did not compare (declared by its first pushpull), and the
    first key planned in the store. The scheme's parameters may change between a key's
    init/broadcast and the first step (``set_gradient_compression``, the hand-over of
    the optimizer's momentum at the first round: handover.py), and are frozen from the
    first codec on (both refuse then). So once the first plan has compared them, a key
    that init/broadcast compared is compared again for nothing: Gluon's Trainer
    broadcasts every key, and each took two rounds. Every worker decides alike: it
    declares and pushes the same keys in the same order."""
    return not state.agreed or not any(s.codec is not None for s in store._keys.values())


def settle(store, step):
    """The scheme settles what its re-plans at ``step`` depend on (Scheme.settle),
    once per step, when the first key reaches it: every worker pushes its keys in the
    same order, so every worker gets here at the same point. Its rounds go through the
    transport under a key no user key can be (a tuple)."""
    store._settled = step

    def share(array):
        from .rounds import Sum
        results, pushed, pulled = store._transport.exchange(
            ('__scheme__', 'settle'), [(0, Sum('settle', array))])
        store._stats.record_extra(pushed, pulled)
        return results[0]

    store._scheme.settle(step, store.rank, share)


def plan(store, state, step):
    """Codec, chunks and chunk states of a key: at its first pushpull, and again
    when the scheme re-plans (a codec that encodes the same is kept)."""
    scheme, memory = store._scheme, store._memory
    num_workers = store.num_workers
    scheme.num_workers = num_workers
    codec = scheme.codec_for_key(state.key, state.shape, state.dtype, step=step)
    previous = state.codec
    if previous is not None and codec.same_as(previous):
        return
    if previous is not None and previous.kind() != codec.kind():
        # error feedback loses nothing: what the old codec's state owes goes with the
        # next step as a gradient (Codec.owed), and the new codec starts afresh
        state.flush = owed(state, num_workers)
        memory.take_residual(state.key)
    state.codec = codec
    state.chunks = chunking.split(codec, scheme.params['chunk_size'])
    # plain: a tensor sent as it is: no payload to build, so each chunk takes
    # MXNet's own pushpull on a view of the arrays (no copies; MXNet sums the
    # devices), in the key's own dtype (float64 and float16 sum as in dist_sync,
    # not rounded through float32): the plugin then costs what dist_sync costs
    state.plain = codec.passthrough
    if codec.uses_residual:
        state.residual = memory.residual(state.key, state.shape)
    else:
        # a residual a checkpoint brought for a key now sent as it is: with the next step
        state.residual = None
        restored = memory.take_residual(state.key)
        if restored is not None:
            state.flush = restored
    # A key whose step is one round of one chunk lets its encoder find a NaN before
    # anything is exchanged or changed. A tensor of several chunks, or a step with
    # an earlier round (an agreement, PowerSGD's P; a key's first step may run one
    # the steady state does not) is checked whole first: a NaN in the last chunk,
    # or found in a second round, must leave every state as it was. None: the key
    # keeps no state, a NaN just reaches the sum.
    state.check_whole = None
    if state.residual is not None or codec.state_shapes():
        state.check_whole = (len(state.chunks) > 1
                             or len(codec.wire_words(num_workers)) > 1)
    # ... unless its encoders' statuses can wait (void_steps.deferred_step)
    state.deferred = (codec.deferred_checks
                      and (len(codec.wire_words(num_workers)) == 1
                           or codec.voids_in_engine))
    state.chunk_states = memory.chunk_states(
        state.key, state.chunks, state.residual,
        keep=previous is None or previous.kind() == codec.kind(),
        restored=previous is None and store._restored)


def owed(state, num_workers):
    """What the key's chunks owe the optimizer as they leave their codec (Codec.owed),
    as one float32 array of the tensor's shape, or None if they owe nothing."""
    parts = [c.codec.owed(cs, num_workers)
             for c, cs in zip(state.chunks, state.chunk_states)]
    if all(part is None for part in parts):
        return None
    # (a plain codec's part is a view of the residual the key gives up: nothing else
    # writes to it any more)
    return chunking.assemble(state.chunks, parts, state.shape)
