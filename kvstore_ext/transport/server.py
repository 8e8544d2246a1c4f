"""What runs inside each parameter server: the aggregator set with ``set_optimizer``.

MXNet pickles it to every server, where it is called as an optimizer's ``update``
for every key with ``grad`` = the round's merged push and ``weight`` = the stored
value that workers pull:

* dense keys (``Sum`` rounds): the merge is the sum; store it;
* ``row_sparse`` keys (``Gather`` rounds): each worker pushed only its own slot of
  rows, so the merge is a gather of every worker's payload; one C++ op decodes each
  slot, sums in float32 (in worker order) and the sum goes into the key's first rows.
  The key's last row is its reply request (aggregate.py), set when the key was
  initialised: float32, or the sum re-encoded by the workers' codec with a residual
  kept here, per key (two-way compression).

A malformed payload never crashes the server: it is logged with the key and the
worker, and the round's result is filled with NaN so the workers see it. A void
payload (a worker's non-finite gradient, rounds.py) makes the result NaN too, quietly:
it is not an error of the server's.

Server processes import this while ``mxnet`` is only partly imported: only explicit
submodule imports here (no ``mx.nd``).
"""
import logging

import numpy as np
from mxnet.optimizer import Optimizer

from ..aggregate import decode_slots, parse_reply_row, reencode
from ..errors import PayloadError

log = logging.getLogger('kvstore_ext.server')


class ServerAggregator(Optimizer):
    """Decode-and-sum for server-decode keys, plain sum for the others."""

    def __init__(self, num_workers):
        super().__init__()
        self.num_workers = int(num_workers)
        self._row_ids = {}
        self._replies = {}       # key -> (reply request, server residual or None)

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        if weight.stype != 'row_sparse':
            grad.copyto(weight)
            return
        from mxnet import ndarray
        rows, width = weight.shape
        reply_row = None
        try:
            reply_row, request, residual = self._reply(index, weight)
            total, voided = self._decode_slots(grad, (rows - 1) * width)
            if voided:
                # NaN rows: a float32 reply is the NaN sum; a compressed one decodes as
                # void on the workers (its first word is NaN); the residual is untouched
                log.info('key %s: worker(s) %s voided this round (non-finite gradient); '
                         'the sum is NaN', index, voided)
            else:
                payload = reencode(total, residual, request)
                if payload is not None:
                    total = ndarray.zeros((rows - 1) * width, dtype=np.float32)
                    total[:payload.size] = payload
        except Exception as err:  # noqa: BLE001  a server must outlive any payload
            log.error('key %s: payload rejected, result set to NaN: %s', index, err)
            total = ndarray.full((rows - 1) * width, np.nan, dtype=np.float32)
        if reply_row is None:
            reply_row = ndarray.full((width,), np.nan, dtype=np.float32)
        self._store(weight, ndarray.concat(total.reshape((rows - 1, width)),
                                           reply_row.reshape((1, width)), dim=0))

    update_multi_precision = update

    def _reply(self, index, weight):
        """(reply row, request, residual) of a key, read from its last row once."""
        known = self._replies.get(index)
        if known is None:
            from mxnet import ndarray
            row = weight.data[weight.shape[0] - 1].copy()
            request = parse_reply_row(row.asnumpy())
            residual = ndarray.zeros((request[1],), dtype=np.float32) \
                if request[0] != 1 else None
            known = self._replies[index] = (row, request, residual)
        return known

    def _decode_slots(self, grad, capacity):
        """The sum of the payloads in ``grad``'s worker slots (``capacity`` floats): one
        C++ op decodes every slot (kernels.h: decode_slots) and reports per worker."""
        rows = grad.indices.asnumpy()
        if rows.size == 0 or rows.size % self.num_workers or \
                not np.array_equal(rows, np.arange(rows.size)):
            raise PayloadError('expected %d equal worker slots, got rows %s'
                               % (self.num_workers, rows[:8]))
        slots = grad.data.reshape((self.num_workers, -1))
        return decode_slots(slots, capacity)

    def _store(self, weight, total):
        """Replace the row_sparse ``weight`` by ``total`` with every row present (the
        server's pull handler reads rows by position)."""
        from mxnet.ndarray import sparse
        rows = self._row_ids.get(weight.shape[0])
        if rows is None:
            from mxnet import ndarray
            rows = self._row_ids[weight.shape[0]] = ndarray.arange(weight.shape[0],
                                                                    dtype='int64')
        weight[:] = sparse.row_sparse_array((total, rows), shape=weight.shape)
