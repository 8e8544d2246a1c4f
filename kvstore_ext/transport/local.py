"""Single-process transport: this process is rank 0 of 1 and the 'server' is a call.

Nothing is skipped: a ``Gather`` payload is decoded by the same code the parameter
servers run (aggregate.decode_sum), and a ``Sum`` over one worker is the array itself,
so every codec's step runs without ps-lite.
"""
import numpy as np

from .. import rounds
from ..aggregate import decode_sum
from ..replies import reencode


def _sum(key, chunk, request):
    nbytes = request.array.size * np.dtype(request.array.dtype).itemsize
    return request.array, nbytes, nbytes


class LocalTransport:
    """Rank 0 of 1; keeps the 'servers'' residuals of compressed replies."""

    rank = 0
    num_workers = 1

    def __init__(self):
        self._server_residuals = {}     # (key, chunk, round name) -> NDArray
        self._round_kinds = {'sum': _sum, 'gather': self._gather}

    def _gather(self, key, chunk, request):
        """As the servers do: decode and sum, then re-encode for a compressed reply
        (with a residual kept per round, as a server keeps it per key)."""
        total = decode_sum([request.payload], (request.size,))
        pulled = request.size * 4
        if request.reply is not None and not rounds.is_void(request):
            from mxnet import ndarray
            slot = (key, chunk, request.name)
            residual = self._server_residuals.get(slot)
            if residual is None or residual.size != request.size:
                residual = self._server_residuals[slot] = ndarray.zeros(
                    (request.size,), dtype=np.float32)
            reply = reencode(total, residual, request.reply)
            total, pulled = decode_sum([reply], (request.size,)), reply.size * 4
        if request.out is not None:
            total.copyto(request.out)
            total = request.out
        return total, request.payload.size * 4, pulled

    def save_server_state(self, directory):
        """The 'servers'' residuals, one file each, in ``directory``."""
        import os
        from mxnet import ndarray
        from ..memory import file_key
        if self._server_residuals:
            os.makedirs(directory, exist_ok=True)
        for (key, chunk, name), residual in self._server_residuals.items():
            ndarray.save(os.path.join(directory, '%s.%d.%s.nd' % (file_key(key), chunk, name)),
                         [residual])

    def restore_server_state(self, directory):
        """What ``save_server_state`` wrote, if ``directory`` exists."""
        import os
        from mxnet import ndarray
        from ..memory import parse_file_key
        self._server_residuals = {}
        if not os.path.isdir(directory):
            return
        for entry in os.listdir(directory):
            key, chunk, name, _ = entry.rsplit('.', 3)
            self._server_residuals[(parse_file_key(key), int(chunk), name)] = \
                ndarray.load(os.path.join(directory, entry))[0]

    def broadcast(self, key, value):
        return value

    def exchange(self, key, requests):
        """(results, bytes pushed, bytes pulled) of one stage of rounds."""
        results, pushed, pulled = [], 0, 0
        for chunk, request in requests:
            result, up, down = self._round_kinds[request.kind](key, chunk, request)
            results.append(result)
            pushed, pulled = pushed + up, pulled + down
        return results, pushed, pulled

    def pushpull_plain(self, key, chunks, values, outs):
        """Uncompressed: the sum over devices (and one worker) in the arrays' dtype,
        as MXNet's local store sums; no chunks needed, nothing travels."""
        total = values[0].copy() if len(values) > 1 else values[0]
        for v in values[1:]:
            total += v.as_in_context(total.context)
        for o in outs:
            if o.handle.value != total.handle.value:
                total.copyto(o)
        nbytes = total.size * np.dtype(total.dtype).itemsize
        return nbytes, nbytes
