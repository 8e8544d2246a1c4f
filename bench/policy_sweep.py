"""Hylo's policy='auto' on the emulated cluster: step time at several link rates.

For each link rate, runs bench/cluster.py's jobs (one network namespace per node, each
behind a link shaped to the rate; needs root, docs/CLUSTER.md) for

* ``dist_sync`` (MXNet, float32),
* ``dist_sync_hylo`` (the default: compress every tensor Hylo compresses),
* ``dist_sync_hylo:policy=auto,link_rate=<the rate>`` (the rate given),
* ``dist_sync_hylo:policy=auto`` (link_rate=0: measured on the init/broadcast rounds
  and the first step, agreed by the workers),

and writes one JSON with every run's rows (cluster.py's: median step time, compute
time, bytes on the links and in comm_stats) and, per rate and model, what the cost
model predicts the policy chooses: the keys of the model's shapes it compresses and
the rate below which each would be compressed (kvstore_ext/policy.py, crossover).

    sudo python bench/policy_sweep.py --rates 100mbit,1gbit,10gbit -n 2 -s 1 \\
        --models vgg resnet --steps 20 --json bench/results/policy_sweep.json

Measures step times: run it on a quiet machine.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import cluster  # noqa: E402
import netns  # noqa: E402

DEFAULT_RATES = '100mbit,1gbit,10gbit'
DEFAULT_OUT = os.path.join(HERE, 'results', 'policy_sweep.json')


def schemes_at(rate_bps):
    """The four schemes of a rate (cluster.py's KVSTORE:KEY=VALUE,...)."""
    return ['dist_sync', 'dist_sync_hylo',
            'dist_sync_hylo:policy=auto,link_rate=%g' % rate_bps,
            'dist_sync_hylo:policy=auto']


def predicted(model, workers, servers, rate_bps):
    """{key: {'shape', 'crossover_bps', 'compressed'}} of the model's tensors Hylo
    compresses by default: what policy='auto' chooses at ``rate_bps``."""
    import numpy as np
    import cluster_worker
    from kvstore_ext import policy
    from kvstore_ext.schemes import Hylo
    net = cluster_worker.build_model(model)
    net.initialize()
    import mxnet as mx
    net(mx.nd.zeros((1, 3, 32, 32)))
    scheme = Hylo()
    scheme.num_workers = workers
    out = {}
    for name, param in net.collect_params().items():
        codec = scheme.codec_for(param.shape, np.float32)
        if codec.passthrough:
            continue
        out[name] = {'shape': list(param.shape),
                     'crossover_bps': policy.crossover(codec, workers, servers),
                     'compressed': policy.compresses(codec, workers, servers, rate_bps)}
    return out


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n', 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rates', default=DEFAULT_RATES,
                        help='link rates, tc units, comma-separated (%(default)s)')
    parser.add_argument('-n', '--workers', type=int, default=2)
    parser.add_argument('-s', '--servers', type=int, default=1)
    parser.add_argument('--models', nargs='+', default=['vgg', 'resnet'])
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--timeout', type=float, default=600, help='seconds per job')
    parser.add_argument('--json', default=DEFAULT_OUT,
                        help='output (bench/results/policy_sweep.json)')
    args = parser.parse_args(argv)
    args.rates = [r for r in args.rates.split(',') if r]
    try:
        for r in args.rates:
            netns.parse_rate(r)
    except ValueError as e:
        parser.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    result = {'config': vars(args), 'rates': []}
    code = 0
    for rate in args.rates:
        bps = netns.parse_rate(rate)
        with tempfile.TemporaryDirectory(prefix='kvx-policy-') as tmp:
            part = os.path.join(tmp, 'cluster.json')
            code = max(code, cluster.main(
                ['-n', str(args.workers), '-s', str(args.servers), '--rate', rate,
                 '--models'] + args.models + ['--schemes'] + schemes_at(bps) +
                ['--steps', str(args.steps), '--warmup', str(args.warmup),
                 '--timeout', str(args.timeout), '--json', part]))
            runs = json.load(open(part))['runs'] if os.path.exists(part) else []
        result['rates'].append({
            'rate': rate, 'rate_bps': bps, 'runs': runs,
            'predicted': {m: predicted(m, args.workers, args.servers, bps)
                          for m in args.models}})
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w') as f:          # after every rate: a partial sweep stays
            json.dump(result, f, indent=1)
    return code


if __name__ == '__main__':
    sys.exit(main())
