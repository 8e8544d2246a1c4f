"""Workers agree on a key's configuration before anything of the key travels.

Why: a worker configured differently from the others fails silently or far away.
With another ``fc_scale`` the replicas' weights drift apart with no message; with
another ``size_threshold`` or ``aggregation``, or a gradient of another shape, the
workers push arrays of different shapes under one server key and the server dies of
SIGABRT (``operands shape mismatch``), naming neither key nor parameter; with another
scheme type the rounds no longer pair up and the job hangs. So at a key's first
round (``init``/``broadcast``, or its first ``pushpull``/``push``; and the store's
first planned key again then, when the parameters can no longer change) every worker
contributes its *fingerprint* of the key: the kvstore type, the key, its shape and dtype, and each of the scheme's
parameters. On a mismatch every worker raises the same
:class:`ConfigurationMismatchError`, naming the key, what differs and which ranks
hold which value, before anything whose shape depends on the configuration is sent.

How: one ``Sum`` round (rounds.py) of ``num_workers * WORDS`` float32 values, the same
shape whatever the configuration, under a key no user key can be (a tuple, as
``planning.settle``'s). Worker ``r`` fills slot ``r`` and leaves the others zero, so the
sum is every worker's slot side by side. Each word is a whole number below 2**24
(exact in float32; the stock server sums floats only), or a parameter's value as a
float32 (x + 0 = x, exact too) for the message: text is packed 3 bytes a word, and
what must compare exactly is also hashed (CRC-32 cut to 24 bits). It costs one small
round per key, once (the first key planned twice if ``init``/``broadcast`` declared it:
the parameters may change until the first step, planning.agree_due), never per step;
its bytes are not in ``comm_stats`` (which counts what the steps move). A job of one
worker has no one to disagree with and skips it.
"""
import json
import math
import zlib

import numpy as np

ROUND_KEY = ('__kvstore__', 'fingerprint')   # no user key is a tuple (store._check_key)

TYPE_WORDS = 11         # the kvstore type's name, 33 bytes
KEY_WORDS = 8           # repr(key), 24 bytes shown (its hash compares all of it)
DTYPE_WORDS = 3
MAX_DIMS = 8            # dims shown
MAX_PARAMS = 32         # parameters named one by one (tests/test_fingerprint.py: enough)
NONE = float('nan')     # the value word of an optional parameter left unset

# (field, words): one slot's layout
_LAYOUT = [('format', 1), ('type', TYPE_WORDS), ('key_hash', 1), ('key', KEY_WORDS),
           ('shape_hash', 1), ('ndim', 1), ('dims', MAX_DIMS), ('dtype', DTYPE_WORDS),
           ('params_hash', 1), ('param_hashes', MAX_PARAMS), ('param_values', MAX_PARAMS)]
_OFFSET = {}
WORDS = 0
for _name, _words in _LAYOUT:
    _OFFSET[_name] = (WORDS, WORDS + _words)
    WORDS += _words
FORMAT = 1.0


class ConfigurationMismatchError(ValueError):
    """The workers disagree on a key's configuration (kvstore type, key, shape, dtype
    or a scheme parameter); raised on every worker, with the same message."""


def _hash(text):
    """A whole number below 2**24 (exact in float32)."""
    return float(zlib.crc32(text.encode('utf-8')) & 0xFFFFFF)


def _pack(text, words):
    """``text``'s first ``3 * words`` bytes (UTF-8), 3 a word (below 2**24)."""
    data = text.encode('utf-8')[:3 * words].ljust(3 * words, b'\0')
    return [float(int.from_bytes(data[i:i + 3], 'big')) for i in range(0, 3 * words, 3)]


def _unpack(values):
    data = b''.join(int(v).to_bytes(3, 'big') for v in values)
    return data.rstrip(b'\0').decode('utf-8', 'replace')


def _value_word(param, value):
    """A parameter's value as one float32 for the message: a choice by its index."""
    if value is None:
        return NONE
    if param is not None and param.kind == 'str':
        choices = list(param.choices)       # a tuple, or a lazy collection (dad's)
        return float(choices.index(value)) if value in choices else -1.0
    if isinstance(value, str):
        return -1.0         # undeclared: the parameter's hash word still tells it apart
    return float(value)


def _show_value(param, word):
    if math.isnan(word):
        return 'None'
    if param is not None and param.kind == 'str':
        index, choices = int(word), list(param.choices)
        return repr(choices[index]) if 0 <= index < len(choices) else '?'
    if param is not None and param.kind == 'int':
        return '%d' % word
    return repr(float('%.7g' % word))


def slot(kind, key, shape, dtype, params, spec):
    """This worker's fingerprint of ``key``: ``WORDS`` float32 values.

    ``kind``: the kvstore type; ``params``: the scheme's parameters (name -> value);
    ``spec``: their declarations (name -> params.Param), for the value words."""
    names = sorted(params)
    words = [FORMAT] + _pack(kind, TYPE_WORDS) + [_hash(repr(key))] + _pack(repr(key), KEY_WORDS)
    dims = [float(d) for d in shape[:MAX_DIMS]] + [0.0] * (MAX_DIMS - len(shape[:MAX_DIMS]))
    words += [_hash(repr(tuple(int(d) for d in shape))), float(len(shape))] + dims
    words += _pack(np.dtype(dtype).name, DTYPE_WORDS)
    words.append(_hash(json.dumps(params, sort_keys=True, default=repr)))
    shown = names[:MAX_PARAMS]
    words += [_hash('%s=%r' % (n, params[n])) for n in shown] + [0.0] * (MAX_PARAMS - len(shown))
    words += [_value_word(spec.get(n), params[n]) for n in shown] + \
        [0.0] * (MAX_PARAMS - len(shown))
    assert len(words) == WORDS
    return np.array(words, dtype=np.float32)


def _field(rows, name):
    start, end = _OFFSET[name]
    return rows[:, start:end]


def _same(column):
    """True if every worker's words agree (NaN equals NaN: an unset parameter)."""
    first = column[0]
    return all(np.array_equal(c, first, equal_nan=True) for c in column[1:])


def _by_value(shown):
    """'rank 0 has A; ranks 1, 2 have B' from each rank's shown value, in rank order."""
    groups = {}
    for rank, text in enumerate(shown):
        groups.setdefault(text, []).append(rank)
    return '; '.join('%s %s %s %s' % ('rank' if len(ranks) == 1 else 'ranks',
                                      ', '.join(map(str, ranks)),
                                      'has' if len(ranks) == 1 else 'have', text)
                     for text, ranks in groups.items())


def compare(rows, key, params, spec):
    """The mismatch message for the workers' fingerprints ``rows`` (one row a rank, as
    summed), or None if they agree. Built from ``rows`` alone (and the parameter
    names, the same on every worker once the types agree), so that every worker
    raises the same message."""
    rows = np.asarray(rows, dtype=np.float32)
    if not _same(_field(rows, 'format')):
        return ('key %r: the workers\' fingerprints have different formats (%s): run the '
                'same kvstore_ext everywhere'
                % (key, _by_value(['%g' % r[0] for r in _field(rows, 'format')])))
    if not _same(_field(rows, 'type')):
        return ('key %r: the workers created different kvstore types: %s; every worker must '
                'create the same type' % (key, _by_value(
                    [_unpack(r) for r in _field(rows, 'type')])))
    if not _same(_field(rows, 'key_hash')):
        return ('the workers reached different keys at the same point: %s; every worker '
                'must declare and push its keys in the same order' % _by_value(
                    [_unpack(r) for r in _field(rows, 'key')]))
    differs = []
    if not (_same(_field(rows, 'shape_hash')) and _same(_field(rows, 'ndim'))
            and _same(_field(rows, 'dims'))):
        differs.append('shape: %s' % _by_value([_show_shape(r) for r in rows]))
    if not _same(_field(rows, 'dtype')):
        differs.append('dtype: %s' % _by_value([_unpack(r) for r in _field(rows, 'dtype')]))
    names = sorted(params)[:MAX_PARAMS]
    hashes, values = _field(rows, 'param_hashes'), _field(rows, 'param_values')
    for index, name in enumerate(names):
        if not (_same(hashes[:, index]) and _same(values[:, index])):
            differs.append('parameter %s: %s' % (name, _by_value(
                [_show_value(spec.get(name), v) for v in values[:, index]])))
    if not differs and not _same(_field(rows, 'params_hash')):
        differs.append('the scheme\'s parameters (beyond the %d named here): set the same '
                       'compression_params on every worker' % MAX_PARAMS)
    if not differs:
        return None
    return ('key %r: the workers are configured differently (%s); every worker must use '
            'the same shapes and compression_params' % (key, '; '.join(differs)))


def _show_shape(row):
    ndim = int(row[_OFFSET['ndim'][0]])
    dims = [int(d) for d in row[_OFFSET['dims'][0]:_OFFSET['dims'][1]]][:ndim]
    return '(%s%s)' % (', '.join(map(str, dims)) + (',' if ndim == 1 else ''),
                       ', ...' if ndim > MAX_DIMS else '')


def agree(transport, kind, key, shape, dtype, params, spec):
    """Exchange this worker's fingerprint of ``key`` with every worker's (one Sum
    round) and raise :class:`ConfigurationMismatchError` if any differs. Every worker
    must call it at the same point (the store does: at a key's init/broadcast and
    first step), whatever its configuration."""
    if transport.num_workers == 1:
        return
    from mxnet import ndarray
    from .rounds import Sum
    words = np.zeros((transport.num_workers, WORDS), dtype=np.float32)
    words[transport.rank] = slot(kind, key, shape, dtype, params, spec)
    results, _, _ = transport.exchange(
        ROUND_KEY, [(0, Sum('fingerprint', ndarray.array(words.reshape((-1,)),
                                                         dtype=np.float32)))])
    rows = results[0].asnumpy().reshape((transport.num_workers, WORDS))
    message = compare(rows, key, params, spec)
    if message is not None:
        raise ConfigurationMismatchError(message)
