"""Typed, validated scheme parameters (what Gluon's ``compression_params`` sets).

Why not strings: BytePS passes parameters as whitespace-joined strings and finds
mistakes at run time, if at all. Here every key is declared with a type, a default
and a check, and a wrong key or value fails when the parameters are set. Numbers must
be finite: NaN and infinities are refused for every parameter.

Every parameter carries a ``rank``, as PyTorch's PowerSGDState docstring ranks its
knobs, so that a user knows which few to try first (``python -m kvstore_ext --list``
groups them; docs/schemes/<name>.md tables them, written by params_doc.py):

* ``'tune'``: worth tuning, in the order declared (the first one first);
* ``'leave'``: keep the default unless you know why (a mode, a seed, a transport size);
* ``'expert'``: changes what the scheme is; for comparisons and special set-ups;
* ``'diagnostic'``: for measuring the scheme, not for training with it.

Options that were measured not to work are removed, not kept as traps: a
``Removed(reason, replacement)`` names why and what to use, and ``validate`` raises it
when such a parameter (a scheme's ``REMOVED``) or value (a ``Param``'s ``removed``)
is passed, so that an old script or checkpoint fails with the reason instead of an
"unknown parameter" or a silent change of behaviour.
"""
import math
import numbers


RANKS = ('tune', 'leave', 'expert', 'diagnostic')
RANK_TEXT = {
    'tune': 'worth tuning, most useful first',
    'leave': 'keep the default unless you know why',
    'expert': 'changes what the scheme is: for comparisons and special set-ups',
    'diagnostic': 'for measuring the scheme, not for training with it',
}


class Removed:
    """A parameter or value that is gone: ``reason`` (why, with the evidence's file)
    and ``replacement`` (what to use instead). ``former_default``, for a whole
    parameter: the value that meant what now always holds; it is accepted and dropped,
    so that state files that recorded every parameter still load."""

    _UNSET = object()

    def __init__(self, reason, replacement, former_default=_UNSET):
        self.reason, self.replacement = reason, replacement
        self.former_default = former_default

    def accepts(self, value):
        return self.former_default is not Removed._UNSET and value == self.former_default

    def error(self, what, scheme_name):
        return ValueError('%s: %s was removed: %s; use instead: %s'
                          % (scheme_name, what, self.reason, self.replacement))


class Param:
    """One parameter: kind ('int', 'float', 'str'), default, a doc that says what it does
    and when to change it, its ``rank`` (RANKS), allowed range or choices,
    ``removed``: {value: Removed} of values that are gone, and ``refused``: {value:
    why} of values inside the range that mean nothing (``trial_steps=1``)."""

    def __init__(self, kind, default, doc, low=None, high=None, low_open=False,
                 choices=None, optional=False, rank='leave', removed=None, refused=None):
        if rank not in RANKS:
            raise ValueError('rank must be one of %s, got %r' % (RANKS, rank))
        self.kind, self.default, self.doc, self.rank = kind, default, doc, rank
        self.low, self.high, self.low_open = low, high, low_open
        self.choices, self.optional = choices, optional
        self.removed = dict(removed or {})
        self.refused = dict(refused or {})

    def convert(self, name, value, scheme_name='compression'):
        if value is None and self.optional:
            return None
        if isinstance(value, str) and value in self.removed:
            raise self.removed[value].error('%s=%r' % (name, value), scheme_name)
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
        if value in self.refused:
            raise ValueError('%s must not be %r: %s' % (name, value, self.refused[value]))
        return value


def validate(spec, given, scheme_name, removed=None):
    """Defaults overlaid with ``given``; unknown keys and bad values raise ValueError.
    ``removed``: {name: Removed} of parameters that are gone: passing one raises with
    its reason and replacement, unless it is given its former default (dropped).
    (MXNet's ``'type'`` key names the kvstore's scheme: the store checks it, store.py.)"""
    given = dict(given or {})
    for name, gone in (removed or {}).items():
        if name in given and name not in spec:
            if not gone.accepts(given[name]):
                raise gone.error('%s=%r' % (name, given[name]), scheme_name)
            del given[name]
    unknown = sorted(set(given) - set(spec))
    if unknown:
        raise ValueError('unknown compression parameter(s) for %s: %s; known: %s'
                         % (scheme_name, ', '.join(unknown), ', '.join(sorted(spec))))
    out = {name: p.default for name, p in spec.items()}
    for name, value in given.items():
        out[name] = spec[name].convert(name, value, scheme_name)
    return out


def by_rank(spec):
    """[(rank, [(name, Param), ...]), ...] in RANKS order, declaration order within."""
    return [(rank, [(n, p) for n, p in spec.items() if p.rank == rank])
            for rank in RANKS if any(p.rank == rank for p in spec.values())]


def allowed(p):
    """What a parameter accepts, in words: its choices or its range."""
    if p.kind == 'str':
        return ', '.join(repr(c) for c in p.choices)
    low = '' if p.low is None else '%s %s' % ('>' if p.low_open else '>=', p.low)
    high = '' if p.high is None else '<= %s' % p.high
    text = ' and '.join(t for t in (low, high) if t) or 'any'
    text += ''.join(', not %r' % v for v in sorted(p.refused))
    return '%s %s' % (p.kind, text) + (', or unset' if p.optional else '')


def describe(spec, removed=None):
    """The parameters grouped by rank, for --list: one line each with its default."""
    lines = []
    for rank, params in by_rank(spec):
        lines.append('  [%s] %s' % (rank, RANK_TEXT[rank]))
        lines += ['    %-22s %s (default %r)' % (name, p.doc, p.default)
                  for name, p in params]
    gone = [('%s=%r' % (n, v), r) for n, p in spec.items() for v, r in p.removed.items()]
    gone += sorted((removed or {}).items())
    if gone:
        lines.append('  [removed] passing one raises with the reason')
        lines += ['    %-22s use instead: %s' % (what, r.replacement) for what, r in gone]
    return '\n'.join(lines)


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
