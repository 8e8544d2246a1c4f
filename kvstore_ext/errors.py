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
}


class NonFiniteGradientError(FloatingPointError):
    """A gradient holds NaN or Inf.

    Raised before anything is sent: the residual (error-feedback memory) and the
    weights are untouched, so training can skip the batch and go on in one process.
    In a distributed job the other workers wait for this worker's push, so there it
    ends the job (the launcher stops every node).
    """


class PayloadError(ValueError):
    """A received payload failed validation; it was not used."""


def status_message(status):
    return STATUS_MESSAGES.get(int(status), 'unknown status %d' % int(status))
