"""Single-process transport: this process is rank 0 of 1 and the 'server' is a call.

Nothing is skipped: each chunk is encoded and its payload decoded by the same code
the parameter servers run (aggregate.decode_sum), or, for additive codecs, summed
over one worker and decoded, so every codec path runs without ps-lite.
"""
import numpy as np

from ..aggregate import decode_sum
from ..chunking import assemble


class LocalTransport:
    rank = 0
    num_workers = 1

    def configure(self, scheme):
        """Nothing to tell: there is no server."""

    def declare(self, key, chunks):
        """Nothing to lay out: payloads do not travel."""

    def broadcast(self, key, value):
        return value

    def pushpull_plain(self, key, values, outs):
        """Uncompressed float32 in one piece: the sum over devices (and one worker)."""
        total = values[0].copy() if len(values) > 1 else values[0]
        for v in values[1:]:
            total += v.as_in_context(total.context)
        for o in outs:
            if o.handle.value != total.handle.value:
                total.copyto(o)
        return total.size * 4, total.size * 4

    def pushpull(self, key, chunks, grad, residual):
        """(float32 sum over workers, bytes pushed, bytes pulled) of one step."""
        parts, traffic = [], 0
        for chunk in chunks:
            codec = chunk.codec
            g = chunk.view(grad)
            r = chunk.view(residual) if residual is not None else None
            if codec.additive:
                agreed = codec.agreement(g, r) if codec.agreement_words else None
                payload = codec.encode_sum(g, r, 1, agreed)
                parts.append(codec.decode_sum(payload, 1, agreed))
                traffic += payload.size * np.dtype(payload.dtype).itemsize
                traffic += 4 * codec.agreement_words
            else:
                payload = codec.encode(g, r)
                parts.append(decode_sum([payload], codec.shape))
                traffic += payload.size * 4
        pulled = sum(self._pulled_bytes(c.codec) for c in chunks)
        return assemble(chunks, parts, grad.shape), traffic, pulled

    @staticmethod
    def _pulled_bytes(codec):
        """What a worker would pull: the summed payload, or float32 after server decode."""
        if codec.additive:
            return codec.sum_words(1) * np.dtype(codec.sum_dtype).itemsize \
                + 4 * codec.agreement_words
        return codec.size * 4
