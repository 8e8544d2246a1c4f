"""The server-decoded codecs, in one list: codec id -> the codec class that declares it.

Why one list: a server-decoded codec is known in several places (the header's codec
id, the payload's size for the servers' checks, how the servers decode it and how
they re-encode a sum for a compressed reply). Each used to be a table of its own,
restated by hand and held together by a test. Now a codec class says all of it
(``codecs/base.py``, ``Codec``), and defining the class enters it here:

* ``codec_id``: header word 1 (a float32 integer, unique);
* ``payload_words_of(n, a, b)``: the payload's length from the header (n elements,
  parameters a, b), -1 if a or b cannot be the codec's (as the C++ table's);
* ``server_reencode(total, residual, a, b, c)``: the servers' re-encoding of a sum for a
  compressed reply (``aggregate.py``), or None if the codec has none;
* ``server_decode(payload, n)``: None if the plugin's C++ table decodes the codec (its
  row is registered by the codec's own ``cpp/codecs/<name>.cc``), else a NumPy decoder
  ``(float32 array of n, status)`` that the servers run instead (``py_decode.py``).

The C++ table is checked against this list (``tests/test_cpp_ops.py``,
``test_wire_tables_agree``: ids, names, payload sizes), not restated. This module
imports nothing of the package, so that everything may import it.
"""

CODECS = {}          # codec id (float) -> codec class


def register(codec_class):
    """Enter ``codec_class`` (it defines ``codec_id``); ValueError if its id or name is
    another class's."""
    codec_id = float(codec_class.codec_id)
    if codec_id != int(codec_id) or not 0 < codec_id < 1 << 24:
        raise ValueError('%s: codec_id must be a positive integer below 2**24, got %r'
                         % (codec_class.__name__, codec_class.codec_id))
    known = CODECS.get(codec_id)
    if known is not None and known.__qualname__ != codec_class.__qualname__:
        raise ValueError('codec id %d is %s.%s already, not %s.%s'
                         % (codec_id, known.__module__, known.__qualname__,
                            codec_class.__module__, codec_class.__qualname__))
    for other in CODECS.values():
        if other.name == codec_class.name and float(other.codec_id) != codec_id:
            raise ValueError('codec name %r has id %d already (%s), not %d'
                             % (other.name, other.codec_id, other.__qualname__, codec_id))
    CODECS[codec_id] = codec_class
    return codec_class


def codec_ids():
    """{codec name: id} of every server-decoded codec."""
    return {cls.name: int(codec_id) for codec_id, cls in CODECS.items()}


def find(codec_id):
    """The codec class of ``codec_id``, or None."""
    try:
        return CODECS.get(float(codec_id))
    except (TypeError, ValueError):
        return None


def payload_words(codec_id, n, a, b):
    """Payload length of codec ``codec_id`` for n elements and header parameters a, b."""
    return find(codec_id).payload_words_of(n, a, b)


def python_decoded_modules():
    """The modules that define the codecs decoded in NumPy: the servers import them
    (transport/server.py), so that a codec defined outside the package is known there."""
    return sorted({cls.__module__ for cls in CODECS.values()
                   if cls.server_decode is not None})


def python_decoded():
    """{codec id: NumPy decoder} of the codecs the C++ table does not decode."""
    return {codec_id: cls.server_decode for codec_id, cls in CODECS.items()
            if cls.server_decode is not None}
