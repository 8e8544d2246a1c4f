"""``python -m kvstore_ext --list``: the registered kvstore types and their parameters."""
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
            name, summary, describe(dict(scheme.PARAMS, **COMMON_PARAMS))))
    return '\n\n'.join(blocks)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m kvstore_ext',
                                     description='kvstore_ext: compressed dist_sync kvstores')
    parser.add_argument('--list', action='store_true',
                        help='list the kvstore types with their parameters and defaults')
    args = parser.parse_args(argv)
    if args.list:
        print(describe_schemes())
    else:
        parser.print_help()


if __name__ == '__main__':
    main()
