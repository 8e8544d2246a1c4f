"""Reading a compression state file (what ``save_compression_state`` writes), every
part checked before any of it is used.

Why: a state file is read once, at a resume, and its mistakes used to surface far from
their cause: a list-format file, a file without its metadata, bad JSON in the metadata
or a corrupt body after valid magic bytes raised TypeError, KeyError, JSONDecodeError
or a C++ ``vector::_M_default_append``, and a residual holding NaN loaded without
complaint and then voided its key at every step (an encoder refuses a non-finite
``grad + residual``). Now each kind raises one ValueError that names the file and what
is wrong, and nothing is loaded on refusal: ``read`` checks the whole file, ``rebuild``
makes the scheme and counters it describes aside, and only then does the store
replace its own (store.py ``load_compression_state``).
"""
import json
import os

import numpy as np

from .memory import split_name

META = '__meta__'
COUNTERS = ('raw_bytes', 'push_bytes', 'pull_bytes')


def _bad(fname, what):
    return ValueError('compression state file %r: %s' % (fname, what))


def read(fname):
    """(metadata dict, {name: NDArray} of per-key state) of ``fname``, checked."""
    from mxnet import ndarray
    from mxnet.base import MXNetError
    if not os.path.isfile(fname):
        raise FileNotFoundError('compression state file %r does not exist' % (fname,))
    try:
        arrays = ndarray.load(fname)
    except MXNetError as e:
        reason = [line for line in str(e).splitlines() if 'Error' in line or 'Check' in line]
        raise _bad(fname, 'MXNet cannot read it: not an NDArray file, or cut short or '
                          'corrupt (%s)' % (reason[-1].strip() if reason else 'unreadable'))
    if not isinstance(arrays, dict):
        raise _bad(fname, 'holds an unnamed list of %d arrays, not the named arrays '
                          'save_compression_state writes' % len(arrays))
    arrays = dict(arrays)
    if META not in arrays:
        raise _bad(fname, "has no %r entry (type, rank, parameters): not written by "
                          "save_compression_state" % META)
    meta = _meta(fname, arrays.pop(META))
    for name, array in arrays.items():
        key = _key(fname, name)
        values = array.asnumpy()
        if values.dtype.kind == 'f' and not np.isfinite(values).all():
            raise _bad(fname, 'state %r of key %r holds non-finite values (NaN or Inf); '
                              'restored, it would void the key at every step'
                       % (split_name(name)[0], key))
    return meta, arrays


def _meta(fname, array):
    """The metadata entry, decoded and checked field by field."""
    if array.dtype != np.uint8 or array.ndim != 1:
        raise _bad(fname, '%r is not a byte string (%s %s)' % (META, array.dtype, array.shape))
    try:
        meta = json.loads(array.asnumpy().tobytes().decode('utf-8'))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(fname, '%r is not valid JSON (%s)' % (META, e))
    if not isinstance(meta, dict):
        raise _bad(fname, '%r is not a JSON object' % META)
    for field, kind, what in (('type', str, 'a string'), ('rank', int, 'an integer'),
                              ('params', dict, 'an object'), ('stats', dict, 'an object')):
        value = meta.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _bad(fname, '%r field %r is %s' % (
                META, field, 'missing' if field not in meta else '%r, not %s' % (value, what)))
    if not isinstance(meta.get('scheme'), (dict, type(None))):
        raise _bad(fname, "%r field 'scheme' is %r, not an object" % (META, meta['scheme']))
    stats = meta['stats']
    pushes = stats.get('pushes')
    counts = [stats.get(name) for name in COUNTERS] + \
        (list(pushes.values()) if isinstance(pushes, dict) else [None])
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        raise _bad(fname, "%r field 'stats' needs counters %s and 'pushes' (per key) that "
                          "are whole numbers >= 0, got %r" % (META, ', '.join(COUNTERS), stats))
    for key in pushes:
        _file_key(fname, key, "'stats'")
    return meta


def _file_key(fname, key, where):
    """A key as memory.file_key spells it: 'i:<int>' or 's:<str>'."""
    kind, sep, rest = key.partition(':')
    if not sep or kind not in ('i', 's') or (kind == 'i' and not _is_int(rest)):
        raise _bad(fname, '%s names key %r, not one written by save_compression_state '
                          "('i:<int>' or 's:<str>')" % (where, key))
    return int(rest) if kind == 'i' else rest


def _is_int(text):
    try:
        int(text)
        return True
    except ValueError:
        return False


def _key(fname, name):
    return _file_key(fname, split_name(name)[1], 'array %r' % name)


def rebuild(fname, meta, scheme_class):
    """(scheme, CommStats) as the file describes them, made aside: its parameters
    validated as ``set_gradient_compression`` validates them."""
    from .stats import CommStats
    try:
        scheme = scheme_class(**meta['params'])
        scheme.restore(meta.get('scheme'))
        stats = CommStats()
        stats.restore(meta['stats'])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise _bad(fname, 'its parameters or scheme state do not fit %s: %s: %s'
                   % (scheme_class.name, type(e).__name__, e))
    return scheme, stats
