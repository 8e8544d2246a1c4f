"""What runs inside each parameter server: the aggregator set with ``set_optimizer``.

MXNet pickles it to every server, where it is called as an optimizer's ``update``
for every key with ``grad`` = the round's merged push and ``weight`` = the stored
value that workers pull:

* dense keys (additive payloads, sum mode): the merge is the sum; store it;
* ``row_sparse`` keys (server-decode mode): each worker pushed only its own slot of
  rows, so the merge is a gather of every worker's payload; decode each (C++ ops),
  sum in float32 and store the sum in the key's first rows.

A malformed payload never crashes the server: it is logged with the key and the
worker, and the round's result is filled with NaN so the workers see it.

Server processes import this while ``mxnet`` is only partly imported: only explicit
submodule imports here (no ``mx.nd``).
"""
import logging

import numpy as np
from mxnet.optimizer import Optimizer

from ..codecs.base import HEADER_WORDS
from ..aggregate import payload_codec, header_size
from ..errors import PayloadError

log = logging.getLogger('kvstore_ext.server')


class ServerAggregator(Optimizer):
    """Decode-and-sum for server-decode keys, plain sum for the others."""

    def __init__(self, num_workers):
        super().__init__()
        self.num_workers = int(num_workers)

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        if weight.stype != 'row_sparse':
            grad.copyto(weight)
            return
        try:
            summed = self._decode_slots(grad)
        except (PayloadError, ValueError) as err:
            log.error('key %s: payload rejected, result set to NaN: %s', index, err)
            summed = None
        self._store(weight, summed)

    update_multi_precision = update

    def _decode_slots(self, grad):
        """float32 sum of the payloads in ``grad``'s worker slots."""
        from mxnet import ndarray
        rows = grad.indices.asnumpy()
        if rows.size == 0 or rows.size % self.num_workers or \
                not np.array_equal(rows, np.arange(rows.size)):
            raise PayloadError('expected %d equal worker slots, got rows %s'
                               % (self.num_workers, rows[:8]))
        slots = grad.data.reshape((self.num_workers, -1))
        acc, first = None, None
        for worker in range(self.num_workers):
            slot = slots[worker]
            header = slot[:HEADER_WORDS].asnumpy()
            try:
                length, codec = header_size(header, slot.size), payload_codec(slot)
                if first is None:
                    first = header[:5].copy()
                    acc = ndarray.zeros(codec.decode_shape(header), dtype=np.float32)
                elif not np.array_equal(first, header[:5]):
                    raise PayloadError('header differs from worker 0\'s')
                codec.decode_add(slot[:length], acc)
            except PayloadError as err:
                raise PayloadError('worker %d: %s' % (worker, err)) from None
        return acc

    @staticmethod
    def _store(weight, summed):
        """Write ``summed`` (or NaN) into the first rows of the row_sparse ``weight``,
        keeping every row present (the server's pull reads rows by position)."""
        from mxnet import ndarray
        from mxnet.ndarray import sparse
        rows, width = weight.shape
        full = ndarray.zeros((rows, width), dtype=np.float32)
        flat = full.reshape((-1,))
        if summed is None:
            flat[:] = np.nan
        else:
            flat[:summed.size] = summed.reshape((-1,))
        weight[:] = sparse.row_sparse_array((full, ndarray.arange(rows)), shape=weight.shape)
