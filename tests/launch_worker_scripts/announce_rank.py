"""Worker for tests/test_launch.py: announces a made-up kv.rank (no ps-lite).

Launch index i announces rank (num_workers - 1 - i), so labels by launch index and by
rank differ; it prints a line before and after the announcement on stdout, one after
on stderr, and exits with --exit-code when its launch index is --fail-worker.
"""
import argparse
import importlib.util
import os
import sys
import time

LAUNCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'kvstore_ext', 'launch.py')


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--fail-worker', type=int, default=-1)
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location('kvx_launch_for_worker', LAUNCH)
    launch = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = launch
    spec.loader.exec_module(launch)
    index = int(os.environ['DMLC_WORKER_ID'])
    rank = int(os.environ['DMLC_NUM_WORKER']) - 1 - index
    print('index %d before' % index, flush=True)
    launch.announce_rank(rank)
    time.sleep(0.5)          # the launcher's stdout thread relabels before stderr writes
    print('index %d after' % index, flush=True)
    print('index %d on stderr' % index, file=sys.stderr, flush=True)
    if index == args.fail_worker:
        time.sleep(0.5)      # the other workers finish first: their output is complete
        sys.exit(3)


if __name__ == '__main__':
    main()
