"""NumPy's BLAS held to one thread while the store's own host linear algebra runs.

Why: NumPy's bundled OpenBLAS hands a large product (dAD's gradient check, a
matrix-vector product over a Dense weight, every step) to its worker threads, which
then wait for the next one by spinning on ``sched_yield``: a fifth of a
``dist_sync_dad`` job's CPU on the 2-core machines (``perf``, printed). A yielding
thread gives way to any runnable one, so the step did not get faster there
(docs/RESULTS.md), but the cores stayed busy for nothing: other programs, and a host's
other jobs, could not have them. These products are small or memory-bound: one thread
loses nothing. The limit is put back afterwards, so the user's own NumPy keeps its
threads.

Found through the libraries the process has loaded (``/proc/self/maps``): the
OpenBLAS of NumPy's wheels lies beside NumPy and names its functions with a ``64_``
suffix. Where none is found (a NumPy built on another BLAS, another OS),
``one_thread`` does nothing.
"""
import contextlib
import ctypes
import functools
import os
import threading

_NAMES = (('openblas_get_num_threads64_', 'openblas_set_num_threads64_'),
          ('openblas_get_num_threads', 'openblas_set_num_threads'))
_controls = None
_lock = threading.Lock()
_held = {'depth': 0, 'before': []}     # blocks open (any thread), the counts to restore


def _find_controls(numpy_dir):
    """[(get, set)] of the OpenBLAS NumPy's wheel installed beside it (``numpy.libs``)
    and this process has loaded; MXNet's, SciPy's and OpenCV's own are left alone."""
    paths = set()
    try:
        with open('/proc/self/maps') as maps:
            for line in maps:
                fields = line.split()
                path = fields[-1] if len(fields) >= 6 else ''
                if (path.startswith(numpy_dir)
                        and 'openblas' in os.path.basename(path).lower()):
                    paths.add(path)
    except OSError:
        return []
    controls = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in _NAMES:
            get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                controls.append((get, set_))
                break
    return controls


def controls():
    """The (get, set) thread-count functions found, looked up once (NumPy must be
    imported first: its BLAS loads with it)."""
    global _controls
    if _controls is None:
        import numpy      # loads its BLAS
        _controls = _find_controls(os.path.dirname(os.path.abspath(numpy.__file__)))
    return _controls


@contextlib.contextmanager
def one_thread():
    """Within the block, NumPy's OpenBLAS computes on the calling thread alone."""
    found = controls()
    if not found:
        yield
        return
    with _lock:
        if _held['depth'] == 0:
            _held['before'] = [get() for get, _ in found]
            for _, set_ in found:
                set_(1)
        _held['depth'] += 1
    try:
        yield
    finally:
        with _lock:
            _held['depth'] -= 1
            if _held['depth'] == 0:
                for (_, set_), count in zip(found, _held['before']):
                    set_(count)


def single_threaded(function):
    """``function`` run inside ``one_thread()``."""
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with one_thread():
            return function(*args, **kwargs)
    return wrapped
