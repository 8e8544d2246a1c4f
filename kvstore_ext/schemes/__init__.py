"""Built-in schemes. Each becomes the kvstore type ``dist_sync_<name>`` when
registered (kvstore_ext/registry.py)."""
from .base import Scheme  # noqa: F401
from .none import NoCompression
from .hylo import Hylo
from .twobit import TwoBit

BUILTIN = (NoCompression, Hylo, TwoBit)
