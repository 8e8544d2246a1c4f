"""PyTorch DDP beside kvstore_ext on the same training run: step time, bytes, accuracy.

Why: a compression scheme's cost here is only meaningful against what users already
have. PyTorch ships PowerSGD (``powerSGD_hook``) and half precision
(``fp16_compress_hook``) as DDP communication hooks; this runs them on the training of
the accuracy benchmark (bench/promise.py's short run) and puts kvstore_ext's schemes
beside them, each side as a ratio to its own uncompressed run (the two frameworks'
absolute step times differ for reasons that have nothing to do with compression).

The same on both sides: the CNN ``cnn512`` of gluon_scripts/train_mnist.py (conv 32 5x5
'same', pool, conv 64 5x5 'same', pool, dense 512, dense 10; ReLU; Xavier-uniform
weights, zero biases), the digits that train_mnist.py loads (its ``load_digits``: 4000
train, 1000 test, the same split), the same shards and batch order (gluon_scripts/
training/data.py's ArrayData: seed, epoch and rank decide them), SGD with momentum 0.9,
lr 0.05, weight decay 1e-4 on the mean gradient of the global batch, 32 samples a
worker, 3 epochs of 31 steps (93 steps), 4 processes on 127.0.0.1, one thread each.
PyTorch uses gloo; kvstore_ext runs through its launcher with 2 servers.

PyTorch's runs: ``plain`` (DDP's own allreduce), ``powersgd`` (powerSGD_hook, rank 4,
error feedback and warm start, its default min_compression_rate 2;
``start_powerSGD_iter`` 2, the earliest the hook accepts with error feedback: its
steps 0-1 go float32), ``fp16`` (fp16_compress_hook). All three with one gradient
bucket (``bucket_cap_mb`` above the model's size): with two, powerSGD_hook's
asynchronous all_reduces of the two buckets reached gloo in different orders on
different workers and the run aborted (gloo: "Received data size doesn't match").
Bytes per step each way are the payloads the hooks hand to all_reduce (counted by wrapping
``torch.distributed.all_reduce``; plain DDP: every gradient in float32), what each
worker contributes and gets back, as kvstore_ext's comm_stats count pushes and pulls.
A ring allreduce moves 2 (n-1)/n of that per worker on the wire.

PyTorch is not a dependency of kvstore_ext: it lives in a venv of its own
(bench/requirements-torch.txt; bench/README.md says how to make it), given by
``--torch-python``. This script itself runs with the package's Python: it writes the
digits to a file for the PyTorch workers and calls bench/promise.py for kvstore_ext's
side, seed by seed, interleaved with PyTorch's runs of the same seed. Step time is
the slowest worker's training seconds summed over the epochs (evaluation excluded), as
promise.py's ``train_s``; ratios pair runs of the same seed.

    python bench/torch_ddp.py --torch-python /tmp/torch-venv/bin/python --seeds 1,2 \\
        --json bench/results/torch_ddp_side_by_side.json
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKERS = 4
BATCH = 32
EPOCHS = 3
LR, MOMENTUM, WD = 0.05, 0.9, 1e-4
RANK = 4
BUCKET_MB = 64          # above the model's 6.65 MB: one bucket
TORCH_RUNS = ('plain', 'powersgd', 'fp16')
OURS = ('dist_sync', 'dist_sync_powersgd', 'dist_sync_fp16')


# -- the PyTorch worker (runs in the torch venv) -------------------------------------

def build_net(torch):
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))
    for m in net:
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)     # MXNet's Xavier(): uniform, avg, 3
            nn.init.zeros_(m.bias)
    return net


def batches(seed, epoch, rank, x, y, per_epoch):
    """ArrayData.train_batches's order (gluon_scripts/training/data.py)."""
    import numpy as np
    order = np.random.default_rng([seed, epoch, 0, 0]).permutation(len(y))
    mine = order[rank::WORKERS][:per_epoch * BATCH]
    g = np.random.default_rng([seed, epoch, rank, 1])
    for i in range(per_epoch):
        idx = np.sort(mine[i * BATCH:(i + 1) * BATCH])
        idx = idx[g.permutation(len(idx))]
        yield x[idx], y[idx]


def worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d' % args.port,
                            rank=args.rank, world_size=WORKERS)
    sent = [0]
    reduce = dist.all_reduce

    def counting(tensor, *a, **k):          # what the hooks hand to all_reduce
        sent[0] += tensor.numel() * tensor.element_size()
        return reduce(tensor, *a, **k)
    dist.all_reduce = counting

    data = np.load(args.data)
    x_train, y_train = torch.from_numpy(data['x_train']), torch.from_numpy(data['y_train'])
    torch.manual_seed(args.seed)
    # one bucket (after DDP's first step, when it rebuilds them): powerSGD_hook's
    # asynchronous rounds of two buckets reach gloo in different orders on different
    # workers (a collective mismatch, measured); DDP broadcasts rank 0's weights
    model = DDP(build_net(torch), bucket_cap_mb=BUCKET_MB)
    if args.run == 'powersgd':
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=RANK,
                                   start_powerSGD_iter=2)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    elif args.run == 'fp16':
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_epoch = len(y_train) // WORKERS // BATCH
    train_s, steps, counted = 0.0, 0, []
    for epoch in range(EPOCHS):
        t0 = time.perf_counter()
        for xb, yb in batches(args.seed, epoch, args.rank, x_train.numpy(),
                              y_train.numpy(), per_epoch):
            before = sent[0]
            opt.zero_grad()
            loss = loss_fn(model(torch.from_numpy(xb)), torch.from_numpy(yb).long())
            loss.backward()
            opt.step()
            counted.append(sent[0] - before)
            steps += 1
        train_s += time.perf_counter() - t0
    slowest = torch.tensor([train_s])
    dist.all_reduce = reduce
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if args.rank == 0:
        with torch.no_grad():
            out = model.module(torch.from_numpy(data['x_test']))
        acc = float((out.argmax(1).numpy() == data['y_test']).mean())
        raw = 4 * sum(p.numel() for p in model.parameters())
        last = counted[-1] if args.run != 'plain' else raw
        json.dump({'run': args.run, 'seed': args.seed, 'steps': steps,
                   'train_s': float(slowest.item()), 'final_acc': acc,
                   'raw_bytes_per_step': raw, 'bytes_per_step': last,
                   'torch': torch.__version__}, open(args.out, 'w'))
    dist.destroy_process_group()


# -- the driver (runs with the package's Python) --------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def write_digits(path):
    sys.path.insert(0, os.path.join(REPO, 'gluon_scripts'))
    import numpy as np
    import train_mnist
    x_train, y_train, x_test, y_test = train_mnist.load_digits(False, 0)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def torch_run(args, run, seed, data, tmp):
    out = os.path.join(tmp, 'torch_%s_%d.json' % (run, seed))
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS='1')
    procs = [subprocess.Popen([args.torch_python, os.path.abspath(__file__), '--worker',
                               '--run', run, '--rank', str(r), '--port', str(port),
                               '--seed', str(seed), '--data', data, '--out', out],
                              env=env) for r in range(WORKERS)]
    deadline = time.time() + args.timeout
    try:
        for p in procs:
            p.wait(max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs) or not os.path.exists(out):
        return {'run': run, 'seed': seed, 'failed': [p.returncode for p in procs]}
    return json.load(open(out))


def ours_run(args, seed, tmp):
    out = os.path.join(tmp, 'ours_%d.json' % seed)
    cmd = [sys.executable, os.path.join(HERE, 'promise.py'), '--specs'] + args.ours + [
        '--models', 'cnn512', '--workers', str(WORKERS), '-s', '2', '--schedules',
        'short', '--short-epochs', str(EPOCHS), '--seeds', '%d,' % seed, '--batch-size',
        str(BATCH), '--lr', str(LR), '--momentum', str(MOMENTUM), '--threads', '1',
        '--timeout', str(args.timeout), '--json', out]
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    if not os.path.exists(out):
        return []
    keep = ('spec', 'seed', 'final_acc', 'train_s', 'bytes_per_step', 'exit_code')
    return [{k: r.get(k) for k in keep} for r in json.load(open(out))['runs']]


def ratios(rows, key, base):
    """Per seed: train_s over the base run's of the same seed."""
    out = {}
    by = {(r.get(key), r.get('seed')): r for r in rows if r.get('train_s')}
    for (name, seed), r in by.items():
        b = by.get((base, seed))
        if b:
            out.setdefault(name, []).append(round(r['train_s'] / b['train_s'], 3))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                epilog=__doc__.split('\n\n', 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--torch-python', default='/tmp/torch-venv/bin/python',
                   help='the Python of a venv with PyTorch (bench/requirements-torch.txt)')
    p.add_argument('--seeds', default='1', help='comma-separated seeds (1,2,3)')
    p.add_argument('--torch-only', action='store_true',
                   help="PyTorch's runs only (no kvstore_ext side)")
    p.add_argument('--ours', nargs='+', default=list(OURS),
                   help="kvstore_ext's specs (bench/promise.py's), dist_sync first")
    p.add_argument('--timeout', type=float, default=1800.0, help='seconds per job')
    p.add_argument('--json', help='results file')
    p.add_argument('--note', default='', help='a sentence on the conditions, kept in --json')
    # a PyTorch worker (the driver starts them)
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--run', choices=TORCH_RUNS, help=argparse.SUPPRESS)
    p.add_argument('--rank', type=int, help=argparse.SUPPRESS)
    p.add_argument('--port', type=int, help=argparse.SUPPRESS)
    p.add_argument('--seed', type=int, help=argparse.SUPPRESS)
    p.add_argument('--data', help=argparse.SUPPRESS)
    p.add_argument('--out', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if not os.path.exists(args.torch_python):
        p.error('--torch-python %s does not exist: make the venv as bench/README.md says'
                % args.torch_python)
    seeds = [int(s) for s in args.seeds.split(',') if s]
    torch_rows, our_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, 'digits.npz')
        write_digits(data)
        for seed in seeds:                  # seed-major: a seed's runs share the load
            for run in TORCH_RUNS:
                torch_rows.append(torch_run(args, run, seed, data, tmp))
                print('torch', json.dumps(torch_rows[-1]), flush=True)
            if not args.torch_only:
                rows = ours_run(args, seed, tmp)
                our_rows += rows
                print('ours', json.dumps(rows), flush=True)
    result = {'note': args.note, 'workers': WORKERS, 'batch': BATCH, 'epochs': EPOCHS,
              'lr': LR, 'momentum': MOMENTUM, 'wd': WD, 'rank': RANK, 'seeds': seeds,
              'torch': torch_rows, 'torch_ratio_to_plain': ratios(torch_rows, 'run', 'plain'),
              'ours': our_rows, 'ours_ratio_to_dist_sync': ratios(our_rows, 'spec',
                                                                   'dist_sync')}
    print(json.dumps({k: result[k] for k in ('torch_ratio_to_plain',
                                             'ours_ratio_to_dist_sync')}, indent=1))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
