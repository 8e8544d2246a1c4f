"""Bytes per training step on the wire, per worker, for real models' gradient shapes.

For each model (the MNIST CNN of gluon_scripts/train_mnist.py, gluoncv's resnet18_v1
and vgg16; shapes only, nothing is trained) and each scheme, it sums what one worker
pushes and pulls in one step, from the same codecs, chunking and key layout the
transport uses (payload padding to whole rows included):

* ``dist_sync``: float32 both ways;
* MXNet's built-in ``2bit``: 16 values per 32-bit word pushed, float32 weights pulled;
* ``dist_sync_hylo`` in server-decode mode (float32 pulled, or ``pull='compressed'``:
  the servers re-encode the sum) and homomorphic mode (additive, compressed pull);
* ``dist_sync_2bit`` (our plugin's version of MXNet's scheme).

With ``--scaling`` it models bytes per worker step against the number of workers (2 to
1,024) for every Hylo mode: additive packing needs base-(2n+1) digits, so its payload
grows with n, while server decoding does not (the model is the codecs' own sizes,
``Codec.wire_words``; nothing is sent).

    python bench/wire_bytes.py [--workers 4] [--json bench/results/wire_bytes.json]
    python bench/wire_bytes.py --scaling --json bench/results/wire_scaling.json \
        --plot bench/results/wire_scaling.png
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'gluon_scripts'))


def model_shapes(name):
    """{parameter name: shape} of a model's trainable parameters."""
    import mxnet as mx
    if name == 'mnist_cnn':
        import train_mnist
        net, data = train_mnist.build_net(), mx.nd.zeros((1, 1, 28, 28))
    else:
        from gluoncv import model_zoo
        net, data = model_zoo.get_model(name, pretrained=False), mx.nd.zeros((1, 3, 224, 224))
    net.initialize()
    net(data)
    return {p.name: p.shape for p in net.collect_params().values() if p.grad_req != 'null'}


def scheme_bytes(scheme, shapes, workers):
    """(pushed, pulled) bytes per step of one worker under a kvstore_ext scheme: the
    rounds each chunk's codec declares (``Codec.wire_words``), as the PS transport lays
    them out (Gather payloads padded to whole rows)."""
    from kvstore_ext import chunking
    from kvstore_ext.transport.ps import gather_wire_bytes
    pushed = pulled = 0
    scheme.num_workers = workers          # as the store does: a policy may choose by it
    for shape in shapes.values():
        codec = scheme.codec_for(shape, np.float32)
        for chunk in chunking.split(codec, scheme.params['chunk_size']):
            for _, kind, up, down in chunk.codec.wire_words(workers):
                if kind == 'gather':
                    up, down = gather_wire_bytes(up, down)
                else:
                    up, down = 4 * up, 4 * down
                pushed, pulled = pushed + up, pulled + down
    return pushed, pulled


HYLO_MODES = {'server': {'aggregation': 'server'},
              'server, compressed pull': {'aggregation': 'server', 'pull': 'compressed'},
              'homomorphic': {'aggregation': 'homomorphic'}}
SCALING_WORKERS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def scaling(models):
    """Rows of bytes per worker step against the number of workers, per Hylo mode."""
    from kvstore_ext.schemes import Hylo
    rows = []
    for model in models:
        shapes = model_shapes(model)
        raw = 4 * sum(int(np.prod(s)) for s in shapes.values())
        for mode, params in HYLO_MODES.items():
            for n in SCALING_WORKERS:
                push, pull = scheme_bytes(Hylo(**params), shapes, n)
                rows.append({'model': model, 'mode': mode, 'workers': n, 'raw_bytes': raw,
                             'push_bytes': push, 'pull_bytes': pull})
    return rows


def plot_scaling(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    models = sorted({r['model'] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r['model'] == model]
        for mode in HYLO_MODES:
            pts = [r for r in mine if r['mode'] == mode]
            ax.plot([r['workers'] for r in pts],
                    [(r['push_bytes'] + r['pull_bytes']) / 2 ** 20 for r in pts],
                    marker='o', label=mode)
        ax.axhline(2 * mine[0]['raw_bytes'] / 2 ** 20, color='grey', ls='--',
                   label='float32 (dist_sync)')
        ax.set_xscale('log', base=2)
        ax.set_yscale('log')
        ax.set_xlabel('workers')
        ax.set_ylabel('MiB per worker step (push + pull)')
        ax.set_title(model)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(models, workers):
    from kvstore_ext.schemes import Hylo, TwoBit
    rows = []
    for model in models:
        shapes = model_shapes(model)
        n = sum(int(np.prod(s)) for s in shapes.values())
        raw = 4 * n
        entries = {'dist_sync': (raw, raw),
                   'mxnet 2bit (built-in)': (4 * sum(-(-int(np.prod(s)) // 16)
                                                     for s in shapes.values()), raw)}
        for mode, params in HYLO_MODES.items():
            entries['dist_sync_hylo (%s)' % mode] = scheme_bytes(Hylo(**params), shapes,
                                                                 workers)
        entries['dist_sync_2bit'] = scheme_bytes(TwoBit(), shapes, workers)
        for scheme, (push, pull) in entries.items():
            rows.append({'model': model, 'parameters': n, 'scheme': scheme,
                         'push_bytes': push, 'pull_bytes': pull,
                         'push_ratio': raw / push, 'pull_ratio': raw / pull})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--models', default='mnist_cnn,resnet18_v1,vgg16')
    parser.add_argument('--json', default=None, help='write the rows here')
    parser.add_argument('--scaling', action='store_true',
                        help='model bytes against worker count (2 to 1024) instead')
    parser.add_argument('--plot', default=None, help='with --scaling: PNG to draw')
    args = parser.parse_args()
    if args.scaling:
        rows = scaling(args.models.split(','))
        print('bytes per worker step (push + pull, MiB) against workers')
        print('%-13s %-26s ' % ('model', 'mode') + ' '.join('%7d' % n for n in SCALING_WORKERS))
        for model in args.models.split(','):
            for mode in HYLO_MODES:
                pts = [r for r in rows if r['model'] == model and r['mode'] == mode]
                print('%-13s %-26s ' % (model, mode) + ' '.join(
                    '%7.3f' % ((r['push_bytes'] + r['pull_bytes']) / 2 ** 20) for r in pts))
        if args.plot:
            plot_scaling(rows, args.plot)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump({'rows': rows}, f, indent=1)
        return
    rows = report(args.models.split(','), args.workers)
    print('%d workers; bytes per step per worker (x = smaller than float32)' % args.workers)
    print('%-13s %-30s %14s %8s %14s %8s' % ('model', 'scheme', 'push', 'x', 'pull', 'x'))
    for r in rows:
        print('%-13s %-30s %14d %8.1f %14d %8.1f' % (r['model'], r['scheme'], r['push_bytes'],
                                                    r['push_ratio'], r['pull_bytes'],
                                                    r['pull_ratio']))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w') as f:
            json.dump({'workers': args.workers, 'rows': rows}, f, indent=1)


if __name__ == '__main__':
    main()
