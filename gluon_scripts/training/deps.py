"""The scripts' optional packages (gluoncv, mlxtend), which ``pip install .`` does not
bring: a missing one is a one-line error that names the extra to install, not a
``ModuleNotFoundError`` traceback."""
import importlib

from .errors import UsageError

INSTALL_HINT = "pip install '.[scripts]'"


def require(module, purpose):
    """``import module``, or a UsageError that says what needs it and how to install
    it (also when the package is there but one of its own dependencies is not)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top, missing = module.split('.')[0], (e.name or '?').split('.')[0]
        what = repr(top) if missing == top else '%r (missing: %r)' % (top, missing)
        raise UsageError('%s needs the Python package %s: install the training scripts\' '
                         'dependencies with %s in the repository (or pip install -r '
                         'requirements.txt)' % (purpose, what, INSTALL_HINT))


def require_or_exit(module, purpose):
    """``require``, with the error reported as a one-line ``error: ...`` (exit code 2)."""
    from .errors import fail
    try:
        return require(module, purpose)
    except UsageError as e:
        fail(str(e))
