"""User mistakes and how a script ends: a one-line ``error: ...`` with exit code 2
for a mistake, and, once this process is a worker of a running ps-lite job, a hard
exit (a normal one would hang in ps-lite's shutdown barrier; see
``kvstore_ext.worker_exit``)."""
import sys

_distributed = []     # non-empty once this process is a worker of a running ps-lite job


class UsageError(Exception):
    """A mistake of the user's (flags, paths): reported in one line, exit code 2."""


def mark_distributed():
    """This process now is a worker of a running ps-lite job: from here on every exit
    is immediate, an uncaught exception included."""
    from kvstore_ext.worker_exit import exit_on_uncaught_exception
    _distributed.append(True)
    exit_on_uncaught_exception()


def exit_script(code):
    """Exit; once distributed (``mark_distributed``), at once."""
    if _distributed:
        from kvstore_ext.worker_exit import exit_now
        exit_now(code)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def fail(message, code=2):
    """A clean error for the user (no traceback) and exit code 2."""
    sys.stderr.write('error: %s\n' % message)
    exit_script(code)
