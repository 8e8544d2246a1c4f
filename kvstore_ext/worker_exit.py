"""How a worker of a distributed job ends when something goes wrong: at once.

Why this exists: after a normal interpreter exit, ps-lite's shutdown waits at a
barrier for the other workers, who wait for this worker's next push, so the whole job
hangs instead of failing (measured). Exiting with ``os._exit`` skips that barrier; the
launcher then sees the non-zero exit and stops every node.

One place for it, used by the transport and by the training scripts alike. Imports
nothing but the standard library (safe anywhere, servers included).
"""
import os
import sys

_MARK = '_kvstore_ext_worker_exit'


def exit_now(code):
    """Flush stdout and stderr, then end this process at once with ``code``
    (``os._exit``: no atexit handlers, no ps-lite shutdown barrier)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def exit_on_uncaught_exception():
    """Make an uncaught exception end this process at once with exit code 1.

    The traceback is printed first by the hook that was in place (Python's, or one a
    caller installed), then :func:`exit_now` ends the process. Idempotent: calling it
    again keeps the one hook already installed.
    """
    previous = sys.excepthook
    if getattr(previous, _MARK, False):
        return

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        exit_now(1)

    setattr(hook, _MARK, True)
    sys.excepthook = hook
