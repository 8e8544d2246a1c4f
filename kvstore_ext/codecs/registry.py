"""Codec ids (header word 1) -> codec classes, so a receiver can decode any payload.

A new codec registers its id here through ``register_codec`` from its own module.
"""
from ..errors import PayloadError

_BY_ID = {}


def register_codec(codec_id, cls):
    if _BY_ID.get(codec_id, cls) is not cls:
        raise ValueError('codec id %d is taken by %s' % (codec_id, _BY_ID[codec_id].__name__))
    cls.codec_id = codec_id
    _BY_ID[codec_id] = cls
    return cls


def codec_class(codec_id):
    try:
        return _BY_ID[int(codec_id)]
    except (KeyError, ValueError, OverflowError):
        raise PayloadError('payload of unknown codec id %r' % (codec_id,)) from None
