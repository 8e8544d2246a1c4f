"""Per-tensor codecs wrapping the C++ kernels: every module in this package is imported
here and the codec classes it defines are exported, so a new codec is a new module: no
list to edit. Defining a server-decoded codec class also enters it in the codec list
(kvstore_ext/codec_list.py)."""
import importlib
import inspect
import pkgutil

from .base import Codec, GatherCodec


def _discover():
    found = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module('%s.%s' % (__name__, module_info.name))
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Codec) and cls.__module__ == module.__name__:
                found[name] = cls
    return found


_FOUND = _discover()
globals().update(_FOUND)
from .momentum import HighRateMasking  # noqa: E402  (not a codec: Hylo's masking rule)

__all__ = ['Codec', 'GatherCodec', 'HighRateMasking'] + sorted(_FOUND)
