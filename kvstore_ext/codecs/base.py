"""The codec interface: one tensor (or chunk of one) and what its step exchanges.

One codec instance per tensor or chunk, so it knows the shape and its parameters.
A codec's ``step`` is a generator of rounds (rounds.py): it encodes ``grad`` with the
chunk's state (its residual and whatever else it declared), yields the rounds it needs
(``Sum``: add arrays over workers; ``Gather``: decode every worker's payload at the
servers and sum), and returns the float32 sum over workers. The transport only drives
the rounds, so a codec with two rounds (an agreement first, or PowerSGD's P and Q)
needs nothing from the transport that a one-round codec does not.

State that lives from one step to the next is declared by ``state_shapes`` (besides
the residual, which ``uses_residual`` asks for): the store keeps it per key and chunk,
saves it with checkpoints and restores it (memory.py).

Every integer in a payload is an exact float, so payloads survive the server's merge.
"""
import numpy as np

from .. import codec_list
from ..aggregate import decode_sum
from ..checks import check_decoded, check_encoded, deferred_checks  # noqa: F401
from ..rounds import Gather


class Codec:
    """Base class; see the module docstring."""

    name = None
    uses_residual = True     # error feedback: the store keeps a residual for the key
    passthrough = False      # float32 as it is: the store may use MXNet's own pushpull
    chunk_by_rows = False    # True: chunks are ranges of the first axis (filters)
    local_state = ()         # names of state_shapes that are this worker's own (not
                             # derived from round results): a void step keeps them
    # True if a step is one round whose encoder, on a bad gradient, keeps the residual
    # and returns a void payload (cpp/ops.cc), that reads no round result (a Gather
    # round; or a Sum round whose decoder turns a void sum into NaN: codecs/agreed.py),
    # and whose step replaces its local state rather than updating it in place: the
    # store then pushes without waiting for the encoder and reads its status at the
    # key's next step (store.py)
    deferred_checks = False
    # True if a step of several rounds may run under deferred checks too: it reads its
    # round results only on the engine, never on the host, and decides there that a
    # non-finite sum (a worker's NaN reaches it) voids the step, its state kept
    # (codecs/powersgd.py)
    voids_in_engine = False
    # True if ``step_sent`` reports the ``chunk_layout`` rows a step sent, which DGC's
    # masking zeroes the velocity of (codecs/momentum.py, ``MomentumCorrected``)
    reports_sent = False
    # True if ``step`` writes its sum into ``state.out`` when the store sets it (the
    # chunk's part of the output; float32) and returns that array: no copy afterwards
    sums_into = False
    # Constructor parameters besides the shape (kept as attributes of the same name)
    # that change the codec's seconds per element and that the schemes' default plans
    # vary: the shipped codec speed table (cost.CODEC_TIMES) files a codec under its
    # class and these (cost.codec_class)
    speed_params = ()

    # -- a server-decoded codec declares itself here; defining the class enters it in
    # the codec list (codec_list.py), which the servers and the C++ table's check read
    codec_id = None          # header word 1: a positive integer, unique
    server_decode = None     # None: the plugin's C++ table decodes it (cpp/codecs/);
                             # else staticmethod (payload, n) -> (float32[n], status)
    server_reencode = None   # staticmethod (total, residual, a, b, c) -> payload: the
                             # servers' compressed reply (replies.py), or None

    @staticmethod
    def payload_words_of(n, a, b):
        """Payload length (float32 words) for n elements and header parameters a, b."""
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get('codec_id') is not None:
            codec_list.register(cls)

    def __init__(self, shape):
        self.shape = tuple(int(d) for d in shape)
        self.size = int(np.prod(self.shape)) if self.shape else 1

    def kernel_cases(self):
        """(worker, server per worker slot, server once): the kernels a step runs, by
        their case names in the kernels benchmark (cost.KERNEL_TIMES), each on the
        chunk's elements; None (the default): priced from the codec class table
        instead (cost.CODEC_TIMES, or a calibration), which needs no entry here."""
        return None

    def deferrable(self, state):
        """True if this step, with this chunk state, may run under deferred checks (a
        codec whose step sometimes adds a round says when)."""
        return self.deferred_checks

    # -- chunking: large tensors travel as chunks that decode on their own ---------
    def chunk_layout(self):
        """(rows, elements per row) along which the tensor may be cut."""
        if self.chunk_by_rows:
            return self.shape[0], self.size // self.shape[0]
        return self.size, 1

    def chunk(self, start, stop):
        """Codec for rows [start, stop) of ``chunk_layout``."""
        raise NotImplementedError

    # -- one step -------------------------------------------------------------------
    def state_shapes(self):
        """{name: shape} of the float32 arrays this codec keeps between steps (besides
        the residual), saved with checkpoints. A name is absent until the step sets it."""
        return {}

    def step(self, grad, state, num_workers, rank):
        """Generator: yields rounds (rounds.py), receives their results, returns the
        float32 sum over workers. ``state`` is the chunk's memory.ChunkState;
        ``rank`` is this worker's rank in ``[0, num_workers)``, for codecs whose
        round arrays have a slot per worker (THC's norm round); most ignore it."""
        raise NotImplementedError

    def step_sent(self, grad, state, num_workers, rank):
        """Generator: ``step``'s rounds, returning (the summed result, not necessarily
        reshaped; the ``chunk_layout`` rows this worker's step sent, or None if the codec
        cannot say). Sent rows are an int array (engine ops, no wait); an index equal to
        the number of rows stands for nothing sent, so that a fixed-size payload with
        unused entries (AdaComp's slot) needs no sync. What ``MomentumCorrected`` masks."""
        total = yield from self.step(grad, state, num_workers, rank)
        return total, None

    def wire_words(self, num_workers):
        """[(round name, kind, words pushed, words pulled)] of a steady-state step, in
        float32 words: what the byte model (bench/wire_bytes.py) adds up."""
        raise NotImplementedError

    def compressed_input(self, grad, state):
        """What this step would compress, as a fresh array, without changing state:
        what a policy that measures compression errors must see (Scheme.observe)."""
        return grad + state.residual if state.residual is not None else grad.copy()

    def owed(self, state, num_workers):
        """What this chunk's state still owes the optimizer when its key leaves this
        codec for one of another kind (planning.plan), as a gradient for the key's next
        step, or None: the residual, error feedback's part not yet sent. A codec whose
        state is in other units than the gradient converts it (``MomentumCorrected``)."""
        return state.residual

    # -- identity ---------------------------------------------------------------------
    def kind(self):
        """What a re-plan compares to keep the chunks' state (planning.py): the class;
        a wrapper adds itself (``MomentumCorrected``)."""
        return type(self)

    def same_as(self, other):
        """True if ``other`` encodes exactly as this codec (re-planning keeps it)."""
        return type(self) is type(other) and vars(self) == vars(other)

    def describe(self):
        return self.name

    def __repr__(self):
        return '%s(%s, shape=%s)' % (type(self).__name__, self.describe(), self.shape)


class GatherCodec(Codec):
    """A codec decoded at the servers (the paper's aggregation): one ``Gather`` round of
    a self-describing payload (header: python/kvx_ref/wire.py), which the servers'
    ``decode_slots`` dispatches on by codec id.

    ``compressed_reply``: the servers re-encode the sum with this codec (and a residual
    of their own) instead of replying float32; subclasses that support it return
    their reply request from ``reply_request``."""

    compressed_reply = False

    def reply_request(self):
        """(codec id, n, a, b, c) the servers re-encode the sum with (aggregate.py)."""
        raise NotImplementedError

    def payload_words(self):
        """Length (float32 words) of one worker's payload: fixed per tensor."""
        raise NotImplementedError

    def encode(self, grad, residual):
        """Payload of ``grad + residual``; updates ``residual`` in place.

        Raises NonFiniteGradientError (residual untouched) on NaN/Inf."""
        raise NotImplementedError

    def decode(self, payload):
        """Dense float32 tensor of one payload (what a server adds for one worker)."""
        return decode_sum([payload], self.shape)

    def step(self, grad, state, num_workers, rank):
        total = yield self.gather(self.encode(grad, state.residual))
        return total.reshape(self.shape)

    def step_sent(self, grad, state, num_workers, rank):
        payload = self.encode(grad, state.residual)
        total = yield self.gather(payload)
        return total, self.sent_rows(payload)

    def sent_rows(self, payload):
        """The rows ``payload`` sends (see ``Codec.step_sent``), or None."""
        return None

    def gather(self, payload):
        """The round that sends ``payload``: its sum comes back float32, or re-encoded
        by the servers (``compressed_reply``)."""
        if self.compressed_reply:
            return Gather('payload', payload, self.size, self.reply_request(),
                          self.payload_words())
        return Gather('payload', payload, self.size)

    def wire_words(self, num_workers):
        pulled = self.payload_words() if self.compressed_reply else self.size
        return [('payload', 'gather', self.payload_words(), pulled)]


def innermost(codec):
    """The codec under any wrappers (``MomentumCorrected``): what decides a codec's
    kernels and kind of layer (cost.py, lgreco_hylo.py)."""
    while 'inner' in vars(codec):
        codec = codec.inner
    return codec
