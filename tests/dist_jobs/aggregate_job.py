"""One worker of the distributed aggregation tests (run under kvstore_ext.launch).

Pushes deterministic random gradients from two devices for a few tensors and steps,
and saves what it pulled, its residuals and the thresholds it agreed on, so the test
can recompute everything with the NumPy reference.
"""
import argparse
import json
import os

import numpy as np

SHAPES = {'conv': (24, 8, 3, 3), 'fc': (70, 33), 'bias': (50,), 'wide': (5000,)}
CONTEXT_COUNT = 2


def replanning_scheme():
    """A Hylo that re-plans at steps 2 and 4 (the test's reference follows it): from
    server decoding to homomorphic with another conv rate and size threshold (fc goes
    float32, wide goes additive: each change of kind sends the old residual with the
    step), then back to server decoding."""
    from kvstore_ext.schemes import Hylo

    class ReplanningHylo(Hylo):
        name = 'test_replan'
        PHASES = ({'aggregation': 'server'},
                  {'aggregation': 'homomorphic', 'conv_rate': 0.5, 'size_threshold': 3000},
                  {'aggregation': 'server', 'conv_rate': 0.5})

        def replans_at(self, step):
            return step in (2, 4)

        def codec_for(self, shape, dtype, step=0):
            phase = Hylo(**dict(self.params, **self.PHASES[min(step // 2, 2)]))
            return phase.codec_for(shape, dtype)

    return ReplanningHylo


def gradient(rank, step, key, device):
    """The gradient a device of a worker produces (same function in the test)."""
    seed = [rank, step, device, sorted(SHAPES).index(key)]
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.integers(-2, 2)
    return (rng.standard_normal(SHAPES[key]) * scale).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', default='dist_sync_hylo')
    parser.add_argument('--params', default='{}')
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--out', required=True)
    args = parser.parse_args()

    import mxnet as mx
    import kvstore_ext  # noqa: F401  registers the kvstore types
    kvstore_ext.register_scheme(replanning_scheme())
    kv = mx.kv.create(args.kvstore)
    kv.set_gradient_compression(json.loads(args.params))
    ctxs = [mx.cpu(i) for i in range(CONTEXT_COUNT)]

    value = mx.nd.array(np.full((3, 4), kv.rank + 1, np.float32))
    outs = [mx.nd.zeros((3, 4), ctx=c) for c in ctxs]
    kv.broadcast('param', value, outs)
    record = {'broadcast': outs[1].asnumpy()}

    plans = {}
    for step in range(args.steps):
        for key in SHAPES:
            vals = [mx.nd.array(gradient(kv.rank, step, key, d), ctx=c)
                    for d, c in enumerate(ctxs)]
            kv.pushpull(key, vals)
            record['out/%s/%d' % (key, step)] = vals[1].asnumpy()
            state = kv.key_state(key)
            if state.residual is not None:
                record['res/%s/%d' % (key, step)] = state.residual
            for i, last in enumerate(state.last):
                agreed = last.get('agreed')
                if agreed is not None:          # what this step was encoded with
                    record['agreed/%s/%d/%d' % (key, step, i)] = agreed
        plans[step] = kv.codec_plan()
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **record)
    with open(os.path.join(args.out, 'rank%d.json' % kv.rank), 'w') as f:
        json.dump({'rank': kv.rank, 'num_workers': kv.num_workers, 'type': kv.type,
                   'stats': kv.comm_stats(), 'plans': plans}, f)


if __name__ == '__main__':
    main()
