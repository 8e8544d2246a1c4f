"""Worker for tests/test_launch.py: dist_sync pushpull of rank-dependent values.

Each round every worker pushes (rank + 1) * key * (round + 1) to each key and
pulls; the sum must be key * (round + 1) * n (n + 1) / 2 exactly. Options:
  --rounds R          rounds (default 2)
  --crash-worker I    the worker with DMLC_WORKER_ID I calls os._exit(3) after
                      round 0, while the others block in round 1
  --hang              after round 0, print 'ready' and sleep (a hung job)
  --hang-at-exit I    the worker with DMLC_WORKER_ID I hangs in its interpreter's
                      shutdown, after its script is done (an atexit handler that
                      sleeps, registered before the kvstore is made, so that it runs
                      after kvstore_ext_autoload's line that says the script is done)
  --print-port        print the node's PORT (ps-lite's own port of the node), or none
  --print-env         print the node's DMLC_PS_ROOT_URI and DMLC_NODE_HOST
  --count-listeners   after the rounds, print how many TCP sockets the job's processes
                      (found in /proc by the job's root port) listen on, and the
                      Unix socket files in /tmp they hold
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
    parser.add_argument('--print-port', action='store_true')
    parser.add_argument('--print-env', action='store_true')
    parser.add_argument('--count-listeners', action='store_true')
    parser.add_argument('--hang-at-exit', type=int)
    args = parser.parse_args()
    if args.print_port:
        print('own port %s' % os.environ.get('PORT', 'none'), flush=True)
    if args.print_env:
        print('env DMLC_PS_ROOT_URI=%s DMLC_NODE_HOST=%s' % (
            os.environ.get('DMLC_PS_ROOT_URI'), os.environ.get('DMLC_NODE_HOST')), flush=True)
    launch_id = int(os.environ.get('DMLC_WORKER_ID', '-1'))  # unset under tools/launch.py
    if args.hang_at_exit == launch_id:
        import atexit
        atexit.register(time.sleep, 600)

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
    if args.count_listeners:
        pids = job_pids()
        sockets = set().union(*(socket_inodes(pid) for pid in pids))
        print('job processes %d tcp listeners %d' % (len(pids), len(sockets & tcp_listening())),
              flush=True)
    print('rank %d of %d ok' % (rank, n), flush=True)


def job_pids():
    """Pids of the processes whose environment holds this job's root port."""
    mark = b'DMLC_PS_ROOT_PORT=' + os.environ['DMLC_PS_ROOT_PORT'].encode()
    pids = []
    for entry in os.listdir('/proc'):
        try:
            with open('/proc/%s/environ' % entry, 'rb') as f:
                if entry.isdigit() and mark in f.read().split(b'\0'):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def socket_inodes(pid):
    found = set()
    for fd in os.listdir('/proc/%d/fd' % pid):
        try:
            target = os.readlink('/proc/%d/fd/%s' % (pid, fd))
        except OSError:
            continue
        if target.startswith('socket:['):
            found.add(target[len('socket:['):-1])
    return found


def tcp_listening():
    """Inodes of the host's listening TCP sockets (state 0A in /proc/net/tcp*)."""
    found = set()
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == '0A':
                    found.add(fields[9])
    return found


if __name__ == '__main__':
    main()
