"""CPU time a worker spends per plain key per step, beside MXNet's own kvstore.

A tensor the scheme leaves uncompressed ("plain") takes MXNet's own pushpull, so the
plugin's worker-side cost on it should be MXNet's call and nothing more. This times
the worker's CPU (``time.thread_time`` of the calling thread, where the
plugin's Python runs, and ``time.process_time`` of the whole process: user + system,
so another job on the cores does not count, as it would in wall time) of a loop of
``kv.pushpull`` over a model's shapes, key by key as Gluon's Trainer calls it, and
prints microseconds per key per step for each kvstore, with the first one's as the
base. No model compute; every key of the plugin's kvstores is plain (give them
``policy=auto,link_rate=1e12``, or ``dist_sync_none``).

    python bench/plain_overhead.py [--model cnn512 --steps 300]
        [--kvstores local dist_sync_none dist_sync_hylo:policy=auto,link_rate=1e12]
        [--profile 25] [--separate-outs]

In one process the plugin is rank 0 of 1 (its local transport) and ``local`` is
MXNet's; under the launcher (``python -m kvstore_ext.launch -n 1 -s 1 python
bench/plain_overhead.py --kvstores dist_sync ...``) they go through ps-lite, where
the plugin cuts big keys into chunks, a native pushpull each. ``--profile N``
prints cProfile's N most expensive functions (cumulative) of each kvstore's loop.
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def shapes_of(model):
    sys.path.insert(0, os.path.join(HERE, '..', 'gluon_scripts'))
    import mxnet as mx
    import train_mnist
    net = train_mnist.build_net(model)
    net.initialize()
    net(mx.nd.zeros((1, 1, 28, 28)))
    return [p.shape for p in net.collect_params().values() if p.grad_req != 'null']


def loop(kv, grads, steps, outs=None):
    """Gluon's calls: each gradient array is its own out; or, with ``outs``, separate
    outs (as bench/step_time.py)."""
    import mxnet as mx
    outs = outs or grads
    for _ in range(steps):
        for i, g in enumerate(grads):
            kv.pushpull(i, g, out=outs[i])
    mx.nd.waitall()


def measure(spec, shapes, steps, profile, separate):
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    sys.path.insert(0, HERE)
    from cluster import parse_scheme
    _, kvstore, params = parse_scheme(spec)
    kv = mx.kv.create(kvstore)
    if params:
        kv.set_gradient_compression(params)
    grads = [mx.nd.ones(s) for s in shapes]
    outs = [mx.nd.zeros(s) for s in shapes] if separate else None
    for i, g in enumerate(grads):
        kv.broadcast(i, g, out=g)
    loop(kv, grads, 5, outs)                # plans, re-plans, first allocations
    start, start_main = time.process_time(), time.thread_time()
    loop(kv, grads, steps, outs)
    cpu, main = time.process_time() - start, time.thread_time() - start_main
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        loop(kv, grads, steps, outs)
        prof.disable()
        print('--- %s: cProfile, %d steps' % (spec, steps))
        pstats.Stats(prof).sort_stats('cumulative').print_stats(profile)
    if hasattr(kv, 'plan'):
        plain = sum(not kv.plan(i).compressed for i in range(len(shapes)))
        if plain != len(shapes):
            print('note: %s: %d of %d keys plain' % (spec, plain, len(shapes)))
    return main / steps / len(shapes), cpu / steps / len(shapes)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='cnn512')
    p.add_argument('--steps', type=int, default=300)
    p.add_argument('--kvstores', nargs='+', metavar='KVSTORE[:KEY=VALUE,...]',
                   default=['local', 'dist_sync_none',
                            'dist_sync_hylo:policy=auto,link_rate=1e12'])
    p.add_argument('--profile', type=int, default=0, metavar='N')
    p.add_argument('--separate-outs', action='store_true',
                   help='pushpull into other arrays than the gradients (bench/step_time.py)')
    args = p.parse_args()
    shapes = shapes_of(args.model)
    rows = [(spec, measure(spec, shapes, args.steps, args.profile, args.separate_outs))
            for spec in args.kvstores]
    if os.environ.get('DMLC_ROLE', 'worker') != 'worker' or \
            int(os.environ.get('DMLC_WORKER_ID', '0')) != 0:
        return
    print('model %s (%d keys), %d steps: worker CPU per key per step, the calling '
          'thread and the whole process (engine and ps-lite threads too)'
          % (args.model, len(shapes), args.steps))
    base = rows[0][1][0]
    for spec, (main, cpu) in rows:
        print('%-48s thread %7.1f us (x%.2f of %s)  process %7.1f us'
              % (spec, 1e6 * main, main / base, rows[0][0], 1e6 * cpu))


if __name__ == '__main__':
    main()
