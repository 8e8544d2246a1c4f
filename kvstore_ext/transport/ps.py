"""Transport over MXNet's parameter server (ps-lite) with ``dist_sync`` semantics.

Each round a codec asks for (rounds.py) travels on a key of an inner native
``dist_sync`` kvstore, one key per (tensor key, chunk, round name), made when the
round first appears and made anew when its kind or shape changes (a re-plan):

* ``Sum``: a dense key; each worker pushes its array, the stock server adds them,
  the pull returns the sum.
* ``Gather`` (the paper's server-side decoding): a ``row_sparse`` key with a slot of
  ``rows_per_slot`` rows per worker; each worker pushes only its slot, so the merge is
  a gather and the server-side aggregator (transport/server.py) sees every worker's
  payload, decodes and sums them, and writes the float32 sum into the first rows,
  which workers fetch with ``row_sparse_pull``.

``dist_sync`` makes both exact: a server answers pulls of a key only after the
round's update, and no worker's next push can merge into a finished round. Nor into an
open one: a worker's push of a key leaves only after its last pull of the key is in
(MXNet orders them through the pushed array alone; ``_after_last_round`` does it for
arrays that change from step to step). A stage of
rounds (one request per chunk of a tensor) is pushed entirely before anything is
pulled, so the chunks' round trips overlap.

Keys are made in the order rounds are first seen, which is the same on every worker
(Gluon presents tensors in the same order, and codecs and re-plans are
deterministic); ``kv.init`` of a new key is collective. MXNet places a key on server
``key * 9973 % num_servers``, so the number chosen for a new key picks its server:
the one with the least work so far (floats a round moves there), so that the
compressed keys, whose servers decode, do not pile up on one server while plain keys
fill the other. MXNet's own slicing of big arrays is switched off
(``MXNET_KVSTORE_BIGARRAY_BOUND``): chunking is ours, so that no payload is ever cut
where it cannot be decoded.
"""
import os

import numpy as np

from ..replies import FLOAT32_REPLY, reply_row
from ..errors import VOID, PayloadError, status_message
from ..ops import op
from ..worker_exit import exit_on_uncaught_exception
from .plain_route import PlainRoute
from .server import LAST_ROW_WORDS, ServerAggregator

ROW_WIDTH = 1024          # floats per row of a Gather key
_SERVER_HASH = 9973       # MXNet's kvstore_dist.h: a key goes to server key * 9973 % servers
_NO_SLICING = str(2 ** 31 - 1)


class _SumWire:
    """A dense key: push an array, pull the sum over workers (of the array's dtype)."""

    def __init__(self, transport, shape, dtype=np.float32):
        from mxnet import ndarray
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        size = int(np.prod(self.shape))
        self.key, _ = transport.new_key(work=sum_key_work(transport.num_workers, size))
        self.pulled = ndarray.zeros(self.shape, dtype=dtype)
        transport.kv.init(self.key, ndarray.zeros(self.shape, dtype=dtype))
        self.step_bytes = size * np.dtype(dtype).itemsize

    def push(self, kv, request):
        # the array is fresh each step (an encoder's output): it must not leave before
        # the last round's pull is in (``_after_last_round``)
        _after_last_round([self.pulled], [request.array])
        kv.push(self.key, request.array)
        return self.step_bytes

    def pull(self, kv):
        kv.pull(self.key, out=self.pulled)
        return self.step_bytes

    def result(self, request):
        return self.pulled


class _GatherWire:
    """A row_sparse key with one slot of rows per worker, and a last row that tells the
    servers how to read it: the reply request (aggregate.py), then the rows of a slot.

    A push is made by engine ops only, so that pushing waits for nothing: the payload
    is copied into this worker's slot of a key-shaped staging array, and multiplying
    a row_sparse array of ones on the slot's rows by it makes the row_sparse push
    (exact: x * 1.0 == x, NaN stays NaN). MXNet's ``row_sparse_array((data, rows))``
    would copy synchronously, waiting here for the encoder, so that no later key could
    be dispatched before this key's encode ran. The staging array costs one key's
    floats of memory (about the chunk's)."""

    def __init__(self, transport, shape, dtype=np.float32):
        from mxnet import ndarray
        from mxnet.ndarray import sparse
        if np.dtype(dtype) != np.float32:
            raise TypeError('Gather payloads are float32, got %s' % np.dtype(dtype))
        self.dtype = np.dtype(np.float32)
        transport.set_aggregator()
        self.shape = tuple(shape)
        self.payload_words, self.size, self.reply, self.reply_words = shape
        rank, num_workers = transport.rank, transport.num_workers
        self.width = _row_width(self.payload_words)
        self.rows_per_slot = -(-self.payload_words // self.width)
        self.result_rows = -(-(self.reply_words or self.size) // self.width)
        rows = max(num_workers * self.rows_per_slot, -(-self.size // self.width)) + 1
        self.key, name = transport.new_key(work=gather_key_work(
            num_workers, self.payload_words, self.size))
        self.key_shape = (rows, self.width)
        first = rank * self.rows_per_slot
        slot_rows = ndarray.arange(first, first + self.rows_per_slot, dtype='int64')
        self.staging = ndarray.zeros(self.key_shape, dtype=np.float32)
        self.slot_payload = self.staging[first:first + self.rows_per_slot].reshape(
            (-1,))[:self.payload_words]
        self.slot_ones = sparse.row_sparse_array(
            (ndarray.ones((self.rows_per_slot, self.width), dtype=np.float32), slot_rows),
            shape=self.key_shape)
        self.result_row_ids = ndarray.arange(0, self.result_rows, dtype='int64')
        self.pulled = sparse.zeros('row_sparse', self.key_shape, dtype=np.float32)
        self.failed = None      # the last reply's decode status, checked at the next push
        # a row_sparse key must be initialised with every row present; the last row
        # tells the servers how to reply, how many rows a slot has and the key's name
        # (its servers' saved residuals are named by it)
        init = np.zeros(self.key_shape, np.float32)
        init[-1, :LAST_ROW_WORDS] = reply_row(*(self.reply or FLOAT32_REPLY)) + [
            float(self.rows_per_slot), float(name)]
        transport.kv.init(self.key, sparse.row_sparse_array(
            (ndarray.array(init), ndarray.arange(rows, dtype='int64')),
            shape=self.key_shape))

    def push(self, kv, request):
        from mxnet.ndarray import sparse
        self._check_last_reply()
        request.payload.reshape((-1,)).copyto(self.slot_payload)
        kv.push(self.key, sparse.elemwise_mul(self.slot_ones, self.staging))
        return self.rows_per_slot * self.width * 4

    def pull(self, kv):
        kv.row_sparse_pull(self.key, out=self.pulled, row_ids=self.result_row_ids)
        return self.result_rows * self.width * 4

    def result(self, request):
        """The pulled sum as a dense array, into ``request.out`` if set, by engine ops
        (``kvx_rows_dense``, one copy of the pulled rows; reading ``pulled.data`` would
        wait here for this key's round trip, MXNet's ``cast_storage`` zero-fills the key
        first and costs a copy of the slice after). A compressed reply is decoded here;
        its status is checked at the next push, so that no key waits for its round trip
        before the next is pushed (a malformed reply decodes to zeros and raises one
        step later)."""
        from mxnet import ndarray
        if self.reply is None:
            return op('kvx_rows_dense')(self.pulled, size=self.size, out=request.out)
        reply = op('kvx_rows_dense')(self.pulled, size=self.result_rows * self.width)
        total = request.out if request.out is not None else \
            ndarray.empty((self.size,), dtype=np.float32)
        self.failed = ndarray.empty((1,), dtype=np.float32)
        op('kvx_decode_slots')(reply.reshape((1, -1)), size=self.size,
                               out=[total, self.failed])
        return total

    def _check_last_reply(self):
        if self.failed is not None:
            code, self.failed = int(self.failed.asnumpy()[0]), None
            if code and code != VOID:     # void: a worker's non-finite gradient, not an error
                raise PayloadError('compressed reply of server key %d rejected: %s'
                                   % (self.key, status_message(code)))


_WIRES = {'sum': _SumWire, 'gather': _GatherWire}


def _after_last_round(last_outs, values):
    """Hold back the push of ``values`` until the pull into ``last_outs`` (the key's
    previous round) is done, unless they are the same arrays.

    MXNet's dist_sync pushes a CPU array in place and orders a key's push after its
    last pull only through that array: a worker that pushes a new array every step
    and never reads the results (a loop that does not train on them) would send step
    s+1 while step s's round is still open, and the server, counting pushes, would
    close that round with two of its pushes and another worker's pull would return a
    wrong sum (then a round waits forever). A plain key under Gluon pushes the
    gradient arrays it pulled into and costs nothing; otherwise (a Sum round's encoded
    array, always) one no-op engine op an array. (Gather keys are safe: MXNet copies a
    row_sparse push into a buffer of the key.)"""
    for value in values:
        if not any(value is out for out in last_outs):
            for out in last_outs:
                op('kvx_after')(out, value)


class KeyNumbers:
    """Numbers for new keys, each on the server with the least work so far (floats a
    step moves there; a broadcast key counts 0: it travels once), so that big keys
    spread over the servers whatever the order of their sizes.

    MXNet's kvstore_dist.h puts a key that it does not slice on server
    ``key * 9973 % num_servers``; 9973 is prime, so the keys of a server are
    ``first + j * num_servers`` (for fewer than 9973 servers)."""

    def __init__(self, num_servers):
        self.num_servers = max(int(num_servers), 1)
        self.work = [0] * self.num_servers
        self.made = 0
        self._next = [next(k for k in range(self.num_servers)
                           if k * _SERVER_HASH % self.num_servers == server)
                      for server in range(self.num_servers)]

    def server_of(self, key):
        return key * _SERVER_HASH % self.num_servers

    def new(self, work=0):
        """(number, name) of a new key: its number picks its server; its name counts
        the keys made before it, the same whatever the number of servers."""
        server = min(range(self.num_servers), key=lambda s: (self.work[s], s))
        key = self._next[server]
        self._next[server] += self.num_servers
        self.work[server] += work
        self.made += 1
        return key, self.made - 1


def _row_width(payload_words):
    """Floats a row of a Gather key: ROW_WIDTH, or less for a small payload, but the
    last row's words must fit."""
    return max(min(ROW_WIDTH, payload_words), LAST_ROW_WORDS)


def sum_key_work(num_workers, size):
    """A Sum key's work at its server (KeyNumbers): every worker's array in, the sum."""
    return (num_workers + 1) * size


def gather_key_work(num_workers, payload_words, size):
    """A Gather key's work at its server: decode every worker's slot, write the sum."""
    return num_workers * payload_words + size


def gather_wire_bytes(payload_words, pulled_words):
    """(bytes pushed, bytes pulled) of a Gather round here: payload and reply are
    padded to whole rows."""
    width = _row_width(payload_words)
    return 4 * width * -(-payload_words // width), 4 * width * -(-pulled_words // width)


class PSTransport:
    """This process is a worker of a job started by a launcher (DMLC_* variables)."""

    def __init__(self):
        from mxnet import kvstore as mx_kvstore
        exit_on_uncaught_exception()
        os.environ['MXNET_KVSTORE_BIGARRAY_BOUND'] = _NO_SLICING
        self.kv = mx_kvstore.create('dist_sync')
        self.rank, self.num_workers = self.kv.rank, self.kv.num_workers
        self._aggregator_set = False
        self._restore = None        # directory of the servers' saved residuals
        self._keys = KeyNumbers(int(os.environ.get('DMLC_NUM_SERVER', '1')))
        self._params = {}
        self._wires = {}      # (key, chunk, round name) -> wire
        self._plain_routes = {}  # key -> its plain step's route (the arrays it wrote)

    def release(self):
        """Drop the inner native kvstore (kvstore_ext/shutdown.py, at exit, after the
        engine is idle): its destructor's barrier with the other workers runs now."""
        self.kv = None

    def new_key(self, work=0):
        """(number, name) of a new key (KeyNumbers.new)."""
        return self._keys.new(work)

    def set_aggregator(self):
        """Install the server-side aggregator before the first Gather key.

        Only then: once an updater is set, the server calls it (Python) for every key
        and round, which costs plain float32 keys time they do not cost in dist_sync;
        a scheme with no Gather round (dist_sync_none, homomorphic Hylo) never sets one.
        Every worker makes keys in the same order, so all of them get here before
        their first Gather push."""
        if not self._aggregator_set:
            self.kv.set_optimizer(ServerAggregator(self.num_workers, restore=self._restore))
            self._aggregator_set = True

    def save_server_state(self, directory):
        """Rank 0 has every server write its residuals (compressed replies) into
        ``directory``, on the servers' file system; it returns once they have.

        The files are a cut after the last step rank 0 called pushpull for: before the
        command leaves (it goes straight to the servers, past MXNet's engine), rank 0
        waits for every op it queued, its pushes included. A push of a round is done
        when the servers answered it, which they do only once every worker pushed that
        round and the aggregator ran; the save then waits for the residuals it writes
        (the re-encode). No barrier is needed, so a save called by rank 0 alone cannot
        deadlock (another worker may call its own save at any time, or not at all)."""
        if self.rank == 0 and self._aggregator_set:
            from mxnet import ndarray
            ndarray.waitall()
            self.kv.set_optimizer(ServerAggregator(
                self.num_workers, command=('save', os.path.abspath(directory))))

    def restore_server_state(self, directory):
        """The servers' residuals saved in ``directory`` (if it exists) are given to
        their keys when the keys first appear."""
        if os.path.isdir(directory):
            self._restore = os.path.abspath(directory)

    def _wire(self, key, chunk, name, kind, shape, dtype=np.float32):
        """The wire of a round, made (or made anew) when first seen, reshaped or retyped."""
        wire = self._wires.get((key, chunk, name))
        if wire is None or type(wire) is not _WIRES[kind] or wire.shape != shape or \
                wire.dtype != np.dtype(dtype):
            wire = self._wires[(key, chunk, name)] = _WIRES[kind](self, shape, dtype)
        return wire

    def broadcast(self, key, value):
        """Rank 0's value, through a dense key of its own (MXNet's init + pull)."""
        if key in self._params:
            raise RuntimeError('key %r was already broadcast: a dist kvstore initialises '
                               'each key once' % (key,))
        self._params[key], _ = self.new_key()
        out = value.copy()
        self.kv.broadcast(self._params[key], value, out=out)
        return out

    def exchange(self, key, requests):
        """One stage of rounds of a tensor's chunks: make missing keys, push every
        request, then pull every result. Returns (results, bytes pushed, bytes pulled)."""
        wires = [self._wire(key, chunk, r.name, r.kind, r.shape, r.dtype)
                 for chunk, r in requests]
        pushed = sum(w.push(self.kv, r) for w, (_, r) in zip(wires, requests))
        pulled = sum(w.pull(self.kv) for w in wires)
        return [w.result(r) for w, (_, r) in zip(wires, requests)], pushed, pulled

    def pushpull_plain(self, key, chunks, values, outs):
        """Uncompressed: MXNet's own pushpull (it sums devices) of each chunk, on views
        of the arrays, through the chunk's Sum key, in the arrays' dtype (a float64 key
        sums as in dist_sync). Views and call arguments are made once per plan and
        arrays (plain_route.py). Returns (bytes pushed, bytes pulled)."""
        route = self._plain_routes.get(key)
        if route is None or not route.matches(chunks, values, outs):
            dtype = np.dtype(values[0].dtype)
            wires = [self._wire(key, index, 'payload', 'sum', chunk.codec.shape, dtype)
                     for index, chunk in enumerate(chunks)]
            if route is not None:
                _after_last_round(route.outs, values)
            route = self._plain_routes[key] = PlainRoute(wires, chunks, values, outs)
        else:
            route.order()
        route.run(self.kv)
        return route.step_bytes, route.step_bytes
