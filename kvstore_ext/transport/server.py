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

The servers' residuals are state (``pull='compressed'``): checkpoints save and restore
them. MXNet's servers take one kind of command, ``set_optimizer`` (an unpickled
object), so commands travel as aggregators: a new aggregator arriving at a server
takes over the running one's state (every worker sends one, in any order), and one
built with ``command=('save', directory)`` also writes every residual of the server's
keys to ``directory/<key name>.nd`` (a key's name: its number in the workers' order of
making keys, which does not depend on the number of servers); one built with
``restore=directory`` gives a key the residual saved there when the key first appears.

Server processes import this while ``mxnet`` is only partly imported: only explicit
submodule imports here (no ``mx.nd``).
"""
import importlib
import logging
import os

import numpy as np
from mxnet.optimizer import Optimizer

from ..replies import REPLY_WORDS, parse_reply_row, reencode
from .. import codec_list, py_decode
from ..errors import VOID, PayloadError, status_message
from ..wire import FP32

log = logging.getLogger('kvstore_ext.server')
# a Gather key's last row: the reply request (aggregate.py), a slot's rows, the key's name
LAST_ROW_WORDS = REPLY_WORDS + 2
_RUNNING = []            # in a server process: the aggregator in use (one at most)


class _GatherKey:
    """A Gather key as its last row describes it (transport/ps.py writes it): the
    reply request, the rows of a worker's slot, and the key's name (its number in the
    workers' order of making keys, the same whatever the number of servers: saved
    residuals are named by it). ``buffer`` holds the key's rows as the workers pull
    them: the sum (or its re-encoding) in the first rows, decoded into in place, and
    the last row, written once; ``residual``: the compressed reply's error feedback."""

    def __init__(self, weight, num_workers):
        from mxnet import ndarray
        rows, width = weight.shape
        row = weight.data[rows - 1].copy()
        words = row.asnumpy()
        self.request = parse_reply_row(words)
        if width < LAST_ROW_WORDS:
            raise PayloadError('key rows of %d words: no room for the last row' % width)
        self.slot_rows, self.name = int(words[REPLY_WORDS]), int(words[REPLY_WORDS + 1])
        if not 0 < self.slot_rows * num_workers < rows:
            raise PayloadError('key of %d rows: no slots of %d rows for %d workers'
                               % (rows, self.slot_rows, num_workers))
        self.residual = None
        self.buffer = ndarray.zeros((rows, width), dtype=np.float32)
        self.buffer[rows - 1] = row


class ServerAggregator(Optimizer):
    """Decode-and-sum for server-decode keys, plain sum for the others."""

    def __init__(self, num_workers, restore=None, command=None):
        super().__init__()
        self.num_workers = int(num_workers)
        self.restore = restore       # directory of saved server residuals, or None
        self.command = command       # ('save', directory) or None
        # the modules of codecs decoded in NumPy (codec_list.py): imported at the server
        self.codec_modules = codec_list.python_decoded_modules()
        self._all_rows = {}      # key shape -> row_sparse ones on every row (_store)
        self._replies = {}       # key -> _GatherKey
        self._statuses = {}      # key -> statuses of its last round, read at the next

    def __setstate__(self, state):
        """Unpickled at a server: take over the running aggregator's keys, then run
        the command this one carries."""
        self.__dict__.update(state)
        for module in self.__dict__.get('codec_modules', ()):
            importlib.import_module(module)
        if _RUNNING:
            running = _RUNNING[0]
            for name in ('_all_rows', '_replies', '_statuses'):
                setattr(self, name, getattr(running, name))
            self.restore = self.restore or running.restore
        _RUNNING[:] = [self]
        command, self.command = self.command, None
        if command is not None and command[0] == 'save':
            self.save_residuals(command[1])

    def save_residuals(self, directory):
        """Every residual of this server's keys, one file a key (server keys are
        unique across servers)."""
        from mxnet import ndarray
        kept = {known.name: known.residual for known in self._replies.values()
                if known.residual is not None}
        if kept:
            os.makedirs(directory, exist_ok=True)
        for name, residual in kept.items():
            residual.wait_to_read()     # the last round's re-encode has updated it
            ndarray.save(os.path.join(directory, '%d.nd' % name), [residual])
        log.info('saved the residuals of %d keys to %s', len(kept), directory)

    def _restored_residual(self, index, name, size):
        """The residual a checkpoint saved for key ``index`` (file ``name``.nd), if
        any."""
        if not self.restore:
            return None
        path = os.path.join(self.restore, '%d.nd' % name)
        if not os.path.exists(path):
            # a cluster without a shared file system, servers moved (docs/LAUNCH.md)
            log.warning('key %s: no saved server residual %s on this server; the key '
                        'starts from a zero residual', index, path)
            return None
        from mxnet import ndarray
        residual = ndarray.load(path)[0]
        if residual.shape != (size,):
            raise PayloadError('key %s: the saved server residual %s holds %s floats, the '
                               'key %d' % (index, path, residual.shape, size))
        return residual

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        if weight.stype != 'row_sparse':
            grad.copyto(weight)
            return
        rows, width = weight.shape
        try:
            buffer = self._gather(index, weight, grad)
        except Exception as err:  # noqa: BLE001  a server must outlive any payload
            # (MXNet ignores an exception in an updater and would leave the key's old
            # value for the workers to pull: NaN tells them the round failed)
            log.error('key %s: payload rejected, result set to NaN: %s', index, err)
            buffer = self._nan_rows(rows, width)
        self._store(weight, buffer)

    def _gather(self, index, weight, grad):
        """The key's rows for this round: the decoded sum (or its re-encoding) and the
        reply row."""
        self._report(index)
        rows, width = weight.shape
        capacity = (rows - 1) * width
        known = self._reply(index, weight)
        request, residual, buffer = known.request, known.residual, known.buffer
        total = buffer.reshape((-1,))[:capacity]
        status = self._decode_slots(grad, known.slot_rows, capacity, total)
        if request[0] == FP32:
            # the float32 sum is the reply: nothing here waits for the decode (the
            # statuses are read at the key's next round), so the server goes on to the
            # next key's pushes while the engine decodes
            self._statuses[index] = status
        else:
            self._reencode(index, status, total, residual, request)
        return buffer

    def _report(self, index):
        """Log the statuses of the key's previous round (decoded by now): a malformed
        payload (its sum was NaN, C++ decode_slots) or a void one (a worker's NaN)."""
        status = self._statuses.pop(index, None)
        if status is None:
            return
        codes = status.asnumpy()
        if codes.any():
            self._log_statuses(index, codes, 'the previous round')

    @staticmethod
    def _log_statuses(index, codes, which):
        voided = [w for w, code in enumerate(codes) if code == VOID]
        if voided:
            log.info('key %s: worker(s) %s voided %s (non-finite gradient); its sum was '
                     'NaN', index, voided, which)
        for worker, code in enumerate(codes):
            if code and code != VOID:
                log.error('key %s: payload of worker %d rejected in %s, its sum was NaN: '
                          '%s', index, worker, which, status_message(int(code)))

    def _reencode(self, index, status, total, residual, request):
        """A compressed reply: the sum re-encoded with the server's residual (this
        waits for the decode). A void or malformed round leaves NaN rows, which the
        workers decode as void, and the residual as it was."""
        codes = status.asnumpy()
        if codes.any():
            self._log_statuses(index, codes, 'this round')
            return
        payload = reencode(total, residual, request)
        total[:] = 0
        total[:payload.size] = payload

    update_multi_precision = update

    def _reply(self, index, weight):
        """What the key's last row says (a _GatherKey), read once."""
        known = self._replies.get(index)
        if known is None:
            known = self._replies[index] = _GatherKey(weight, self.num_workers)
            if known.request[0] != FP32:
                known.residual = self._restored_residual(index, known.name,
                                                         known.request[1])
                if known.residual is None:
                    from mxnet import ndarray
                    known.residual = ndarray.zeros((known.request[1],), dtype=np.float32)
        return known

    def _decode_slots(self, grad, slot_rows, capacity, out):
        """Decode and sum the payloads in ``grad``'s worker slots (``slot_rows`` rows
        each, first rows first) into ``out`` (``capacity`` floats) with one C++ op
        (kernels.h: decode_slots, which leaves NaN in ``out`` if a slot is void or
        malformed); returns the per-worker statuses, unread. Engine ops only
        (``kvx_rows_dense`` reads the slots' rows alone, not ``grad.data``, which copies
        synchronously, nor ``cast_storage``, which zero-fills the whole key first), so
        that the server goes on to the next request while its engine decodes. A worker
        that pushed rows outside its slot corrupts at most the slots it wrote into; one
        that pushed none leaves its slot zero, which decodes as malformed."""
        from mxnet import ndarray
        from ..ops import op
        width = grad.shape[1]
        slots = op('kvx_rows_dense')(grad, size=slot_rows * self.num_workers * width)
        slots = slots.reshape((self.num_workers, -1))
        if py_decode.wanted(slots):
            total, status = py_decode.decode_slots(slots.asnumpy(), capacity)
            out[:] = total
            return ndarray.array(status, dtype=np.float32)
        status = ndarray.empty((self.num_workers,), dtype=np.float32)
        op('kvx_decode_slots')(slots, size=capacity, out=[out, status])
        return status

    def _nan_rows(self, rows, width):
        from mxnet import ndarray
        return ndarray.full((rows, width), np.nan, dtype=np.float32)

    def _store(self, weight, total):
        """Replace the row_sparse ``weight`` by ``total`` with every row present (the
        server's pull handler reads rows by position): ones on every row times
        ``total``, one engine op (exact, as in the workers' push)."""
        from mxnet.ndarray import sparse
        ones = self._all_rows.get(weight.shape)
        if ones is None:
            from mxnet import ndarray
            rows, width = weight.shape
            ones = self._all_rows[weight.shape] = sparse.row_sparse_array(
                (ndarray.ones((rows, width), dtype=np.float32),
                 ndarray.arange(rows, dtype='int64')), shape=weight.shape)
        sparse.elemwise_mul(ones, total, out=weight)
