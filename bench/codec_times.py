"""The shipped codec speed table: every registered scheme's codecs timed on a ladder of
synthetic shapes, per codec class (bench/results/codec_times.json, cost.CODEC_TIMES).

Why: the cost model prices Hylo's and 2-bit's codecs from kernel timings
(their ``Codec.kernel_cases``, read by cost.kernels_of); any other codec was unpriced
until the user ran ``--calibrate``, and pricing it from kernels would need kernel cases
of its own in the kernels benchmark. This times,
for every registered scheme and mode at its defaults (cost.variants), every codec it
plans for a ladder of matrix and conv shapes (10^4 to 10^7 elements), with
cost_calibrate.calibrate (a one-process store, rank 0 of 1: encode, the servers' decode
of one payload, the worker's decode, and the store's Python between; best of
``--repeats`` steps), and files each codec under ``cost.codec_class``: its class with
its wrappers' names and its ``speed_params`` (PowerSGD's rank, AdaComp's bin). The model
interpolates a class's rows on a chunk's elements.

A row is one tensor of the ladder: (elements of its first chunk, worker seconds a step,
servers' seconds to decode one worker's payload); chunks of one tensor differ by at most
one row, and a tensor cut into chunks is timed whole and shared by elements (as
calibrate does). Where two schemes plan the same class at the same size, the faster
reading is kept (best of both). The codecs cost.kernels_of prices from
bench/results/kernels.json (Hylo's, 2-bit's) are left out. Limits: one worker (a
parameter that depends on the worker count is timed as planned for one), one process,
this machine's cores, wall time: other programs' load slows it (the file records the
load average).

    python bench/codec_times.py --copy          # bench/results/codec_times.json, and
                                                # its copy in kvstore_ext/cost.py
"""
import argparse
import json
import logging
import os
import platform
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

OUT = os.path.join(HERE, 'results', 'codec_times.json')
COST = os.path.join(os.path.dirname(HERE), 'kvstore_ext', 'cost.py')
CHUNK = 1 << 20         # the schemes' default chunk_size, as calibrate cuts
# matrices (rows, cols) and conv weights (O, I, 3, 3), about 10^4 to 10^7 elements;
# the codecs that chunk (at 1048576 elements) cut those above 10^6, so their rows end near
# 10^6 and PowerSGD's (whole matrices) reach 10^7
SHAPES = {
    'fc_1e4': (100, 100),
    'fc_1e5': (250, 400),
    'fc_3e5': (500, 600),
    'fc_1e6': (1000, 1000),
    'fc_3e6': (1500, 2000),
    'fc_1e7': (2500, 4000),
    'conv_9e3': (32, 32, 3, 3),
    'conv_1e5': (128, 96, 3, 3),
    'conv_3e5': (256, 128, 3, 3),
    'conv_1e6': (256, 512, 3, 3),
    'conv_2e6': (512, 512, 3, 3),
    'conv_9e6': (1024, 1024, 3, 3),
}


def machine():
    """What the timings depend on besides the code."""
    info = {'platform': platform.platform(), 'python': platform.python_version(),
            'cpus': os.cpu_count()}
    try:
        with open('/proc/cpuinfo') as f:
            models = [line.split(':', 1)[1].strip() for line in f
                      if line.startswith('model name')]
        info['cpu'] = models[0] if models else '?'
    except OSError:
        pass
    import mxnet
    info['mxnet'] = mxnet.__version__
    info['omp_num_threads'] = os.environ.get('OMP_NUM_THREADS')
    return info


def class_rows(variants, shapes, repeats):
    """{codec_class: [(elements, worker s, server s per worker's payload)]}, sorted by
    elements, from one calibrate per variant (each its own store)."""
    from kvstore_ext import chunking, cost
    from kvstore_ext.cost_calibrate import calibrate
    from kvstore_ext.registry import SCHEMES
    best = {}                                   # (class, elements) -> (worker, server)
    classes = {}                                # class -> labels of the variants
    for label, name, params in variants:
        if name == 'dad':                       # modelled as its fallback (cost.plan)
            continue
        start = time.perf_counter()
        measured = calibrate([(label, name, params)], shapes, repeats=repeats,
                             chunk_size=CHUNK).measured
        for key, codec in cost.plan(SCHEMES[name](**params), shapes, 1).items():
            if codec is None or codec.passthrough:
                continue
            first = chunking.split(codec, CHUNK)[0].codec
            if cost.kernels_of(first) is not None:      # priced by kernels.json
                continue
            found = measured.get(cost.signature(first))
            if found is None:
                continue
            where = (cost.codec_class(first), first.size)
            old = best.get(where)
            best[where] = found if old is None else (min(old[0], found[0]),
                                                     min(old[1], found[1]))
            classes.setdefault(where[0], set()).add(label)
        print('%-56s %6.1f s' % (label, time.perf_counter() - start), flush=True)
    table = {}
    for (key, elements), (worker, server) in sorted(best.items()):
        table.setdefault(key, []).append([elements, float('%.4g' % worker),
                                          float('%.4g' % server)])
    return table, {k: sorted(v) for k, v in classes.items()}


def python_copy(table):
    """``table`` as the ``CODEC_TIMES = {...}`` literal of kvstore_ext/cost.py."""
    lines = ['CODEC_TIMES = {']
    for key, rows in table.items():
        head = '    %r: [' % key
        items = ['(%d, %r, %r)' % tuple(row) for row in rows]
        line = head
        for i, item in enumerate(items):
            piece = item + (', ' if i < len(items) - 1 else '],')
            if len(line) + len(piece.rstrip()) > 90:
                lines.append(line.rstrip())
                line = ' ' * len(head) + piece
            else:
                line += piece
        lines.append(line.rstrip())
    return '\n'.join(lines + ['}'])


def write_copy(table, path=COST):
    """Replace the CODEC_TIMES literal in ``path`` (cost.py) by ``table``'s."""
    with open(path) as f:
        text = f.read()
    new, count = re.subn(r'^CODEC_TIMES = \{.*?^\}$', lambda m: python_copy(table), text,
                         count=1, flags=re.S | re.M)
    if count != 1:
        raise SystemExit('%s: no CODEC_TIMES = {...} block to replace' % path)
    with open(path, 'w') as f:
        f.write(new)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeats', type=int, default=15,
                        help='steps timed per variant after an untimed first (best of)')
    parser.add_argument('--json', default=OUT, help='output file (default %(default)s)')
    parser.add_argument('--copy', action='store_true',
                        help='also rewrite cost.CODEC_TIMES in kvstore_ext/cost.py from it')
    args = parser.parse_args(argv)
    from kvstore_ext import SCHEMES, cost
    variants = cost.variants(SCHEMES)
    load_before = list(os.getloadavg())
    start = time.perf_counter()
    was_disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)        # a scheme's note on a missing optimizer
    try:
        table, measured_by = class_rows(variants, SHAPES, args.repeats)
    finally:
        logging.disable(was_disabled)       # a caller in the same process logs again
    result = {
        'meta': {
            'command': 'python bench/codec_times.py --repeats %d%s' % (
                args.repeats, '' if args.json == OUT else ' --json %s' % args.json),
            'machine': machine(),
            'loadavg_before': load_before,
            'loadavg_after': list(os.getloadavg()),
            'seconds': round(time.perf_counter() - start, 1),
            'repeats': args.repeats,
            'shapes': {k: list(v) for k, v in SHAPES.items()},
            'variants': [label for label, _, _ in variants],
            'definitions': {
                'key': 'cost.codec_class: the codec class with its wrappers\' names '
                       '(outermost first) and the values of its speed_params',
                'row': '[elements of the first chunk of a ladder tensor, worker seconds '
                       'a step, servers\' seconds to decode one worker\'s payload]; '
                       'wall time, best of repeats, one worker in one process '
                       '(kvstore_ext/cost_calibrate.py)',
                'measured_by': 'the variants whose plans timed the class',
            },
            'measured_by': measured_by,
        },
        'codecs': table,
    }
    with open(args.json, 'w') as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write('\n')
    if args.copy:
        write_copy(table)
    print('%d codec classes, %.0f s; load average %.1f before, %.1f after -> %s' % (
        len(table), result['meta']['seconds'], load_before[0],
        result['meta']['loadavg_after'][0], args.json))
    return 0


if __name__ == '__main__':
    sys.exit(main())
