"""Large tensors travel as chunks that each encode and decode on their own.

Why: a chunk is a kvstore key of its own on the parameter server, so chunks of one
large layer spread over all servers (no server is a hot spot), and MXNet never has
to slice a payload that must be decoded whole. The cut is made here, above the
transport, so a one-process run computes exactly what a distributed run computes.

Conv tensors are cut between filters (filter selection needs whole filters); others
are cut anywhere in their flattened form. Chunks of one tensor differ by at most one
row, so they cost the servers the same.
"""


class Chunk:
    """Rows [start, stop) of a tensor's ``codec.chunk_layout()``, with their codec."""

    def __init__(self, codec, start, stop, by_rows, whole):
        self.codec, self.start, self.stop = codec, start, stop
        self.by_rows, self.whole = by_rows, whole

    def view(self, array):
        """The chunk's part of ``array`` (a view: ops on it update ``array``)."""
        if self.whole:
            return array
        if self.by_rows:
            return array[self.start:self.stop]
        return array.reshape((-1,))[self.start:self.stop]


def split(codec, max_elements):
    """Chunks of at most ``max_elements`` elements (at least one row each)."""
    rows, row_len = codec.chunk_layout()
    per_chunk = max(1, max_elements // row_len)
    if rows <= per_chunk:
        return [Chunk(codec, 0, rows, codec.chunk_by_rows, True)]
    count = -(-rows // per_chunk)
    bounds = [rows * i // count for i in range(count + 1)]
    return [Chunk(codec.chunk(a, b), a, b, codec.chunk_by_rows, False)
            for a, b in zip(bounds[:-1], bounds[1:])]


def assemble(chunks, parts, shape, out=None):
    """The whole tensor from its chunks' float32 results, written into ``out`` (a
    float32 array of ``shape``) when a tensor of several chunks has one: no copy of
    the whole afterwards."""
    if len(chunks) == 1:
        return parts[0].reshape(shape)
    from mxnet import ndarray
    whole = out if out is not None else ndarray.empty(shape, dtype='float32')
    for chunk, part in zip(chunks, parts):
        view = chunk.view(whole)
        view[:] = part.reshape(view.shape)
    return whole
