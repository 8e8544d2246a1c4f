"""One worker of the misuse test on ps-lite (run under kvstore_ext.launch).

With a kvstore_ext type: a mistyped type name must raise (``mx.kv.create`` and a
Gluon Trainer), before any store is made, and a Gluon Embedding with sparse gradients
is refused naming its parameter. Then, with the real store (or MXNet's ``dist_sync``,
for the test to compare with), a float64 key and a key repeated in one pushpull list
go through one round each; what came back is saved as JSON for the test.
"""
import argparse
import json

import numpy as np


def refusal(call):
    try:
        call()
    except (ValueError, TypeError) as e:
        return '%s: %s' % (type(e).__name__, e)
    return None


def one_step(mx, trainer, net, x):
    with mx.autograd.record():
        loss = net(x).sum()
    loss.backward()
    trainer.step(1)


def gluon_refusals(mx, kvstore):
    """What a Trainer says at its first step for a typo and for sparse gradients."""
    net = mx.gluon.nn.Dense(3, in_units=4)
    net.initialize()
    typo = mx.gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                            kvstore=kvstore + 'o')
    embed = mx.gluon.nn.Embedding(10, 4, sparse_grad=True)
    embed.initialize()
    sparse = mx.gluon.Trainer(embed.collect_params(), 'sgd', {'learning_rate': 0.1},
                              kvstore=kvstore)
    return {'trainer_typo': refusal(lambda: one_step(mx, typo, net, mx.nd.ones((2, 4)))),
            'trainer_sparse': refusal(lambda: one_step(mx, sparse, embed,
                                                       mx.nd.array([1, 2])))}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--kvstore', required=True)
    parser.add_argument('--out', required=True, help='.json path; {rank} is replaced')
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    found = {}
    if args.kvstore != 'dist_sync':
        found['create_typo'] = refusal(lambda: mx.kv.create(args.kvstore + 'o'))
        found.update(gluon_refusals(mx, args.kvstore))
    kv = mx.kv.create(args.kvstore)
    rank = kv.rank
    f64 = np.array([1e15 + rank, 2.0 ** 52 + 1, 1 + 2.0 ** -40 * (rank + 1),
                    0.1 * (rank + 1)], np.float64)
    kv.init(['f64', 'r'], [mx.nd.zeros(4, dtype='float64'), mx.nd.zeros(6)])
    out = mx.nd.zeros(4, dtype='float64')
    kv.pushpull('f64', mx.nd.array(f64, dtype='float64'), out=out)
    found['f64'] = [float(v) for v in out.asnumpy()]
    found['f64_dtype'] = str(out.dtype.__name__ if hasattr(out.dtype, '__name__') else out.dtype)
    a = np.arange(6, dtype=np.float32) * (rank + 1)
    b = np.full(6, 0.5 + rank, np.float32)
    outs = [mx.nd.zeros(6), mx.nd.zeros(6)]
    kv.pushpull(['r', 'r'], [mx.nd.array(a), mx.nd.array(b)], out=outs)
    found['repeated'] = [[float(v) for v in o.asnumpy()] for o in outs]
    with open(args.out.replace('{rank}', str(rank)), 'w') as f:
        json.dump(found, f)
    print('rank %d ok' % rank, flush=True)


if __name__ == '__main__':
    main()
