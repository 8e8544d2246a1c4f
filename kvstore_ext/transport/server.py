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
from ..codecs.registry import codec_class
from ..aggregate import header_size
from ..errors import PayloadError, status_message
from ..ops import op

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
        from mxnet import ndarray
        total = ndarray.zeros(weight.shape, dtype=np.float32)
        try:
            self._decode_slots(grad, total)
        except Exception as err:  # noqa: BLE001  a server must outlive any payload
            log.error('key %s: payload rejected, result set to NaN: %s', index, err)
            total[:] = np.nan
        self._store(weight, total)

    update_multi_precision = update

    def _decode_slots(self, grad, total):
        """Sum the payloads in ``grad``'s worker slots into the front of ``total``."""
        from mxnet import ndarray
        rows = grad.indices.asnumpy()
        if rows.size == 0 or rows.size % self.num_workers or \
                not np.array_equal(rows, np.arange(rows.size)):
            raise PayloadError('expected %d equal worker slots, got rows %s'
                               % (self.num_workers, rows[:8]))
        slots = grad.data.reshape((self.num_workers, -1))
        headers = ndarray.slice_axis(slots, axis=1, begin=0, end=HEADER_WORDS).asnumpy()
        if not (headers[1:, :5] == headers[0, :5]).all():
            raise PayloadError('workers sent payloads of different tensors or codecs')
        codec = codec_class(headers[0, 1])
        shape = codec.decode_shape(headers[0])
        if int(np.prod(shape)) > total.size:
            raise PayloadError('payload of %d elements for a key of %d'
                               % (int(np.prod(shape)), total.size))
        acc = total.reshape((-1,))[:int(np.prod(shape))].reshape(shape)
        statuses = []
        for worker in range(self.num_workers):
            try:
                length = header_size(headers[worker], slots.shape[1])
            except PayloadError as err:
                raise PayloadError('worker %d: %s' % (worker, err)) from None
            statuses.append(op(codec.decode_add_op)(slots[worker][:length], acc))
        codes = ndarray.concat(*statuses, dim=0).asnumpy()
        for worker, code in enumerate(codes):
            if code:
                raise PayloadError('worker %d: %s' % (worker, status_message(code)))

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
