"""Counting the whole-array copies a store step makes (``copyto``, slice assignment), for
tests that a codec writing its sum into the output (``Codec.sums_into``) copies none."""
import mxnet as mx


def count_copies(monkeypatch, copies):
    """Until ``monkeypatch.undo()``, append to ``copies`` the shape of every copy into an
    array of more than one element (a chunked key's first values, set one by one by
    void_steps.deferred_step, do not count)."""
    copyto, setitem = mx.nd.NDArray.copyto, mx.nd.NDArray.__setitem__

    def counted_copyto(array, other):
        if isinstance(other, mx.nd.NDArray) and other.size > 1:
            copies.append(other.shape)
        return copyto(array, other)

    def counted_setitem(array, key, value):
        if array.size > 1:
            copies.append(array.shape)
        return setitem(array, key, value)
    monkeypatch.setattr(mx.nd.NDArray, 'copyto', counted_copyto)
    monkeypatch.setattr(mx.nd.NDArray, '__setitem__', counted_setitem)
