"""What runs inside each parameter server: the aggregator set with ``set_optimizer``.

MXNet pickles it to every server, where it is called as an optimizer's ``update``
for every key with ``grad`` = the round's merged push and ``weight`` = the stored
value that workers pull:

* dense keys (additive payloads, sum mode): the merge is the sum; store it;
* ``row_sparse`` keys (server-decode mode): each worker pushed only its own slot of
  rows, so the merge is a gather of every worker's payload; one C++ op decodes each
  slot, sums in float32 (in worker order) and the sum goes into the key's first rows.

A malformed payload never crashes the server: it is logged with the key and the
worker, and the round's result is filled with NaN so the workers see it.

Server processes import this while ``mxnet`` is only partly imported: only explicit
submodule imports here (no ``mx.nd``).
"""
import logging

import numpy as np
from mxnet.optimizer import Optimizer

from ..aggregate import decode_slots
from ..errors import PayloadError

log = logging.getLogger('kvstore_ext.server')


class ServerAggregator(Optimizer):
    """Decode-and-sum for server-decode keys, plain sum for the others."""

    def __init__(self, num_workers):
        super().__init__()
        self.num_workers = int(num_workers)
        self._row_ids = {}

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        if weight.stype != 'row_sparse':
            grad.copyto(weight)
            return
        try:
            total = self._decode_slots(grad, weight.shape)
        except Exception as err:  # noqa: BLE001  a server must outlive any payload
            log.error('key %s: payload rejected, result set to NaN: %s', index, err)
            from mxnet import ndarray
            total = ndarray.full(weight.shape, np.nan, dtype=np.float32)
        self._store(weight, total)

    update_multi_precision = update

    def _decode_slots(self, grad, shape):
        """The sum of the payloads in ``grad``'s worker slots, as a (rows, width) array:
        one C++ op decodes every slot (kernels.h: decode_slots) and reports per worker."""
        rows = grad.indices.asnumpy()
        if rows.size == 0 or rows.size % self.num_workers or \
                not np.array_equal(rows, np.arange(rows.size)):
            raise PayloadError('expected %d equal worker slots, got rows %s'
                               % (self.num_workers, rows[:8]))
        slots = grad.data.reshape((self.num_workers, -1))
        return decode_slots(slots, shape[0] * shape[1]).reshape(shape)

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
