"""Typed, validated scheme parameters (what Gluon's ``compression_params`` sets).

Why not strings: BytePS passes parameters as whitespace-joined strings and finds
mistakes at run time, if at all. Here every key is declared with a type, a default
and a check, and a wrong key or value fails when the parameters are set. Numbers must
be finite: NaN and infinities are refused for every parameter.
"""
import math
import numbers


class Param:
    """One parameter: kind ('int', 'float', 'str'), default, allowed range or choices."""

    def __init__(self, kind, default, doc, low=None, high=None, low_open=False,
                 choices=None, optional=False):
        self.kind, self.default, self.doc = kind, default, doc
        self.low, self.high, self.low_open = low, high, low_open
        self.choices, self.optional = choices, optional

    def convert(self, name, value):
        if value is None and self.optional:
            return None
        if self.kind == 'str':
            if not isinstance(value, str) or value not in self.choices:
                raise ValueError('%s must be one of %s, got %r'
                                 % (name, ', '.join(map(repr, self.choices)), value))
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError('%s must be a number, got %r' % (name, value))
        if value != value:
            raise ValueError('%s must not be NaN' % name)
        if not math.isfinite(value):
            # no parameter means anything at infinity (a threshold of inf sends nothing,
            # a scale of inf voids every step): refused when set, not at the first step
            raise ValueError('%s must be finite, got %r' % (name, value))
        if self.kind == 'int':
            if int(value) != value:
                raise ValueError('%s must be a whole number, got %r' % (name, value))
            value = int(value)
        else:
            value = float(value)
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise ValueError('%s must be %s %s, got %r'
                             % (name, '>' if self.low_open else '>=', self.low, value))
        if self.high is not None and value > self.high:
            raise ValueError('%s must be <= %s, got %r' % (name, self.high, value))
        return value


def validate(spec, given, scheme_name):
    """Defaults overlaid with ``given``; unknown keys and bad values raise ValueError.
    (MXNet's ``'type'`` key names the kvstore's scheme: the store checks it, store.py.)"""
    given = dict(given or {})
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ValueError('unknown compression parameter(s) for %s: %s; known: %s'
                         % (scheme_name, ', '.join(unknown), ', '.join(sorted(spec))))
    out = {name: p.default for name, p in spec.items()}
    for name, value in given.items():
        out[name] = spec[name].convert(name, value)
    return out


def describe(spec):
    """One line per parameter, for --help texts and docs."""
    return '\n'.join('  %-16s %s (default %r)' % (name, p.doc, p.default)
                     for name, p in spec.items())


def as_params(compression_params, kvstore_type):
    """``compression_params`` as a new dict: a dict (any mapping) or None. A JSON string
    is refused, not parsed: MXNet's own kvstores take a dict only, so code that passed
    a string would break on switching to ``dist_sync``; one type works for both."""
    import collections.abc
    if compression_params is None:
        return {}
    if not isinstance(compression_params, collections.abc.Mapping):
        hint = (' (parse it first: json.loads(...))'
                if isinstance(compression_params, (str, bytes)) else '')
        raise TypeError('%s: compression_params must be a dict of parameter names to '
                        'values, as for MXNet\'s kvstores; got %s %r%s'
                        % (kvstore_type, type(compression_params).__name__,
                           compression_params, hint))
    return dict(compression_params)
