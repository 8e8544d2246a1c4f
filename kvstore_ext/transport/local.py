"""Single-process transport: this process is rank 0 of 1 and the 'server' is a call.

Nothing is skipped: each chunk is encoded and its payload decoded by the same code
the parameter servers run (aggregate.decode_sum), or, for additive codecs, summed
over one worker and decoded, so every codec path runs without ps-lite.
"""
import numpy as np

from ..agreement import settled
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

    def pushpull_plain(self, key, chunks, values, outs):
        """Uncompressed float32: the sum over devices (and one worker); no chunks
        needed, nothing travels."""
        total = values[0].copy() if len(values) > 1 else values[0]
        for v in values[1:]:
            total += v.as_in_context(total.context)
        for o in outs:
            if o.handle.value != total.handle.value:
                total.copyto(o)
        return total.size * 4, total.size * 4

    def pushpull(self, key, chunks, grad, residual, agreements):
        """(float32 sum over workers, bytes pushed, bytes pulled) of one step."""
        parts, pushed, pulled = [], 0, 0
        for chunk, agreement in zip(chunks, agreements):
            codec = chunk.codec
            g = chunk.view(grad)
            r = chunk.view(residual) if residual is not None else None
            if codec.additive:
                words = 0
                if agreement is not None and agreement.needs_round():
                    agreement.agreed_by_round(agreement.contribution(g, r))
                    words += agreement.words
                params = settled(codec, agreement, 1)
                payload = codec.encode_sum(g, r, 1, params)
                parts.append(codec.decode_sum(payload, 1, params))
                if agreement is not None and agreement.tail_words:
                    agreement.agreed_by_previous(agreement.contribution(g, r))
                    words += agreement.tail_words
                size = payload.size * np.dtype(payload.dtype).itemsize + 4 * words
                pushed, pulled = pushed + size, pulled + size
            else:
                payload = codec.encode(g, r)
                parts.append(decode_sum([payload], codec.shape))
                pushed += payload.size * 4
                pulled += codec.size * 4    # what a server-decode pull brings: float32
        return assemble(chunks, parts, grad.shape), pushed, pulled
