"""Each scheme's parameter table in Markdown, written into its page docs/schemes/<name>.md
between ``<!-- params:begin -->`` and ``<!-- params:end -->``.

Why: a scheme's defaults used to be restated in its module's docstring, the README,
docs/DESIGN.md and a long scheme document, and the copies drifted. The declarations
(``Scheme.PARAMS``, ``COMMON_PARAMS``, ``Scheme.REMOVED``: params.py) are the one
source; the pages hold what this module makes of them, and tests/test_params_doc.py
fails when a page differs from it.

    python -m kvstore_ext.params_doc            # rewrite the tables in docs/schemes/
    python -m kvstore_ext.params_doc --check    # exit 1 naming the pages that differ
"""
import argparse
import os
import sys

BEGIN, END = '<!-- params:begin -->', '<!-- params:end -->'


def _cell(text):
    return str(text).replace('|', '\\|').replace('\n', ' ')


def _default(p):
    return 'unset' if p.default is None else '`%r`' % (p.default,)


def table(scheme):
    """The Markdown table of ``scheme``'s parameters (a Scheme class), ranked."""
    from .params import allowed, by_rank, RANK_TEXT
    from .schemes.base import COMMON_PARAMS
    spec = dict(scheme.PARAMS, **COMMON_PARAMS)
    lines = ['Generated from the declarations in `%s` by `python -m kvstore_ext.params_doc`; '
             'ranks: %s.' % (scheme.__module__.replace('.', '/') + '.py',
                             '; '.join('**%s**: %s' % r for r in RANK_TEXT.items())),
             '',
             '| rank | parameter | default | accepts | what it does, when to change it |',
             '|---|---|---|---|---|']
    for rank, params in by_rank(spec):
        for i, (name, p) in enumerate(params, 1):
            shown = '%s %d' % (rank, i) if rank == 'tune' else rank
            lines.append('| %s | `%s` | %s | %s | %s |' % (
                shown, name, _default(p), _cell(allowed(p)), _cell(p.doc)))
    gone = [('`%s=%r`' % (n, v), r) for n, p in spec.items() for v, r in p.removed.items()]
    gone += [('`%s`' % n, r) for n, r in sorted(scheme.REMOVED.items())]
    if gone:
        lines += ['', 'Removed (passing one raises `ValueError` with the reason):', '',
                  '| removed | why | use instead |', '|---|---|---|']
        lines += ['| %s | %s | %s |' % (what, _cell(r.reason), _cell(r.replacement))
                  for what, r in gone]
    return '\n'.join(lines)


def page_path(docs, name):
    return os.path.join(docs, 'schemes', '%s.md' % name)


def rewrite(text, generated, where):
    """``text`` with the part between the markers replaced by ``generated``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError('%s: needs one %s ... %s pair' % (where, BEGIN, END))
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return '%s%s\n%s\n%s%s' % (head, BEGIN, generated, END, tail)


def default_docs():
    """docs/ of the source tree this module sits in (python -m from a checkout)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'docs')


def pages(docs):
    """{path: (current text, text with the generated table)} for every scheme."""
    import kvstore_ext
    out = {}
    for name, scheme in sorted(kvstore_ext.SCHEMES.items()):
        path = page_path(docs, name)
        with open(path) as f:
            text = f.read()
        out[path] = (text, rewrite(text, table(scheme), path))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m kvstore_ext.params_doc',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--docs', default=default_docs(), help='the docs/ folder')
    parser.add_argument('--check', action='store_true',
                        help='write nothing; exit 1 if a page differs from its table')
    args = parser.parse_args(argv)
    stale = []
    for path, (text, new) in pages(args.docs).items():
        if text != new:
            stale.append(path)
            if not args.check:
                with open(path, 'w') as f:
                    f.write(new)
    if args.check and stale:
        print('parameter tables out of date (run python -m kvstore_ext.params_doc): %s'
              % ', '.join(stale), file=sys.stderr)
        return 1
    for path in stale:
        print('wrote %s' % path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
