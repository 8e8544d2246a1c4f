"""Errors a user can act on, and the meaning of the C++ kernels' status codes."""

# status codes of the C++ kernels and their messages: the library's table (cpp/wire.cc,
# kvx_status_name); tests/test_cpp_ops.py holds this copy equal to it
STATUS_MESSAGES = {
    0: 'ok',
    1: 'non-finite values (NaN or Inf)',
    2: 'bad magic number (not a kvstore_ext payload)',
    3: 'unsupported payload version',
    4: 'payload of another codec',
    5: 'size mismatch between payload and tensor',
    6: 'invalid codec parameter',
    7: 'invalid filter index',
    8: 'invalid packed word',
    9: "void contribution (the worker's gradient was non-finite)",
}
NONFINITE = 1
VOID = 9


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or Inf: what a codec's encoder raises, before it changes
    any state. The store catches it and voids the key's step
    (``void_steps.void_step``): every worker's sum is NaN, this worker's residual is unchanged,
    and the caller skips the step as it would with dist_sync. ``pushpull`` does not
    raise it. (A codec with ``deferred_checks`` does not raise it either: its encoder
    pushes a void payload, with the same outcome, and the store logs it a step later:
    ``void_steps.deferred_step``.)"""


class PayloadError(ValueError):
    """A received payload failed validation; it was not used."""


def status_message(status):
    return STATUS_MESSAGES.get(int(status), 'unknown status %d' % int(status))
