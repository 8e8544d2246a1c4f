"""Bytes per training step on the wire, per worker, for real models' gradient shapes.

For each model (the MNIST CNN of gluon_scripts/train_mnist.py, gluoncv's resnet18_v1
and vgg16; shapes only, nothing is trained) and each scheme, it sums what one worker
pushes and pulls in one step, from the same codecs, chunking and key layout the
transport uses (payload padding to whole rows included):

* ``dist_sync``: float32 both ways;
* MXNet's built-in ``2bit``: 16 values per 32-bit word pushed, float32 weights pulled;
* ``dist_sync_hylo`` in server-decode mode (float32 pulled) and homomorphic mode
  (compressed pull);
* ``dist_sync_2bit`` (our plugin's version of MXNet's scheme).

    python bench/wire_bytes.py [--workers 4] [--json bench/results/wire_bytes.json]
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
    """(pushed, pulled) bytes per step of one worker under a kvstore_ext scheme."""
    from kvstore_ext import chunking
    from kvstore_ext.transport.ps import ROW_WIDTH
    pushed = pulled = 0
    for shape in shapes.values():
        codec = scheme.codec_for(shape, np.float32)
        for chunk in chunking.split(codec, scheme.params['chunk_size']):
            c = chunk.codec
            if c.additive:
                size = c.sum_words(workers) * np.dtype(c.sum_dtype).itemsize
                size += 4 * c.agreement_words
                pushed, pulled = pushed + size, pulled + size
            else:
                width = min(ROW_WIDTH, c.payload_words())
                pushed += 4 * width * -(-c.payload_words() // width)
                pulled += 4 * width * -(-c.size // width)
    return pushed, pulled


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
        entries['dist_sync_hylo (server)'] = scheme_bytes(Hylo(), shapes, workers)
        entries['dist_sync_hylo (homomorphic)'] = scheme_bytes(
            Hylo(aggregation='homomorphic'), shapes, workers)
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
    args = parser.parse_args()
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
