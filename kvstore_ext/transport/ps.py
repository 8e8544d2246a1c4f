"""Transport over MXNet's parameter server (ps-lite) with ``dist_sync`` semantics.

Every chunk of every tensor is a key of an inner native ``dist_sync`` kvstore, in
one of two modes, chosen by the chunk's codec:

* **sum mode** (additive codecs: float32 pass-through, homomorphic payloads): a dense
  key; each worker pushes its payload, the stock server adds them, the pull returns
  the sum, decoded on the worker. Codecs that need an agreement (the homomorphic
  ones) get it from a tiny sum-mode round on a second key, or from the tail of the
  previous step's sum (agreement.py).
* **server-decode mode** (the paper's design): a ``row_sparse`` key with a slot of
  ``rows_per_slot`` rows per worker; each worker pushes only its slot, so the merge is
  a gather and the server-side aggregator (transport/server.py) sees every worker's
  payload, decodes and sums them, and writes the float32 sum into the first rows,
  which workers fetch with ``row_sparse_pull``.

``dist_sync`` makes both exact: a server answers pulls of a key only after the
round's update, and no worker's next push can merge into a finished round.

Keys are numbered in the order tensors are first seen, which Gluon makes identical
on every worker; consecutive keys land on consecutive servers (MXNet places a small
key on server ``key * 9973 % num_servers``), so chunks spread evenly. MXNet's own
slicing of big arrays is switched off (``MXNET_KVSTORE_BIGARRAY_BOUND``): chunking
is ours, so that no payload is ever cut where it cannot be decoded.
"""
import os
import sys

import numpy as np

from ..agreement import settled, tail_words
from ..chunking import assemble
from .server import ServerAggregator

ROW_WIDTH = 1024          # floats per row of a server-decode key
_NO_SLICING = str(2 ** 31 - 1)


class _SumKey:
    """A dense key for an additive chunk: push payload (+ agreement tail), pull the sum.

    Codecs that agree by a round get a second, small key for it."""

    def __init__(self, kv, key, codec, num_workers, agreement_key):
        from mxnet import ndarray
        self.key, self.codec = key, codec
        self.words = codec.sum_words(num_workers)
        self.tail = tail_words(codec)
        self.step_bytes = (self.words + self.tail) * np.dtype(codec.sum_dtype).itemsize
        shape = codec.sum_shape(num_workers)
        if self.tail:
            shape = (self.words + self.tail,)
        self.pulled = ndarray.zeros(shape, dtype=codec.sum_dtype)
        kv.init(key, ndarray.zeros(shape, dtype=codec.sum_dtype))
        self.agreement_key = agreement_key
        if agreement_key is not None:
            self.round_sum = ndarray.zeros((codec.agreement_words,), dtype=np.float32)
            kv.init(agreement_key, self.round_sum)

    def payload(self, grad, residual, num_workers, agreement):
        """What this worker pushes: the encoded chunk, then the agreement tail."""
        words = self.codec.encode_sum(grad, residual, num_workers,
                                      settled(self.codec, agreement, num_workers))
        if not self.tail:
            return words
        from mxnet import ndarray
        return ndarray.concat(words, agreement.contribution(grad, residual), dim=0)

    def result(self, num_workers, agreement):
        """The decoded sum; the tail becomes the next step's agreement."""
        params = settled(self.codec, agreement, num_workers)
        if not self.tail:
            return self.codec.decode_sum(self.pulled, num_workers, params)
        out = self.codec.decode_sum(self.pulled[:self.words], num_workers, params)
        agreement.agreed_by_previous(self.pulled[self.words:])
        return out


class _SlotKey:
    """A row_sparse key with one slot of rows per worker (server-decode mode)."""

    def __init__(self, kv, key, codec, rank, num_workers):
        from mxnet import ndarray
        from mxnet.ndarray import sparse
        self.key, self.codec = key, codec
        self.payload_words = codec.payload_words()
        self.width = min(ROW_WIDTH, self.payload_words)
        self.rows_per_slot = -(-self.payload_words // self.width)
        self.result_rows = -(-codec.size // self.width)
        rows = max(num_workers * self.rows_per_slot, self.result_rows)
        self.shape = (rows, self.width)
        self.slot = ndarray.zeros((self.rows_per_slot, self.width), dtype=np.float32)
        first = rank * self.rows_per_slot
        self.slot_rows = ndarray.arange(first, first + self.rows_per_slot, dtype='int64')
        self.result_row_ids = ndarray.arange(0, self.result_rows, dtype='int64')
        self.pulled = sparse.zeros('row_sparse', self.shape, dtype=np.float32)
        # a row_sparse key must be initialised with every row present
        kv.init(key, sparse.row_sparse_array(
            (ndarray.zeros(self.shape, dtype=np.float32), ndarray.arange(rows, dtype='int64')),
            shape=self.shape))

    def push_pull(self, kv, payload):
        from mxnet.ndarray import sparse
        self.slot.reshape((-1,))[:self.payload_words] = payload
        kv.push(self.key, sparse.row_sparse_array((self.slot, self.slot_rows),
                                                  shape=self.shape))
        kv.row_sparse_pull(self.key, out=self.pulled, row_ids=self.result_row_ids)

    def result(self):
        """The pulled sum as a dense array, by an engine op (``cast_storage``; reading
        ``pulled.data`` would wait here for this key's round trip, and ``tostype`` is
        measured 7x slower)."""
        from mxnet.ndarray import sparse
        dense = sparse.cast_storage(self.pulled, 'default').reshape((-1,))
        return dense[:self.codec.size].reshape(self.codec.shape)

    def bytes_pushed(self):
        return self.slot.size * 4

    def bytes_pulled(self):
        return self.result_rows * self.width * 4


def _exit_on_uncaught_exception():
    """Make an uncaught exception end this worker at once with exit code 1.

    Why: after a normal interpreter exit, ps-lite's shutdown waits at a barrier for
    the other workers, who wait for this worker's next push: the whole job hangs
    (measured). Exiting hard lets the launcher see the failure and stop every node.
    """
    previous = sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    if getattr(sys.excepthook, '__name__', '') != 'hook':
        sys.excepthook = hook


class PSTransport:
    """This process is a worker of a job started by a launcher (DMLC_* variables)."""

    def __init__(self, scheme):
        from mxnet import kvstore as mx_kvstore
        _exit_on_uncaught_exception()
        os.environ['MXNET_KVSTORE_BIGARRAY_BOUND'] = _NO_SLICING
        self._kv = mx_kvstore.create('dist_sync')
        self.rank, self.num_workers = self._kv.rank, self._kv.num_workers
        self._aggregator_set = False
        self._next_key = 0
        self._params = {}
        self._wire = {}

    def _new_key(self):
        self._next_key += 1
        return self._next_key - 1

    def configure(self, scheme):
        """Scheme parameters only change codecs, which are declared later."""

    def _set_aggregator(self):
        """Install the server-side aggregator before the first server-decode key.

        Only then: once an updater is set, the server calls it (Python) for every key
        and round, which costs plain float32 keys time they do not cost in dist_sync;
        a scheme with no server-decode key (dist_sync_none, homomorphic Hylo) never
        sets one. Every worker declares keys in the same order, so all of them get
        here before their first server-decode push."""
        if not self._aggregator_set:
            self._kv.set_optimizer(ServerAggregator(self.num_workers))
            self._aggregator_set = True

    def broadcast(self, key, value):
        """Rank 0's value, through a dense key of its own (MXNet's init + pull)."""
        if key in self._params:
            raise RuntimeError('key %r was already broadcast: a dist kvstore initialises '
                               'each key once' % (key,))
        self._params[key] = self._new_key()
        out = value.copy()
        self._kv.broadcast(self._params[key], value, out=out)
        return out

    def declare(self, key, chunks):
        wire = []
        for chunk in chunks:
            codec = chunk.codec
            if codec.additive:
                # every codec that agrees needs a round key: 'previous' for its first step
                agreement = self._new_key() if codec.agreement_words else None
                wire.append(_SumKey(self._kv, self._new_key(), codec, self.num_workers,
                                    agreement))
            else:
                self._set_aggregator()
                wire.append(_SlotKey(self._kv, self._new_key(), codec, self.rank,
                                     self.num_workers))
        self._wire[key] = wire

    def pushpull_plain(self, key, chunks, values, outs):
        """Uncompressed float32: MXNet's own pushpull (it sums devices) of each chunk,
        on views of the arrays."""
        traffic = 0
        for w, chunk in zip(self._wire[key], chunks):
            self._kv.pushpull(w.key, [chunk.view(v) for v in values],
                              out=[chunk.view(o) for o in outs])
            traffic += w.step_bytes
        return traffic, traffic

    def pushpull(self, key, chunks, grad, residual, agreements):
        """Push every chunk, then pull: the chunks of a tensor travel concurrently.

        Agreement rounds, where needed, go first for all chunks, so their round trips
        overlap too."""
        wire = self._wire[key]
        views = [(c.view(grad), c.view(residual) if residual is not None else None)
                 for c in chunks]
        pushed = pulled = 0
        for w, (g, r), a in zip(wire, views, agreements):
            if a is not None and a.needs_round():
                self._kv.push(w.agreement_key, a.contribution(g, r))
                self._kv.pull(w.agreement_key, out=w.round_sum)
                a.agreed_by_round(w.round_sum)
                pushed, pulled = pushed + 4 * a.words, pulled + 4 * a.words
        for w, (g, r), a in zip(wire, views, agreements):
            if isinstance(w, _SumKey):
                self._kv.push(w.key, w.payload(g, r, self.num_workers, a))
                self._kv.pull(w.key, out=w.pulled)
                pushed += w.step_bytes
                pulled += w.step_bytes
            else:
                w.push_pull(self._kv, w.codec.encode(g, r))
                pushed += w.bytes_pushed()
                pulled += w.bytes_pulled()
        parts = [w.result(self.num_workers, a) if isinstance(w, _SumKey) else w.result()
                 for w, a in zip(wire, agreements)]
        return assemble(chunks, parts, grad.shape), pushed, pulled

    def barrier(self):
        self._kv._barrier()
