"""Do jobs end? Unedited scripts run again and again under kvstore_ext.launch.

Not a timing benchmark: it counts jobs that do not exit by themselves. Each run is a
2-worker, 1-server job (``python -m kvstore_ext.launch``) of one of:

* ``module``: MXNet's own ``example/image-classification/train_imagenet.py
  --benchmark 1`` (Module API through ``common/fit.py``; synthetic data, a ResNet-8 on
  28x28 images, 4 batches a worker), vendored unmodified in tests/mxnet_examples/;
* ``gluon``: a user's Gluon script with ``--kvstore`` (tests/user_scripts/gluon_user.py,
  8 steps of a small conv net);
* ``gluon_mxnet``: MXNet's own ``example/gluon/image_classification.py --dataset dummy``
  (100 steps of MobileNet-0.25 at 224x224, batch 1: slow, so fewer runs);

with each kvstore type of ``--types``. ``dist_sync`` is MXNet's own store, unchanged
(kvstore_ext_autoload only prints the line that tells the launcher a script is done).
A type ending in ``@no-exit-handler`` (``dist_sync_hylo@no-exit-handler``) runs our
type with kvstore_ext's exit handler switched off (bench/experiments/exit_no_handler.py): the
state before kvstore_ext/shutdown.py.

A run "hangs" when the launcher had to name a node hung at exit (exit 124,
``--exit-grace`` seconds after every worker's script was done) or hit ``--timeout``.
``exit_s`` is from the last line a worker printed to the launcher's exit. One JSON
file per call in bench/results/ (``--out``).

    nice -n 5 python bench/exit_repeat.py --runs 20 --jobs module,gluon \\
        --types dist_sync_hylo,dist_sync --out bench/results/exit_repeat.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, 'tests', 'mxnet_examples')
LAUNCH = os.path.join(REPO, 'kvstore_ext', 'launch.py')
NO_HANDLER = os.path.join(HERE, 'experiments', 'exit_no_handler.py')
NO_HANDLER_SUFFIX = '@no-exit-handler'


def job_command(job, kvstore, python):
    """(worker argv, cwd) of ``job`` with ``kvstore``."""
    if job == 'module':
        return ([python, 'train_imagenet.py', '--benchmark', '1', '--network', 'resnet',
                 '--num-layers', '8', '--image-shape', '3,28,28', '--num-classes', '10',
                 '--num-examples', '256', '--batch-size', '32', '--num-epochs', '1',
                 '--disp-batches', '2', '--kv-store', kvstore],
                os.path.join(EXAMPLES, 'image-classification'))
    if job == 'gluon':
        return ([python, os.path.join(REPO, 'tests', 'user_scripts', 'gluon_user.py'),
                 '--kvstore', kvstore], None)
    if job == 'gluon_mxnet':
        return ([python, os.path.join(EXAMPLES, 'gluon', 'image_classification.py'),
                 '--dataset', 'dummy', '--model', 'mobilenet0.25', '--batch-size', '1',
                 '--epochs', '1', '--mode', 'hybrid', '--log-interval', '50',
                 '--save-frequency', '0', '--num-worker', '0', '--kvstore', kvstore], None)
    raise ValueError('unknown job %r' % job)


def run_once(job, kvstore, args):
    name = kvstore[:-len(NO_HANDLER_SUFFIX)] if kvstore.endswith(NO_HANDLER_SUFFIX) \
        else kvstore
    argv, cwd = job_command(job, name, args.python)
    if name != kvstore:         # our type without kvstore_ext's exit handler
        argv = [argv[0], NO_HANDLER] + argv[1:]
    scratch = tempfile.mkdtemp(prefix='kvx_exit_')
    cwd = cwd or scratch        # the Gluon example writes its log and params here
    env = dict(os.environ)
    env.pop('PORT', None)
    cmd = [args.python, LAUNCH, '-n', '2', '-s', '1', '--timeout', str(args.timeout),
           '--exit-grace', str(args.exit_grace), '--'] + argv
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    last = [start]
    lines = []

    def read():
        for raw in iter(proc.stdout.readline, b''):
            line = raw.decode(errors='replace').rstrip('\n')
            lines.append(line)
            if line.startswith(('[worker', '[rank')):
                last[0] = time.monotonic()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=args.timeout + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    end = time.monotonic()
    reader.join(5)
    hung = [l for l in lines if 'hung at exit' in l or l.startswith('[launch] timeout')]
    summary = [l for l in lines if '[kvstore_ext] dist_sync_' in l]
    return {'job': job, 'kvstore': kvstore, 'code': code, 'hang': bool(hung) or code == 124,
            'hang_message': hung[0] if hung else None,
            'exit_s': round(end - last[0], 2), 'total_s': round(end - start, 1),
            'summary': summary[0] if summary else None,
            'tail': lines[-6:] if code else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--runs', type=int, default=20)
    parser.add_argument('--jobs', default='module,gluon')
    parser.add_argument('--types', default='dist_sync_hylo,dist_sync')
    parser.add_argument('--exit-grace', type=float, default=30.0)
    parser.add_argument('--timeout', type=float, default=600.0)
    parser.add_argument('--python', default=sys.executable)
    parser.add_argument('--out', default=os.path.join(HERE, 'results', 'exit_repeat.json'))
    args = parser.parse_args()
    results = []
    cells = [(job, kv) for job in args.jobs.split(',') for kv in args.types.split(',')]
    for run in range(args.runs):            # interleaved: load changes alike for all
        for job, kvstore in cells:
            result = run_once(job, kvstore, args)
            result['run'] = run
            results.append(result)
            print('%-12s %-32s run %2d: code %d, %s, exit %.1f s after the last line'
                  % (job, kvstore, run, result['code'], 'HANG' if result['hang'] else 'ends',
                     result['exit_s']), flush=True)
            with open(args.out, 'w') as f:
                json.dump({'args': vars(args), 'results': results}, f, indent=1)
    print()
    for job, kvstore in cells:
        rows = [r for r in results if r['job'] == job and r['kvstore'] == kvstore]
        ended = [r['exit_s'] for r in rows if not r['hang'] and r['code'] == 0]
        print('%-12s %-32s %d runs: %d hung, %d failed otherwise, exit after the last '
              'line %s' % (job, kvstore, len(rows), sum(r['hang'] for r in rows),
                           sum(1 for r in rows if r['code'] and not r['hang']),
                           '%.1f-%.1f s' % (min(ended), max(ended)) if ended else '-'))


if __name__ == '__main__':
    main()
