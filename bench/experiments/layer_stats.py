"""Hylo's per-layer picture, in one process: W simulated workers, each with its own
shard of the batch and its own error-feedback residuals, the codecs in NumPy (the
algorithm of kvstore_ext/schemes/hylo.py and python/kvx_ref), then the same SGD
(momentum) step on the sum as in a dist_sync run with ``update_on_kvstore=False``.

Every ``--every`` steps it records, per compressed layer:

* ``sent_energy``: ||what the workers send||^2 / ||acc||^2 (summed over workers):
  the share of the accumulated gradient that leaves this step;
* ``cos``: cosine between the delivered aggregate and the true one (the sum of the
  workers' fresh gradients at the same weights: what dist_sync would deliver);
* ``res_over_grad``: ||residual|| / ||fresh gradient|| (mean over workers);
* conv: ``age``: mean steps since a filter was last sent; FC: ``nonzero``: share of
  nonzero codes, ``capped``: share of workers whose threshold the delivery cap decided.

and at the end the test accuracy. The data are sharded as train_mnist.py's
distributed runs shard them, but the run is not bit-equal to one (initialisation,
summation order), so accuracies are for comparing variants within this tool; the
distributed runs (bench/promise.py) are the evidence.

Variants of the rule, to find out what a loss comes from before changing the codecs:
``--compress conv|fc`` compresses one kind of layer only; ``--conv-select`` picks a
worker's filters other than by the top-k of their norms (``age``: filters unsent for
``--max-age`` steps first, then the top norms; ``score_age``: the top norm x steps since
the worker last sent the filter; ``round_robin``: k filters in turn, whatever their
norms); ``--momentum-correction`` is DGC's (the workers accumulate velocities, the
optimizer applies plain SGD to the compressed layers' aggregate).

    python bench/experiments/layer_stats.py --model cnn512 --workers 4 --epochs 3 --json out.json
    python bench/experiments/layer_stats.py --variant dense        # no compression (reference)
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'gluon_scripts'))


def conv_rate(size, p):
    if p.get('conv_rate'):
        return p['conv_rate']
    r = p['conv_rate_max'] * math.sqrt(p['size_threshold'] / size)
    return min(max(r, p['conv_rate_min']), p['conv_rate_max'])


class Layer:
    """One compressed tensor: per-worker residuals (and velocities) and statistics."""

    def __init__(self, name, shape, workers, p):
        self.name, self.shape, self.p = name, shape, p
        self.kind = 'conv' if len(shape) >= 3 else 'fc'
        self.res = [np.zeros(shape, np.float32) for _ in range(workers)]
        self.vel = [np.zeros(shape, np.float32) for _ in range(workers)]
        if self.kind == 'conv':
            self.k = min(max(math.ceil(conv_rate(int(np.prod(shape)), p) * shape[0]), 1),
                         shape[0])
            self.last_sent = np.zeros(shape[0])
            self.worker_last_sent = [np.zeros(shape[0]) for _ in range(workers)]
        self.prev_agree = None

    def select(self, w, scores, step):
        """Worker ``w``'s k filters (sorted), by ``p['select']`` (see the module doc)."""
        rule, age = self.p.get('select', 'topk'), step - self.worker_last_sent[w]
        if rule == 'topk':
            chosen = np.argsort(-scores, kind='stable')[:self.k]
        elif rule == 'age':
            overdue = np.flatnonzero(age >= self.p['max_age'])
            overdue = overdue[np.argsort(-age[overdue], kind='stable')][:self.k]
            rest = np.setdiff1d(np.arange(self.shape[0]), overdue)
            top = rest[np.argsort(-scores[rest], kind='stable')][:self.k - len(overdue)]
            chosen = np.concatenate([overdue, top])
        elif rule == 'score_age':
            chosen = np.argsort(-(scores * age), kind='stable')[:self.k]
        else:                                        # round_robin
            chosen = (np.arange(self.k) + step * self.k) % self.shape[0]
        self.worker_last_sent[w][chosen] = step
        return np.sort(chosen)

    def step(self, grads, step, homomorphic, momentum_correction):
        p, W = self.p, len(grads)
        if momentum_correction:
            for w in range(W):
                self.vel[w] = momentum_correction * self.vel[w] + grads[w]
            fresh = self.vel
        else:
            fresh = grads
        accs = [fresh[w] + self.res[w] for w in range(W)]
        sent = [None] * W
        stats = {}
        if self.kind == 'conv':
            flat = [a.reshape(a.shape[0], -1) for a in accs]
            scores = [np.square(f).sum(1) for f in flat]
            if homomorphic:
                total = np.sum(scores, 0)
                chosen = [np.sort(np.argsort(-total, kind='stable')[:self.k])] * W
            else:
                chosen = [self.select(w, s, step) for w, s in enumerate(scores)]
            union = np.zeros(self.shape[0], bool)
            for w in range(W):
                s = np.zeros_like(flat[w])
                s[chosen[w]] = flat[w][chosen[w]]
                sent[w] = s.reshape(self.shape)
                union[chosen[w]] = True
            self.last_sent[union] = step
            stats['age'] = float(np.mean(step - self.last_sent))
            stats['k'] = self.k
        else:
            # the delivery cap (codecs/ternary.py, additive.py): t at most max|acc|
            # (homomorphic: the mean of the workers' maxima); capped, v = t
            if homomorphic:
                t = p['fc_scale'] * np.mean([np.abs(a).mean() for a in accs])
                cap = np.mean([np.abs(a).max() for a in accs])
                ts, capped = [min(t, cap)] * W, [t >= cap] * W
            else:
                ts = [p['fc_scale'] * np.abs(a).mean() for a in accs]
                caps = [np.abs(a).max() for a in accs]
                capped = [t >= c for t, c in zip(ts, caps)]
                ts = [min(t, c) for t, c in zip(ts, caps)]
            stats['capped'] = float(np.mean(capped))
            nz = 0
            for w in range(W):
                codes = (accs[w] >= ts[w]).astype(np.float32) - (accs[w] <= -ts[w])
                # Hylo's rule (hylo.FC_VALUE): a code stands for 2t, t where capped
                value = ts[w] if capped[w] else 2 * ts[w]
                sent[w] = codes * np.float32(value)
                nz += np.count_nonzero(codes)
            stats['nonzero'] = nz / (W * accs[0].size)
        for w in range(W):
            self.res[w] = accs[w] - sent[w]
            if momentum_correction:       # factor masking: sent coordinates restart
                self.vel[w][sent[w] != 0] = 0
        delivered = np.sum(sent, 0)
        true = np.sum(grads, 0)
        stats['sent_energy'] = float(sum(np.square(s).sum() for s in sent)
                                     / max(sum(np.square(a).sum() for a in accs), 1e-30))
        stats['cos'] = float((delivered * true).sum()
                             / max(np.linalg.norm(delivered) * np.linalg.norm(true), 1e-30))
        stats['res_over_grad'] = float(np.mean([np.linalg.norm(self.res[w])
                                                / max(np.linalg.norm(grads[w]), 1e-30)
                                                for w in range(W)]))
        return delivered, stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split('\n\n', 1)[1])
    ap.add_argument('--model', default='cnn512')
    ap.add_argument('--workers', type=int, default=4)
    ap.add_argument('--batch-size', type=int, default=32, help='per worker')
    ap.add_argument('--epochs', type=int, default=3)
    ap.add_argument('--lr', type=float, default=0.05)
    ap.add_argument('--momentum', type=float, default=0.9)
    ap.add_argument('--wd', type=float, default=1e-4)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--variant', default='hylo', choices=('hylo', 'homomorphic', 'dense'))
    ap.add_argument('--params', default='{}', help="JSON: Hylo parameters to override "
                    "(the defaults are the scheme's)")
    ap.add_argument('--compress', default='all', choices=('all', 'conv', 'fc'),
                    help='which large layers are compressed (the others go float32)')
    ap.add_argument('--conv-select', default='topk',
                    choices=('topk', 'age', 'score_age', 'round_robin'),
                    help="how a worker picks its conv filters (module doc)")
    ap.add_argument('--max-age', type=int, default=4,
                    help="--conv-select age: filters unsent this many steps go first")
    ap.add_argument('--momentum-correction', action='store_true',
                    help='DGC: accumulate velocity locally (momentum moved from the '
                         'optimizer into the workers for compressed layers), mask sent '
                         'coordinates')
    ap.add_argument('--correct', default='all', choices=('all', 'conv', 'fc'),
                    help='--momentum-correction: which compressed layers it applies to')
    ap.add_argument('--through-optimizer', action='store_true',
                    help='--momentum-correction without touching the optimizer (what a '
                         'kvstore can do): the optimizer keeps its momentum m on every '
                         'layer, and a corrected layer delivers S_t - m S_(t-1) (S: the '
                         'sum of the sent velocities), so that its momentum buffer holds '
                         'S_t and the step applies exactly -lr S_t')
    ap.add_argument('--warmup-steps', type=int, default=0)
    ap.add_argument('--every', type=int, default=5)
    ap.add_argument('--json')
    args = ap.parse_args(argv)
    import mxnet as mx
    from mxnet import autograd, gluon
    import train_mnist

    from kvstore_ext.schemes.hylo import Hylo
    p = {name: param.default for name, param in Hylo.PARAMS.items()}   # Hylo's defaults
    p.update(json.loads(args.params))
    p.update(select=args.conv_select, max_age=args.max_age)
    xtr, ytr, xte, yte = train_mnist.load_digits(False, args.seed)
    net = train_mnist.build_net(args.model)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    seed = (args.seed * 1000003) % (2 ** 31)        # training/data.py's seed_epoch, rank 0
    mx.random.seed(seed, ctx='all')
    np.random.seed(seed)
    net(mx.nd.array(xtr[:1]))
    params = [q for q in net.collect_params().values() if q.grad_req != 'null']
    W, B = args.workers, args.batch_size
    layers = {q.name: Layer(q.name, q.shape, W, p) for q in params
              if args.variant != 'dense' and int(np.prod(q.shape)) >= p['size_threshold']
              and args.compress in ('all', 'conv' if len(q.shape) >= 3 else 'fc')}
    mc = args.momentum if args.momentum_correction else 0.0
    corrected = {name for name, layer in layers.items()
                 if mc and args.correct in ('all', layer.kind)}
    delivered_before = {}          # --through-optimizer: S_(t-1) of each corrected layer
    # compressed layers under momentum correction: plain SGD on the aggregate
    opt_plain = mx.optimizer.SGD(learning_rate=args.lr, wd=args.wd, momentum=0.0,
                                 rescale_grad=1.0 / (W * B))
    opt_mom = mx.optimizer.SGD(learning_rate=args.lr, wd=args.wd, momentum=args.momentum,
                               rescale_grad=1.0 / (W * B))
    states = {}
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps_per_epoch = len(ytr) // W // B
    records, step, t0 = [], 0, time.time()
    for epoch in range(args.epochs):
        # the scripts' sharding (training/data.py ArrayData): worker w takes every W-th
        # sample of the epoch's order. (A contiguous split of the same order trained
        # differently: Hylo lost 1.3 points of the 8-worker MLP there, 3.0 here and 3.7
        # in the distributed runs.)
        order = np.random.default_rng([args.seed, epoch, 0, 0]).permutation(len(ytr))
        mine = [order[w::W][:steps_per_epoch * B] for w in range(W)]
        for i in range(steps_per_epoch):
            step += 1
            grads = {q.name: [] for q in params}
            for w in range(W):
                idx = mine[w][i * B:(i + 1) * B]
                x, y = mx.nd.array(xtr[idx]), mx.nd.array(ytr[idx])
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                for q in params:
                    grads[q.name].append(q.grad().asnumpy())
            rec = {'step': step}
            for j, q in enumerate(params):
                layer = layers.get(q.name)
                compressed = layer is not None and step > args.warmup_steps
                lmc = mc if q.name in corrected else 0.0
                if compressed:
                    agg, st = layer.step(grads[q.name], step, args.variant == 'homomorphic',
                                         lmc)
                    if step % args.every == 0:
                        rec[q.name] = st
                else:
                    agg = np.sum(grads[q.name], 0)
                    if lmc:      # warm-up under correction: velocity
                        for w in range(W):
                            layer.vel[w] = lmc * layer.vel[w] + grads[q.name][w]
                        agg = np.sum(layer.vel, 0)
                opt = opt_plain if lmc else opt_mom
                if lmc and args.through_optimizer:
                    previous = delivered_before.get(q.name, 0.0)
                    delivered_before[q.name] = agg
                    agg, opt = agg - lmc * previous, opt_mom
                if (j, id(opt)) not in states:
                    states[(j, id(opt))] = opt.create_state(j, q.data())
                opt.update(j, q.data(), mx.nd.array(agg), states[(j, id(opt))])
            if len(rec) > 1:
                records.append(rec)
        acc = mx.metric.Accuracy()
        for s in range(0, len(yte), 500):
            acc.update([mx.nd.array(yte[s:s + 500])], [net(mx.nd.array(xte[s:s + 500]))])
        print('epoch %d: test acc %.4f (%.0f s)' % (epoch, acc.get()[1], time.time() - t0),
              flush=True)
    final = acc.get()[1]
    # per-layer summary: means over the first and the last third of the records
    summary = {}
    for name in layers:
        rs = [r[name] for r in records if name in r]
        if not rs:
            continue
        third = max(1, len(rs) // 3)
        summary[name] = {part: {k: float(np.mean([r[k] for r in sel])) for k in sel[0]}
                         for part, sel in (('early', rs[:third]), ('late', rs[-third:]))}
        summary[name]['shape'] = list(layers[name].shape)
    print(json.dumps({'final_acc': final, 'layers': summary}, indent=1))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'args': vars(args), 'final_acc': final, 'layers': summary,
                       'records': records}, f, indent=1)


if __name__ == '__main__':
    main()
