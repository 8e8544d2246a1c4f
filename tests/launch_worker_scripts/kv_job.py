"""Worker for tests/test_launch.py: dist_sync pushpull of rank-dependent values.

Each round every worker pushes (rank + 1) * key * (round + 1) to each key and
pulls; the sum must be key * (round + 1) * n (n + 1) / 2 exactly. Options:
  --rounds R          rounds (default 2)
  --crash-worker I    the worker with DMLC_WORKER_ID I calls os._exit(3) after
                      round 0, while the others block in round 1
  --hang              after round 0, print 'ready' and sleep (a hung job)
  --expect-no-port    fail if PORT is in the environment
  --print-env         print the node's DMLC_PS_ROOT_URI and DMLC_NODE_HOST
"""
import argparse
import os
import sys
import time

import mxnet as mx

KEYS = [3, 5, 7, 11]
SHAPE = (2, 3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--crash-worker', type=int)
    parser.add_argument('--hang', action='store_true')
    parser.add_argument('--expect-no-port', action='store_true')
    parser.add_argument('--print-env', action='store_true')
    args = parser.parse_args()
    if args.expect_no_port and 'PORT' in os.environ:
        sys.exit('PORT leaked into the worker: %s' % os.environ['PORT'])
    if args.print_env:
        print('env DMLC_PS_ROOT_URI=%s DMLC_NODE_HOST=%s' % (
            os.environ.get('DMLC_PS_ROOT_URI'), os.environ.get('DMLC_NODE_HOST')), flush=True)
    launch_id = int(os.environ.get('DMLC_WORKER_ID', '-1'))  # unset under tools/launch.py

    kv = mx.kv.create('dist_sync')
    rank, n = kv.rank, kv.num_workers
    for key in KEYS:
        kv.init(key, mx.nd.zeros(SHAPE))
    for rnd in range(args.rounds):
        for key in KEYS:
            out = mx.nd.zeros(SHAPE)
            kv.pushpull(key, mx.nd.full(SHAPE, (rank + 1) * key * (rnd + 1)), out=out)
            expected = key * (rnd + 1) * n * (n + 1) // 2
            got = out.asnumpy()
            if not (got == expected).all():
                sys.exit('rank %d key %d round %d: got %s, expected %d'
                         % (rank, key, rnd, got.ravel().tolist(), expected))
        if rnd == 0 and args.crash_worker == launch_id:
            print('worker %d crashing' % launch_id, flush=True)
            os._exit(3)
        if rnd == 0 and args.hang:
            print('ready', flush=True)
            time.sleep(600)
    print('rank %d of %d ok' % (rank, n), flush=True)


if __name__ == '__main__':
    main()
