"""One worker of the plain-path test (run under kvstore_ext.launch).

Every key is plain (sent as it is). Gluon-style steps (each gradient array is its own
out, the same arrays every step) of a key cut into chunks and a one-chunk key; while
the store's pushpull runs, every MXNet C API call of this process is counted. Each
sum is checked against the NumPy sum of all workers' gradients (seeded by rank, step,
key), a NaN one worker sends reaches the sum as in dist_sync, the byte counters grow
by the keys' float32 bytes, and a classic push/pull key returns its last sum.
One key is pushed from the same array into another each step (separate outs): its
push is ordered after the last pull by one no-op op a step. Prints 'calls <key>
<chunks> <steps> <1 if separate outs> <json of counted calls>' per key.
"""
import argparse
import collections
import json

import numpy as np

SHAPES = {'big': (5, 1000), 'bias': (64,), 'apart': (3, 700)}
APART = 'apart'      # pushed from one array into another each step (separate outs)
PARAMS = {'dist_sync_none': {'chunk_size': 1024},
          'dist_sync_hylo': {'chunk_size': 1024, 'policy': 'auto', 'link_rate': 1e12,
                             'codec_times': 'shipped'}}
NAN_STEP, NAN_AT = 4, (2, 7)         # rank 1 sends a NaN there at that step


def gradient(rank, step, key):
    rng = np.random.default_rng([rank, step, sorted(SHAPES).index(key)])
    return (rng.standard_normal(SHAPES[key]) * 0.1).astype(np.float32)


class Counter:
    """Counts the calls of every MXNet C API function, by function, under ``key``
    while it is set."""

    def __init__(self):
        self.key, self.calls = None, collections.defaultdict(collections.Counter)

    def install(self):
        import mxnet.base as base
        counter = self
        lib_class = type(base._LIB)

        class CountingLib(lib_class):
            def __getattribute__(self, name):
                found = lib_class.__getattribute__(self, name)
                if counter.key is None or not name.startswith('MX'):
                    return found

                def call(*args):
                    counter.calls[counter.key][name] += 1
                    return found(*args)
                return call
        base._LIB.__class__ = CountingLib


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', required=True, choices=sorted(PARAMS))
    parser.add_argument('--steps', type=int, default=8)
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create(args.kvstore)
    kv.set_gradient_compression(PARAMS[args.kvstore])
    grads = {k: mx.nd.zeros(s) for k, s in SHAPES.items()}
    outs = dict(grads, **{APART: mx.nd.zeros(SHAPES[APART])})
    for k, g in grads.items():
        kv.broadcast(k, g, out=g)
    counter = Counter()
    counter.install()
    for step in range(args.steps):
        for key, grad in grads.items():
            mine = gradient(kv.rank, step, key)
            if step == NAN_STEP and kv.rank == 1 and key == 'big':
                mine[NAN_AT] = np.nan
            grad[:] = mine
            counter.key = key if step >= 2 else None    # after the plan, the first route
            kv.pushpull(key, grad, out=outs[key])
            counter.key = None
            expect = sum(gradient(r, step, key) for r in range(kv.num_workers))
            got = outs[key].asnumpy()
            if step == NAN_STEP and key == 'big' and kv.num_workers > 1:
                if not np.isnan(got[NAN_AT]):
                    raise SystemExit('a NaN sent by rank 1 did not reach the sum')
                got[NAN_AT] = expect[NAN_AT] = 0.0
            if not np.allclose(got, expect, rtol=1e-5, atol=1e-6):
                raise SystemExit('step %d key %s: sum differs from the workers\' by %g'
                                 % (step, key, np.abs(got - expect).max()))
    for key in SHAPES:
        if kv.plan(key).compressed:
            raise SystemExit('key %s is compressed: the test needs it plain' % key)
    stats = kv.comm_stats()
    raw = 4 * sum(int(np.prod(s)) for s in SHAPES.values()) * args.steps
    if stats['push_bytes'] != raw or stats['pull_bytes'] != raw:
        raise SystemExit('byte counters %s, expected %d each' % (stats, raw))
    # classic interface: push (a fresh sum kept) then pull returns it
    kv.init('classic', mx.nd.zeros((3, 400)))
    value, out = mx.nd.zeros((3, 400)), mx.nd.zeros((3, 400))
    for step in range(3):
        value[:] = gradient(kv.rank, step, 'big')[:3, :400]
        kv.push('classic', value)
        kv.pull('classic', out=out)
        expect = sum(gradient(r, step, 'big')[:3, :400] for r in range(kv.num_workers))
        if not np.allclose(out.asnumpy(), expect, rtol=1e-5, atol=1e-6):
            raise SystemExit('pull after push %d: not the last sum' % step)
    mx.nd.waitall()
    for key in SHAPES:
        print('calls %s %d %d %d %s' % (key, len(kv.plan(key).chunks), args.steps - 2,
                                        key == APART,
                                        json.dumps(dict(counter.calls[key]))), flush=True)
    print('rank %d done' % kv.rank, flush=True)


if __name__ == '__main__':
    main()
