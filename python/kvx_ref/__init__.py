"""NumPy reference models of kvstore_ext's codecs and wire format (the executable spec)."""
from . import wire, codecs  # noqa: F401
