"""Tests of kvstore_ext/launch.py with real ps-lite processes (and ssh command building).

The launcher is run as a script by path, so these tests do not depend on
``kvstore_ext/__init__`` (which imports mxnet and needs the C++ plugin). Every job
runs under a hard subprocess timeout, and the ``job_env`` fixture fails any test that
leaves a ps-lite node behind. Nodes are recognised by DMLC_ROLE plus a per-test tag
in their environment, so ps-lite jobs of other people on the same machine are never
touched.
"""
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import TAG_VAR, tagged_nodes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, 'kvstore_ext', 'launch.py')
SCRIPTS = os.path.join(REPO, 'tests', 'launch_worker_scripts')
KV_JOB = os.path.join(SCRIPTS, 'kv_job.py')
FAKE_SSH = os.path.join(SCRIPTS, 'fake_ssh.sh')
DOC = os.path.join(REPO, 'docs', 'LAUNCH.md')
PY = sys.executable
JOB_TIMEOUT = 60                           # hard limit of any one launcher run


def _load_launch():
    """launch.py by path: importing the package would run kvstore_ext/__init__."""
    spec = importlib.util.spec_from_file_location('kvx_launch_under_test', LAUNCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


launch = _load_launch()


# ------------------------------------------------------------------ helpers
# tagged_nodes and the job_env fixture live in conftest.py (shared with other
# multi-process tests).

def run_launcher(args, env, timeout=JOB_TIMEOUT):
    """Run the launcher to completion: (returncode, stdout, stderr, seconds)."""
    start = time.monotonic()
    done = subprocess.run([PY, LAUNCH] + args, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def start_launcher(args, env):
    """Popen of the launcher, SIGKILLed after JOB_TIMEOUT s whatever the test does."""
    proc = subprocess.Popen([PY, LAUNCH] + args, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(JOB_TIMEOUT, proc.kill)
    killer.daemon = True
    killer.start()
    proc.killer = killer
    return proc


def finish(proc):
    """Make sure the launcher is gone and its pipes closed."""
    proc.killer.cancel()
    proc.kill()
    proc.communicate()


def kv_job(*options):
    return [PY, KV_JOB] + list(options)


def assert_prefixed(text, allowed):
    """Every line starts with one of the node prefixes (no line was cut or mixed)."""
    for line in text.splitlines():
        assert re.match(allowed, line), 'unprefixed or interleaved line: %r' % line


NODE_PREFIX = r'\[(scheduler|server \d+|worker \d+|launch)\] '


# ------------------------------------------------------- local, real ps-lite

@pytest.mark.parametrize('workers,servers', [(2, 1), (4, 2)])
def test_dist_sync_sums_exact(job_env, workers, servers):
    code, out, err, _ = run_launcher(
        ['-n', str(workers), '-s', str(servers), '--env', 'PS_VERBOSE=1']
        + kv_job('--rounds', '3'), job_env)
    assert code == 0, err[-3000:]
    ranks = sorted(int(m) for m in re.findall(r'^\[worker \d+\] rank (\d+) of %d ok$'
                                              % workers, out, re.M))
    assert ranks == list(range(workers))
    assert_prefixed(out, r'\[worker \d+\] ')
    assert_prefixed(err, NODE_PREFIX)
    assert '[scheduler] ' in err and '[server %d] ' % (servers - 1) in err


@pytest.mark.parametrize('transport', ['ipc', 'tcp'])
def test_local_jobs_open_no_tcp_port_by_default(job_env, transport):
    """ipc (the default): ps-lite over Unix sockets in /tmp, none of the job's 4
    processes listens on TCP, and no socket file stays behind; tcp: they listen on
    127.0.0.1 (one port each)."""
    before = set(os.listdir(launch.IPC_DIR))
    options = [] if transport == 'ipc' else ['--transport', 'tcp']
    code, out, err, _ = run_launcher(['-n', '2', '-s', '1'] + options
                                     + kv_job('--count-listeners'), job_env)
    assert code == 0, err[-3000:]
    counts = re.findall(r'job processes (\d+) tcp listeners (\d+)', out)
    assert len(counts) == 2 and all(p == '4' for p, _ in counts), out
    assert all(int(l) == (0 if transport == 'ipc' else 4) for _, l in counts), counts
    assert not stale_ipc_sockets(before)


def stale_ipc_sockets(before):
    """Socket files in /tmp made since ``before`` (a listing) that nobody listens on:
    what a job left behind (another job's live sockets do not count)."""
    import socket
    stale = []
    for name in set(os.listdir(launch.IPC_DIR)) - before:
        if not name.isdigit():
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(os.path.join(launch.IPC_DIR, name))
            except ConnectionRefusedError:
                stale.append(name)
            except OSError:
                pass
    return stale


def test_killed_nodes_leave_no_ipc_socket_files(job_env):
    """A worker crash stops the others by signal; their /tmp/<port> socket files are
    removed by the launcher."""
    before = set(os.listdir(launch.IPC_DIR))
    code, _, err, _ = run_launcher(
        ['-n', '2', '-s', '1'] + kv_job('--crash-worker', '1', '--rounds', '3'), job_env)
    assert code == 3, err[-3000:]
    assert not stale_ipc_sockets(before)


def test_ipc_is_refused_where_it_would_bypass_the_links():
    for argv in (['--launcher', 'ssh', '-H', 'hosts', '--transport', 'ipc'],
                 ['--netns-prefix', 'x', '--transport', 'ipc']):
        with pytest.raises(SystemExit):
            launch.parse_args(['-n', '1'] + argv + ['true'])
    assert launch.parse_args(['-n', '1', '--netns-prefix', 'x', 'true']).transport == 'tcp'


def test_worker_crash_stops_everything(job_env):
    code, out, err, seconds = run_launcher(
        ['-n', '2', '-s', '1'] + kv_job('--crash-worker', '1', '--rounds', '3'), job_env)
    assert code == 3, err[-3000:]
    assert '[worker 1] worker 1 crashing' in out
    assert 'worker 1 exited with code 3' in err
    assert seconds < 15, 'took %.1f s' % seconds


def test_timeout_ends_hung_job(job_env):
    code, out, err, seconds = run_launcher(
        ['-n', '1', '-s', '1', '--timeout', '5'] + kv_job('--hang'), job_env)
    assert code == launch.EXIT_TIMEOUT
    assert 'timeout' in err
    assert seconds < 5 + launch.KILL_GRACE + 5


def test_sigint_stops_everything(job_env):
    proc = start_launcher(['-n', '1', '-s', '1'] + kv_job('--hang'), job_env)
    try:
        line = proc.stdout.readline()           # the worker is inside ps-lite now
        assert line == '[worker 0] ready\n'
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=15)
        err = proc.stderr.read()
    finally:
        finish(proc)
    assert code == 128 + signal.SIGINT
    assert 'received SIGINT' in err


def test_launcher_sigkill_takes_nodes_along(job_env):
    started = time.time() - 1
    proc = start_launcher(['-n', '1', '-s', '1'] + kv_job('--hang'), job_env)
    try:
        assert proc.stdout.readline() == '[worker 0] ready\n'
        assert len(tagged_nodes(job_env[TAG_VAR])) == 3
        proc.kill()                              # no chance to clean up: PDEATHSIG must
        proc.wait(timeout=10)
    finally:
        finish(proc)
    # the job_env fixture checks that scheduler, server and workers died with it. Nobody
    # is left to unlink their IPC socket files (the launcher does after a normal end):
    # this test does, once the dying nodes stop listening, so that CI leaves none in /tmp
    deadline = time.time() + 10
    while time.time() < deadline:
        launch.remove_stale_ipc_sockets(started)
        if not ours_left(started):
            break
        time.sleep(0.2)


def ours_left(since):
    """IPC socket files (``/tmp/<digits>``) made since ``since``."""
    left = []
    for name in os.listdir(launch.IPC_DIR):
        try:
            if name.isdigit() and os.lstat(os.path.join(launch.IPC_DIR, name)).st_mtime >= since:
                left.append(name)
        except FileNotFoundError:      # unlinked meanwhile
            pass
    return left


@pytest.mark.parametrize('transport', ['ipc', 'tcp'])
def test_port_in_environment_is_removed(job_env, transport):
    """The user's PORT never reaches a node (a node would claim the scheduler's port).
    tcp: nodes get no PORT (ps-lite picks a free one and holds it); ipc: each gets its
    own port, which the launcher holds for the job, so that no two nodes (nor a node
    and the scheduler) draw the same socket file."""
    port = launch.free_port()
    job_env['PORT'] = str(port)     # the trap: a node claiming the scheduler's port
    code, out, err, _ = run_launcher(
        ['-n', '3', '-s', '1', '--port', str(port), '--transport', transport]
        + kv_job('--print-port'), job_env)
    assert code == 0, err[-3000:]
    assert out.count(' of 3 ok') == 3
    ports = re.findall(r'own port (\w+)', out)
    assert len(ports) == 3 and str(port) not in ports, ports
    if transport == 'tcp':
        assert ports == ['none'] * 3
    else:
        assert len(set(ports)) == 3 and 'none' not in ports


class _Node:
    """What supervise reads of a node: its name, role and exit codes, one a poll."""

    def __init__(self, name, role, codes):
        self.name, self.spec, self._codes = name, type('Spec', (), {'role': role}), codes

    def poll(self):
        return self._codes.pop(0) if len(self._codes) > 1 else self._codes[0]


def test_a_failure_between_two_polls_is_not_a_success():
    """A worker that exits 3 right after the launcher found it running, while every
    other node has finished: the job failed (a loaded test run once saw exit 0:
    test_workers_labelled_by_announced_rank)."""
    nodes = [_Node('worker 0', 'worker', [None, 3]), _Node('worker 1', 'worker', [0]),
             _Node('server 0', 'server', [0])]
    assert launch.supervise(nodes, None, launch.StopRequest(), 1.0) == 3


ANNOUNCE = os.path.join(SCRIPTS, 'announce_rank.py')


def test_rank_line_round_trip():
    import io
    out = io.StringIO()
    launch.announce_rank(7, out)
    assert launch.parse_rank_line(out.getvalue().encode()) == 7
    assert launch.parse_rank_line(b'[worker 0] kv.rank 7\n') is None
    assert launch.parse_rank_line(b'rank 7 of 8 ok\n') is None


def test_workers_labelled_by_announced_rank(job_env):
    """Launch index i announces rank n-1-i: its lines carry [worker i] before the
    announcement, [rank n-1-i] after, and the launcher says which is which, also when
    it reports a failure."""
    server = [PY, '-c', 'pass']          # no ps-lite: the workers only print
    code, out, err, _ = run_launcher(
        ['-n', '3', '-s', '1', '--server-command', shlex.join(server), PY, ANNOUNCE,
         '--fail-worker', '0'], job_env)
    assert code == 3, err[-3000:]
    for index in range(3):
        rank = 2 - index
        assert '[worker %d] index %d before\n' % (index, index) in out, out
        assert '[rank %d] index %d after\n' % (rank, index) in out, out
        assert '[rank %d] index %d on stderr\n' % (rank, index) in err, err
        assert '[launch] worker %d is kv.rank %d;' % (index, rank) in err, err
    assert 'kv.rank' not in out           # the announcement itself is not forwarded
    assert '[launch] worker 0 (kv.rank 2) exited with code 3' in err, err


def test_help_explains_the_traps():
    done = subprocess.run([PY, LAUNCH, '--help'], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0
    for word in ('PORT', 'isAlive', '127.0.0.1', '--timeout', '--server-command', 'ssh'):
        assert word in done.stdout


# ------------------------------------------------------------- ssh commands

def write_hostfile(tmp_path, text):
    path = tmp_path / 'hosts'
    path.write_text(text)
    return str(path)


def test_parse_hostfile(tmp_path):
    path = write_hostfile(tmp_path, '# cluster\nnode-a\n\nnode-b:2222\nnode-c slots=4\n')
    assert launch.parse_hostfile(path) == [('node-a', '22'), ('node-b', '2222'),
                                           ('node-c', '22')]


def env_of(script):
    """{name: value} exported by a node's remote script."""
    return dict(re.findall(r"export (\w+)=('[^']*'|\S+?);", script))


def remote_script_of(role, line):
    """(ssh argv before the remote command, the sh script the node runs)."""
    if role == 'scheduler':
        return [], line                  # run locally by /bin/sh -c
    argv = shlex.split(line)
    return argv[:-1], argv[-1]


def test_ssh_commands(tmp_path):
    hosts = launch.parse_hostfile(write_hostfile(tmp_path, 'node-a\nnode-b:2222\n'))
    base_env = {'PORT': '8080', 'MXNET_KVSTORE_BIGARRAY_BOUND': '1000',
                'PYTHONPATH': '/opt/kvx', 'HOME': '/root'}
    commands = launch.ssh_commands(
        hosts, 3, 2, ['python', 'train.py', '--kvstore', 'dist_sync_hylo'],
        ['python', '-c', 'import mxnet'], '10.0.0.1', 9091, {'OMP_NUM_THREADS': '2'},
        '/work dir', base_env=base_env)

    assert [role for _, role, _ in commands] == ['scheduler'] + ['server'] * 2 + ['worker'] * 3
    assert [host for host, _, _ in commands] == ['10.0.0.1', 'node-a', 'node-b', 'node-a',
                                                 'node-b', 'node-a']
    ids = {'server': iter(range(2)), 'worker': iter(range(3))}
    for host, role, line in commands:
        ssh_argv, script = remote_script_of(role, line)
        env = env_of(script)
        if role == 'scheduler':
            assert ssh_argv == []                     # runs on the launching machine
        else:
            assert ssh_argv[:3] == ['ssh', '-o', 'StrictHostKeyChecking=no']
            assert ssh_argv[-3:] == ['-p', '2222' if host == 'node-b' else '22', host]
            key = 'DMLC_SERVER_ID' if role == 'server' else 'DMLC_WORKER_ID'
            assert env[key] == str(next(ids[role]))
        assert env['DMLC_ROLE'] == role
        assert env['DMLC_PS_ROOT_URI'] == '10.0.0.1'
        assert env['DMLC_PS_ROOT_PORT'] == '9091'
        assert env['DMLC_NUM_WORKER'] == '3' and env['DMLC_NUM_SERVER'] == '2'
        assert env['DMLC_NODE_HOST'] == host
        assert env['MXNET_KVSTORE_BIGARRAY_BOUND'] == '1000'
        assert env['PYTHONPATH'] == '/opt/kvx'
        # workers compute with the threads asked for; servers and scheduler with one
        assert env['OMP_NUM_THREADS'] == ('2' if role == 'worker' else '1')
        assert 'PORT' not in env and 'HOME' not in env
        assert 'unset PORT;' in script
        assert "cd '/work dir'" in script
        expected = ('python train.py --kvstore dist_sync_hylo' if role == 'worker'
                    else "python -c 'import mxnet'")
        assert expected + ' & pid=$!' in script


def test_ssh_job_through_fake_ssh(job_env, tmp_path):
    """The ssh layer runs a real job; remote nodes (own sessions) die with it."""
    hostfile = write_hostfile(tmp_path, '127.0.0.1\n127.0.0.1:2222\n')
    code, out, err, seconds = run_launcher(
        ['--launcher', 'ssh', '-H', hostfile, '--host-ip', '127.0.0.1', '--ssh', FAKE_SSH,
         '-n', '2', '-s', '1']
        + kv_job('--crash-worker', '1', '--rounds', '3'), job_env)
    assert code == 3, err[-3000:]
    assert '[worker 1] worker 1 crashing' in out
    assert 'worker 1 exited with code 3' in err
    assert seconds < 20


# ------------------------------------------------- MXNet's own tools/launch.py

def doc_oneliner():
    """The loopback one-liner documented in docs/LAUNCH.md for tools/launch.py."""
    with open(DOC) as f:
        text = f.read()
    match = re.search(r'<!-- tools-launch-local -->\s*```\w*\n(python -c ".*?")', text, re.S)
    assert match, 'one-liner marker missing from docs/LAUNCH.md'
    return shlex.split(match.group(1))


@pytest.mark.parametrize('how', ['run_mxnet_tools_launch', 'doc_oneliner'])
def test_mxnet_tools_launch_with_fix(job_env, how):
    if how == 'run_mxnet_tools_launch':   # loaded by path: kvstore_ext/__init__ not needed
        fix = [PY, '-c', 'import runpy; runpy.run_path(%r)["run_mxnet_tools_launch"]()'
               % LAUNCH]
    else:
        fix = [PY if word == 'python' else word for word in doc_oneliner()]
    job_env['PORT'] = '9999'
    done = subprocess.run(
        fix + ['-n', '2', '-s', '1', '--launcher', 'local']
        + kv_job('--print-port', '--print-env'),
        env=job_env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(' of 2 ok') == 2, done.stdout + done.stderr[-3000:]
    assert done.stdout.count('own port none') == 2, done.stdout   # PORT=9999 removed
    assert done.stdout.count('env DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1') == 2


def test_servers_and_scheduler_get_one_openmp_thread():
    """Servers compute no model; more OpenMP threads only spin on shared cores."""
    nodes = launch.local_nodes(2, 2, ['w'], ['s'], 9000,
                               base_env={'OMP_NUM_THREADS': '4', 'PORT': '1'})
    threads = {(n.role, n.rank): n.env.get('OMP_NUM_THREADS') for n in nodes}
    assert threads == {('scheduler', 0): '1', ('server', 0): '1', ('server', 1): '1',
                       ('worker', 0): '4', ('worker', 1): '4'}


# ------------------------------------------------ hangs at exit, IPC socket files

def test_worker_hung_at_exit_is_named(job_env):
    """A worker whose script is done but whose interpreter does not exit (MXNet's
    shutdown can hang so) is named once every worker's script is done plus
    --exit-grace, and the job ends then, not at --timeout. The line that says the
    script is done comes from kvstore_ext_autoload (installed with the package) for
    any dist kvstore; the launcher does not show it."""
    code, out, err, seconds = run_launcher(
        ['-n', '2', '-s', '1', '--timeout', str(SLOW_JOB_TIMEOUT - 30), '--exit-grace', '3']
        + kv_job('--hang-at-exit', '1'), job_env, timeout=SLOW_JOB_TIMEOUT)
    assert code == launch.EXIT_TIMEOUT, err[-3000:]
    assert out.count(' of 2 ok') == 2, out
    # worker 0 waits for worker 1 in ps-lite's exit barrier: both are still running
    hung = re.search(r"\[launch\] hung at exit: (.*) not exited 3 s after every worker's "
                     r"script finished", err)
    assert hung and 'worker 1' in hung.group(1).split(', '), err[-3000:]
    assert 'timeout' not in err
    assert launch.EXIT_LINE not in out


def test_exit_line_is_the_hooks():
    """The launcher and kvstore_ext_autoload (which prints it) agree on the line."""
    import kvstore_ext_autoload
    assert kvstore_ext_autoload.EXIT_LINE == launch.EXIT_LINE
    assert kvstore_ext_autoload.LAUNCHER_VAR == launch.LAUNCHER_VAR
    assert launch.is_exit_line((launch.EXIT_LINE + '\n').encode())
    assert not launch.is_exit_line(b'[worker 0] ' + launch.EXIT_LINE.encode())


# a loaded machine (other jobs on 2 cores) can take a minute to start a job's nodes
SLOW_JOB_TIMEOUT = 200


def _job_sockets(tag):
    """{path: mode} of the socket files of the job's nodes (found by their tag): the
    scheduler's root port and every other node's PORT."""
    import stat
    found = {}
    for pid in tagged_nodes(tag):
        try:
            with open('/proc/%d/environ' % pid, 'rb') as f:
                env = dict(item.split(b'=', 1) for item in f.read().split(b'\0') if b'=' in item)
        except OSError:
            continue
        role = env.get(b'DMLC_ROLE')
        port = env.get(b'DMLC_PS_ROOT_PORT' if role == b'scheduler' else b'PORT')
        if port is None:
            continue
        path = launch.ipc_path(port.decode())
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISSOCK(info.st_mode):
            found[path] = stat.S_IMODE(info.st_mode)
    return found


def test_ipc_sockets_are_private_whatever_the_umask(job_env):
    """ps-lite binds /tmp/<port> with the node's umask; under umask 000 (containers)
    anyone could connect and kill the node with one malformed message. The launcher
    makes the job's socket files 0700 as they appear."""
    proc = subprocess.Popen(
        ['/bin/sh', '-c', 'umask 000; exec "$@"', 'sh', PY, LAUNCH, '-n', '1', '-s', '1']
        + kv_job('--hang'), env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    killer = threading.Timer(SLOW_JOB_TIMEOUT, proc.kill)
    killer.daemon = True
    killer.start()
    proc.killer = killer
    try:
        assert proc.stdout.readline() == '[worker 0] ready\n'
        deadline = time.monotonic() + 5
        while True:
            modes = _job_sockets(job_env[TAG_VAR])
            if len(modes) >= 3 and set(modes.values()) == {0o700} \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(modes) >= 3, modes      # scheduler, server, worker
        assert set(modes.values()) == {0o700}, {p: oct(m) for p, m in modes.items()}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        finally:
            finish(proc)


def test_next_launch_removes_socket_files_of_a_killed_launcher(job_env):
    """A SIGKILLed launcher leaves its nodes' /tmp/<port> files: the next launch
    removes this user's files that nobody listens on (older than STALE_AGE), and
    leaves a live one alone."""
    import socket
    made = []
    try:
        paths = []
        for listening in (False, True):
            while True:
                path = launch.ipc_path(launch.free_port())
                if not os.path.exists(path):
                    break
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
            made.append((path, sock))
            if listening:
                sock.listen(1)
            else:
                sock.close()                 # the file stays: a dead node's socket
            old = time.time() - 2 * launch.STALE_AGE
            os.utime(path, (old, old))
            paths.append(path)
        dead, live = paths
        code, out, err, _ = run_launcher(['-n', '1', '-s', '1'] + kv_job(), job_env,
                                         timeout=SLOW_JOB_TIMEOUT)
        assert code == 0, err[-3000:]
        assert not os.path.exists(dead), 'stale socket file %s left' % dead
        assert os.path.exists(live), 'a socket somebody listens on was removed'
    finally:
        for path, sock in made:
            sock.close()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
