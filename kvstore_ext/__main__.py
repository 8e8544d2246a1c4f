"""``python -m kvstore_ext --list [--markdown]``: the registered kvstore types and their
parameters, grouped by rank (params.py)."""
import argparse
import sys


def describe_schemes():
    """One block per registered scheme: its kvstore type, summary and parameters."""
    import kvstore_ext
    from kvstore_ext.params import describe
    from kvstore_ext.schemes.base import COMMON_PARAMS
    blocks = []
    for name in sorted(kvstore_ext.SCHEMES):
        scheme = kvstore_ext.SCHEMES[name]
        doc = scheme.__doc__ or sys.modules[scheme.__module__].__doc__ or ''
        summary = doc.strip().split('\n')[0]
        blocks.append('dist_sync_%s: %s\n%s' % (
            name, summary, describe(dict(scheme.PARAMS, **COMMON_PARAMS), scheme.REMOVED)))
    return '\n\n'.join(blocks)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m kvstore_ext',
                                     description='kvstore_ext: compressed dist_sync kvstores')
    parser.add_argument('--list', action='store_true',
                        help='list the kvstore types with their parameters and defaults, '
                             'grouped by rank (the knobs worth tuning first)')
    parser.add_argument('--markdown', action='store_true',
                        help='with --list: each type\'s parameter table in Markdown, as '
                             'docs/schemes/<name>.md holds it (python -m '
                             'kvstore_ext.params_doc writes them there)')
    args = parser.parse_args(argv)
    if args.markdown and not args.list:
        parser.error('--markdown goes with --list')
    if args.list and args.markdown:
        import kvstore_ext
        from kvstore_ext.params_doc import table
        print('\n\n'.join('## dist_sync_%s\n\n%s' % (name, table(kvstore_ext.SCHEMES[name]))
                          for name in sorted(kvstore_ext.SCHEMES)))
    elif args.list:
        print(describe_schemes())
    else:
        parser.print_help()


if __name__ == '__main__':
    main()
