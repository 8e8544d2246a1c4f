"""One worker of the soak test (run under kvstore_ext.launch, 4 workers, 2 servers).

Every worker pushes ``--steps`` steps of dist_sync_hylo over four keys of mixed size
and kind: conv filters (top-k), an FC matrix (ternary), a bias (float32, MXNet's own
pushpull) and a long vector cut into three chunks (chunk_size 8192) that spread over
both servers. Gradients come from seeds (rank, step), so rank 0 can replay every
worker: it keeps one one-process store per rank (whose pushpull returns that worker's
decoded payload, with that worker's residual) and checks every aggregate of every
step against their sum: a residual that drifted, a payload mixed up between keys or
chunks, or a step that lost a worker would show at once.

Memory: rank 0 reads the resident size (VmRSS) of the job's servers and its own at
step ``--warm`` and at the end, and prints the growth.
"""
import argparse
import os

import numpy as np

from job_util import job_pids, one_process_store

SHAPES = {'conv': (32, 16, 3, 3), 'fc': (128, 300), 'bias': (128,), 'wide': (20000,)}
# server mode: its servers decode every payload (the code a leak would be in), and each
# worker's payload depends on that worker alone, so one-process stores can replay it
# (the additive mode's payloads depend on what all workers agreed)
PARAMS = {'size_threshold': 1000, 'chunk_size': 8192, 'aggregation': 'server'}


def gradient(rank, step, key):
    rng = np.random.default_rng([rank, step, sorted(SHAPES).index(key)])
    return (rng.standard_normal(SHAPES[key]) * 0.01).astype(np.float32)


def rss_kb(pid):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--steps', type=int, default=2000)
    parser.add_argument('--warm', type=int, default=200)
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(PARAMS)
    checking = kv.rank == 0
    replay = [one_process_store('dist_sync_hylo', PARAMS) for _ in range(kv.num_workers)] if checking else []
    worst, warm = 0.0, None
    for step in range(args.steps):
        if checking and step == args.warm:
            warm = {pid: rss_kb(pid) for pid in job_pids('server') + [os.getpid()]}
        for key in SHAPES:
            value = mx.nd.array(gradient(kv.rank, step, key))
            kv.pushpull(key, value)
            if not checking:
                continue
            expect = np.zeros(SHAPES[key], np.float32)
            for rank, store in enumerate(replay):
                alone = mx.nd.array(gradient(rank, step, key))
                store.pushpull(key, alone)
                expect += alone.asnumpy()
            got = value.asnumpy()
            scale = float(np.abs(expect).max()) or 1.0
            error = float(np.abs(got - expect).max()) / scale
            worst = max(worst, error)
            if error > 1e-5:
                raise SystemExit('step %d key %s: aggregate differs from the replay by %g '
                                 '(relative)' % (step, key, error))
    if checking:
        growth = {pid: rss_kb(pid) - kb for pid, kb in warm.items()}
        servers = [growth[pid] for pid in warm if pid != os.getpid()]
        print('soak steps %d keys %d worst relative error %.3g server rss growth kb %s '
              'worker rss growth kb %d' % (args.steps, len(SHAPES), worst,
                                           ','.join(map(str, servers)), growth[os.getpid()]),
              flush=True)
    print('rank %d done' % kv.rank, flush=True)


if __name__ == '__main__':
    main()
