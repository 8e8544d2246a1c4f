"""Built-in schemes: every module in this package that defines a ``Scheme`` subclass
with a ``name`` contributes it, and ``import kvstore_ext`` registers each as the kvstore
type ``dist_sync_<name>`` (kvstore_ext/registry.py). A new scheme is a new module here:
no list to edit."""
import importlib
import inspect
import pkgutil

from .base import Scheme


def _discover():
    found = []
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module('%s.%s' % (__name__, module_info.name))
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Scheme) and cls.name and cls.__module__ == module.__name__:
                found.append(cls)
    return tuple(found)


BUILTIN = _discover()
globals().update({cls.__name__: cls for cls in BUILTIN})
__all__ = ['Scheme', 'BUILTIN'] + [cls.__name__ for cls in BUILTIN]
