"""Start a distributed MXNet job (ps-lite): one scheduler, S servers, W workers.

    python -m kvstore_ext.launch -n 4 -s 2 python train.py --kvstore dist_sync_hylo

Why our own launcher rather than MXNet's ``tools/launch.py``:

* ``tools/launch.py`` dies on Python >= 3.9: its ``dmlc_tracker`` calls
  ``threading.Thread.isAlive``, which was removed. (``run_mxnet_tools_launch`` below
  makes it usable again; see docs/LAUNCH.md.)
* ps-lite reads the variable ``PORT`` as the node's own port. Many shells and
  platforms set it; then a node can grab the scheduler's port and start-up dies with
  ``Check failed: is_scheduler_``. Every node here gets an environment without ``PORT``.
* dmlc's local launcher advertises the machine's external address, and crashes
  (``Network is unreachable``) where there is none. Local jobs here live on loopback:
  ``DMLC_PS_ROOT_URI`` and ``DMLC_NODE_HOST`` are 127.0.0.1 and the root port is a
  free port picked by the launcher.
* dmlc's launchers are not all-or-nothing: when a worker dies the others wait forever.
  Here, when any node fails, every node is stopped and the launcher exits non-zero
  naming it; ``--timeout``, Ctrl-C and SIGTERM stop everything too. Each node runs
  in its own process group (killed as a group) and dies with the launcher
  (PR_SET_PDEATHSIG) even if the launcher is SIGKILLed.
* Output is prefixed per node (``[worker 1] ...``), whole lines at a time.

The ``worker N`` / ``server N`` labels are launch indices (also exported as
``DMLC_WORKER_ID`` / ``DMLC_SERVER_ID``); ps-lite's scheduler assigns ``kv.rank`` on
its own, so the two need not match. A worker that prints ``announce_rank(kv.rank)``'s
line once its kvstore exists (the training scripts do) is labelled by rank from then
on (``[rank 0] ...``), and the launcher says which launch index that is
(``[launch] worker 1 is kv.rank 0``).

This module starts processes only: it imports nothing from kvstore_ext and never
imports mxnet, so it also runs as a plain script (``python kvstore_ext/launch.py``).
"""
import argparse
import ctypes
import importlib.util
import os
import re
import runpy
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

LOOPBACK = '127.0.0.1'
KILL_GRACE = 3.0        # seconds between SIGTERM and SIGKILL when stopping nodes
SHUTDOWN_GRACE = 10.0   # seconds servers/scheduler get to exit once workers are done
EXIT_GRACE = 30.0       # seconds a node gets to exit once every worker's script is done
POLL_INTERVAL = 0.05
EXIT_TIMEOUT = 124      # as timeout(1)
SSH_DEFAULT = 'ssh -o StrictHostKeyChecking=no'
# Variables exported to remote nodes (local nodes inherit everything): dmlc's list,
# plus what our servers need to import kvstore_ext and to agree with the workers.
SSH_FORWARDED = ('OMP_NUM_THREADS', 'KMP_AFFINITY', 'LD_LIBRARY_PATH', 'DMLC_INTERFACE',
                 'AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'PYTHONPATH')
SSH_FORWARDED_PREFIXES = ('MXNET_', 'PS_', 'KVSTORE_EXT_')
PR_SET_PDEATHSIG = 1
# The line a worker prints to tell the launcher its kv.rank (see announce_rank).
RANK_LINE = '[kvstore_ext.launch] kv.rank %d'
_RANK_LINE_RE = re.compile(rb'^\[kvstore_ext\.launch\] kv\.rank (\d+)\r?\n?$')
# The line a worker prints at exit, once its script is done (kvstore_ext_autoload.py
# prints it for any dist kvstore, kvstore_ext/shutdown.py for ours), when started by
# this launcher, which sets LAUNCHER_VAR in workers' environments.
EXIT_LINE = '[kvstore_ext.launch] script finished, exiting'
LAUNCHER_VAR = 'KVSTORE_EXT_LAUNCHER'


@dataclass
class NodeSpec:
    """One process to start: ``argv`` with exactly ``env``."""
    role: str               # 'scheduler', 'server' or 'worker'
    rank: int
    argv: list
    env: dict
    host: str = LOOPBACK

    @property
    def name(self):
        return 'scheduler' if self.role == 'scheduler' else '%s %d' % (self.role, self.rank)


# ------------------------------------------------------------ worker side

def announce_rank(rank, out=None):
    """Tell the launcher this worker's ``kv.rank``: one line on stdout, printed once the
    kvstore exists. Our launcher then labels the worker's output ``[rank R]`` instead
    of its launch index; under any other launcher it is an ordinary log line."""
    out = sys.stdout if out is None else out
    out.write(RANK_LINE % int(rank) + '\n')
    out.flush()


def is_exit_line(line):
    """True for the line (bytes) a worker prints when its script is done."""
    return line.rstrip(b'\r\n') == EXIT_LINE.encode()


def parse_rank_line(line):
    """The rank in an ``announce_rank`` line (bytes), else None."""
    match = _RANK_LINE_RE.match(line)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------- environments

def free_port(host=LOOPBACK):
    """A port nobody listens on right now, for the scheduler (small race, as dmlc)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------- IPC: ps-lite over Unix sockets
#
# With DMLC_LOCAL=1 ps-lite binds and connects ipc:///tmp/<port> (ZeroMQ over Unix
# domain sockets) instead of tcp://: a one-host job then has no TCP listener at all, so
# nothing off the host (or in another network namespace) can reach MXNet's server,
# which unpickles what it receives. Measured: the 4 processes of a 2-worker job listen
# on 4 TCP ports without it and on none with it (tests/test_launch.py).

IPC_DIR = '/tmp'


def ipc_path(port):
    return os.path.join(IPC_DIR, str(port))


def reserve_ports(count, host=LOOPBACK):
    """``count`` distinct TCP ports, held (bound, not listening) by this process until
    their sockets are closed, whose ``/tmp/<port>`` does not exist.

    Why: with DMLC_LOCAL a ps-lite node binds ``ipc:///tmp/<port>`` at a port it picks
    by binding TCP port 0 and letting go (ps-lite's GetAvailablePort); nothing holds
    that number in TCP any more, so two nodes (or a node and the scheduler's root
    port, which the launcher has just let go of) can draw the same one, and ZeroMQ then
    silently takes the other's socket file (a CI run met it: ``Check failed:
    is_scheduler_``, a worker bound the scheduler's port). The launcher gives every
    node its own reserved port instead (PORT, which ps-lite takes as the node's port)."""
    held = []
    while len(held) < count:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
        if os.path.exists(ipc_path(sock.getsockname()[1])):
            sock.close()
            continue
        held.append(sock)
    return held


STALE_AGE = 10.0    # a socket file nobody listens on, older than this, is left over


def remove_stale_ipc_sockets(since=None, min_age=0.0):
    """Unlink this user's IPC socket files (``/tmp/<digits>``) that nobody listens on:
    a node killed by a signal leaves its file behind, and so do all the nodes of a
    launcher that was SIGKILLed (nobody is left to clean up: the next launch does).

    ``since``: only files made since then (epoch seconds; the end of a job, for its
    own nodes). ``min_age``: only files at least that old (the start of a job, for
    files of earlier jobs: a node of a job starting at the same moment may have bound
    its file and not yet listen, and must not lose it). Other users' files are never
    touched."""
    import stat
    now = time.time()
    for name in os.listdir(IPC_DIR):
        path = os.path.join(IPC_DIR, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not (name.isdigit() and stat.S_ISSOCK(info.st_mode)
                and info.st_uid == os.getuid()
                and (since is None or info.st_mtime >= since)
                and now - info.st_mtime >= min_age):
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)     # a live node with a full backlog must not block us
            try:
                sock.connect(path)
            except ConnectionRefusedError:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            except OSError:
                pass


def ipc_socket_paths(specs):
    """The socket files the nodes of an ipc job bind: the scheduler's root port, and
    each other node's PORT (job_specs gives each its own)."""
    paths = []
    for spec in specs:
        if spec.env.get('DMLC_LOCAL') != '1':
            continue
        port = spec.env.get('DMLC_PS_ROOT_PORT' if spec.role == 'scheduler' else 'PORT')
        if port:
            paths.append(ipc_path(port))
    return paths


class PrivateSockets:
    """Makes the job's IPC socket files 0700 as soon as they appear.

    Why: ps-lite hard-codes ``ipc:///tmp/<port>`` (zmq_van.h), so the files cannot go
    into a private directory; ZeroMQ creates them with the node's umask. Connecting to
    a Unix socket needs write permission on its file: under the usual umask 022 (files
    0755) other users cannot connect, but under 002 or 000 (common in containers) the
    group or everyone could, and any malformed message aborts the node (ps-lite's
    protobuf check) and with it the job. Changing the nodes' umask would change the
    mode of every file the user's script writes, so the launcher chmods the sockets
    instead, within a poll interval of their creation."""

    def __init__(self, paths):
        self.pending = set(paths)

    def tighten(self):
        import stat
        for path in list(self.pending):
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue                 # not bound yet
            except OSError:
                info = None
            # only our own socket (never follow a link someone put there)
            if info is not None and stat.S_ISSOCK(info.st_mode) \
                    and info.st_uid == os.getuid():
                try:
                    os.chmod(path, 0o700)
                except OSError:
                    pass
            self.pending.discard(path)


def parse_env_pairs(pairs):
    """['K=V', ...] -> {'K': 'V'}; rejects entries without '='."""
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition('=')
        if not sep or not key:
            raise ValueError('--env expects KEY=VALUE, got %r' % pair)
        env[key] = value
    return env


def cluster_env(num_workers, num_servers, root_uri, root_port):
    """Variables every node of the job shares."""
    return {'DMLC_NUM_WORKER': str(num_workers), 'DMLC_NUM_SERVER': str(num_servers),
            'DMLC_PS_ROOT_URI': root_uri, 'DMLC_PS_ROOT_PORT': str(root_port)}


# Servers and the scheduler compute no model: one OpenMP thread each. With more, the
# row_sparse ops of server-side decoding start parallel sections whose helper threads
# spin-wait on cores every node shares (measured, 4 workers + 2 servers on 2 cores:
# 71% of a server's CPU in libgomp's wait loop; 20 -> 4.4 ms of server CPU a step).
NON_WORKER_ENV = {'OMP_NUM_THREADS': '1'}


def role_env(role, rank, node_host):
    """Variables that differ per node (ids as dmlc_tracker sets them)."""
    env = {'DMLC_ROLE': role, 'DMLC_NODE_HOST': node_host}
    if role == 'worker':
        env['DMLC_WORKER_ID'] = str(rank)
        env[LAUNCHER_VAR] = '1'         # workers print EXIT_LINE when their script is done
    else:
        env.update(NON_WORKER_ENV)
        if role == 'server':
            env['DMLC_SERVER_ID'] = str(rank)
    return env


def without_port(env):
    """Copy of ``env`` without PORT, which ps-lite would take as the node's own port."""
    env = dict(env)
    env.pop('PORT', None)
    return env


def role_counts(num_workers, num_servers):
    """(role, rank) of every node, scheduler first, then servers, then workers."""
    return ([('scheduler', 0)] + [('server', i) for i in range(num_servers)]
            + [('worker', i) for i in range(num_workers)])


def local_nodes(num_workers, num_servers, command, server_command, root_port,
                extra_env=None, base_env=None):
    """NodeSpecs of a job on loopback; children inherit ``base_env`` minus PORT."""
    base = without_port(os.environ if base_env is None else base_env)
    base.setdefault('PYTHONUNBUFFERED', '1')     # so prefixed lines arrive as printed
    base.update(cluster_env(num_workers, num_servers, LOOPBACK, root_port))
    base.update(extra_env or {})
    nodes = []
    for role, rank in role_counts(num_workers, num_servers):
        env = dict(base, **role_env(role, rank, LOOPBACK))
        argv = command if role == 'worker' else server_command
        nodes.append(NodeSpec(role, rank, list(argv), without_port(env)))
    return nodes


# ------------------------------------------------------------------------- ssh

def parse_hostfile(path):
    """[(host, ssh_port)] from MXNet's hostfile format: ``host[:port]`` a line.

    Blank lines and ``#`` comments are skipped; an MPI-style ``slots=N`` is ignored.
    """
    hosts = []
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].split('slots=', 1)[0].strip()
            if line:
                host, _, port = line.partition(':')
                hosts.append((host, port or '22'))
    if not hosts:
        raise ValueError('hostfile %s lists no host' % path)
    return hosts


def resolve_host_ip(host_ip=None):
    """The launching machine's address as dmlc_tracker guesses it ('auto'/'ip'/'dns')."""
    if host_ip not in (None, 'auto', 'ip', 'dns'):
        return host_ip
    if host_ip == 'dns':
        return socket.getfqdn()
    try:
        address = socket.gethostbyname(socket.getfqdn())
    except socket.gaierror:
        address = socket.gethostbyname(socket.gethostname())
    if address.startswith('127.'):
        try:   # the address of the default route (no packet is sent)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect(('10.255.255.255', 1))
                address = sock.getsockname()[0]
        except OSError:
            pass
    return address


def ssh_forwarded_env(env):
    """The launcher's variables worth exporting to remote nodes (never PORT)."""
    return {k: v for k, v in env.items()
            if k in SSH_FORWARDED or k.startswith(SSH_FORWARDED_PREFIXES)}


def remote_script(env, working_dir, command):
    """POSIX sh script one node runs: export env, drop PORT, run command.

    The command runs in the background while a watchdog reads the ssh channel's
    stdin: when the ssh connection goes away (the launcher stopped it or died), stdin
    ends and the watchdog kills the command, so no remote node outlives the launcher.
    """
    steps = ['export %s=%s' % (k, shlex.quote(str(v))) for k, v in env.items()]
    steps += ['unset PORT',
              'cd %s || exit 1' % shlex.quote(working_dir),
              '%s & pid=$!' % command,                  # the node, in the background
              'exec 3<&0',                              # keep the channel's stdin
              '{ cat <&3 >/dev/null 2>&1; kill -TERM $pid; } >/dev/null 2>&1 & exec 3<&-',
              'wait $pid']                              # the node's exit code is ours
    return '; '.join(steps)


def ssh_commands(hosts, num_workers, num_servers, command, server_command, host_ip,
                 root_port, extra_env=None, working_dir=None, ssh=SSH_DEFAULT,
                 base_env=None):
    """[(host, role, sh command line)] of an ssh job, scheduler first; pure, no I/O.

    As dmlc_tracker's ssh launcher: the scheduler runs on the launching machine
    (``host_ip``; its line is the script itself, run locally), servers then workers
    are dealt round-robin over ``hosts`` ([(host, ssh_port)]), and every node's
    environment is exported on its command line (the remote login shell must be
    sh-compatible, as for dmlc). ``command`` and ``server_command`` are argv lists.
    """
    base = ssh_forwarded_env(without_port(os.environ if base_env is None else base_env))
    base.update(cluster_env(num_workers, num_servers, host_ip, root_port))
    base.update(extra_env or {})
    base.pop('PORT', None)
    working_dir = working_dir or os.getcwd()
    commands = []
    index = 0
    for role, rank in role_counts(num_workers, num_servers):
        argv = command if role == 'worker' else server_command
        if role == 'scheduler':
            host, port = host_ip, None
        else:
            host, port = hosts[index % len(hosts)]
            index += 1
        env = dict(base, **role_env(role, rank, host))
        line = remote_script(env, working_dir, shlex.join(argv))
        if port is not None:
            line = '%s -p %s %s %s' % (ssh, port, shlex.quote(host), shlex.quote(line))
        commands.append((host, role, line))
    return commands


def ssh_nodes(commands):
    """NodeSpecs that run the ``ssh_commands`` lines locally through sh."""
    nodes = []
    ranks = {}
    env = without_port(os.environ)
    for host, role, line in commands:
        rank = ranks.get(role, 0)
        ranks[role] = rank + 1
        nodes.append(NodeSpec(role, rank, ['/bin/sh', '-c', line], env, host))
    return nodes


# ---------------------------------------------------------- network namespaces

def in_namespaces(specs, placement):
    """The same nodes, each run inside a network namespace (an emulated cluster).

    ``placement(spec) -> (netns, ip)``. Each node runs through ``ip netns exec NETNS``
    (root only), advertises ``ip`` (DMLC_NODE_HOST) and finds the scheduler at the
    scheduler's ``ip`` (DMLC_PS_ROOT_URI). Used by bench/cluster.py and --netns-prefix.
    """
    places = [placement(spec) for spec in specs]
    root_uri = [ip for spec, (_, ip) in zip(specs, places) if spec.role == 'scheduler'][0]
    return [replace(spec, argv=['ip', 'netns', 'exec', netns] + list(spec.argv), host=ip,
                    env=dict(spec.env, DMLC_NODE_HOST=ip, DMLC_PS_ROOT_URI=root_uri))
            for spec, (netns, ip) in zip(specs, places)]


def netns_name(prefix, role, rank):
    """--netns-prefix: PREFIX-scheduler, PREFIX-server-N, PREFIX-worker-N."""
    return '%s-%s' % (prefix, role) if role == 'scheduler' else '%s-%s-%d' % (prefix, role, rank)


def netns_ipv4(netns):
    """First global IPv4 address inside ``netns``."""
    out = subprocess.run(['ip', '-n', netns, '-4', '-o', 'addr', 'show', 'scope', 'global'],
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():       # "2: eth0    inet 10.0.0.3/24 ..."
        words = line.split()
        if 'inet' in words:
            return words[words.index('inet') + 1].split('/')[0]
    raise RuntimeError('network namespace %s has no IPv4 address%s'
                       % (netns, (': ' + out.stderr.strip()) if out.stderr.strip() else ''))


def prefix_placement(prefix):
    """placement for in_namespaces: existing namespaces named by ``netns_name``."""
    def placement(spec):
        netns = netns_name(prefix, spec.role, spec.rank)
        return netns, netns_ipv4(netns)
    return placement


# ------------------------------------------------------------------ processes

_libc = None


def _die_with_launcher():
    """preexec_fn: SIGKILL this child when the launcher dies (Linux; best effort)."""
    global _libc
    launcher = os.getpid()
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            _libc = False
    prctl = getattr(_libc, 'prctl', None)

    def preexec():
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher:     # launcher died before prctl took effect
            os._exit(1)
    return preexec


class Node:
    """A started NodeSpec: its process (leader of its own group), its exit, and the
    ``kv.rank`` a worker announced (``announce_rank``), which then labels it."""

    def __init__(self, spec, keep_stdin):
        self.spec = spec
        self.kv_rank = None
        self.script_done = False    # a worker printed EXIT_LINE: its script is done
        self.proc = subprocess.Popen(
            spec.argv, env=spec.env, start_new_session=True,
            preexec_fn=_die_with_launcher(),
            stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.returncode = None

    @property
    def name(self):
        """For the launcher's messages: ``worker 1``, or ``worker 1 (kv.rank 0)``."""
        if self.kv_rank is None:
            return self.spec.name
        return '%s (kv.rank %d)' % (self.spec.name, self.kv_rank)

    @property
    def label(self):
        """The prefix of the node's output lines: ``rank R`` once a worker announced
        its kv.rank, else the launch label (``worker 1``, ``server 0``, ``scheduler``)."""
        if self.kv_rank is None:
            return self.spec.name
        return 'rank %d' % self.kv_rank

    def poll(self):
        """Exit code once the node has exited (negative: killed by that signal)."""
        if self.returncode is None:
            self.returncode = self.proc.poll()
        return self.returncode

    def signal_group(self, signum):
        """Send ``signum`` to the node's whole process group, if any is left."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class OutputForwarder:
    """Copies node output to ours, a whole line at a time, prefixed with the node's
    label. A worker's ``announce_rank`` line is not copied: it relabels the worker and
    the launcher says which launch index has which rank. Nor is its EXIT_LINE: it
    marks the worker's script as done (``supervise``)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threads = []

    def follow(self, stream, node, out):
        thread = threading.Thread(target=self._copy, args=(stream, node, out),
                                  daemon=True)
        thread.start()
        self.threads.append(thread)

    def _copy(self, stream, node, out):
        writable = True
        for line in iter(stream.readline, b''):
            if not line.endswith(b'\n'):
                line += b'\n'
            rank = parse_rank_line(line) if node.spec.role == 'worker' else None
            if node.spec.role == 'worker' and is_exit_line(line):
                node.script_done = True
                continue
            with self.lock:
                if rank is not None:
                    node.kv_rank = rank
                    say('%s is kv.rank %d; its lines are labelled [%s] from here'
                        % (node.spec.name, rank, node.label))
                    continue
                if writable:
                    try:
                        out.write(('[%s] ' % node.label).encode() + line)
                        out.flush()
                    except OSError:      # our output is gone (e.g. `| head`): keep
                        writable = False   # draining, or the node blocks on a full pipe
        stream.close()

    def join(self, timeout):
        """Wait for the streams to end (a stray grandchild may keep one open)."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def say(message):
    """The launcher's own messages, on stderr, prefixed like the nodes' lines."""
    sys.stderr.write('[launch] %s\n' % message)
    sys.stderr.flush()


def describe_exit(code):
    if code < 0:
        try:
            return 'was killed by signal %d (%s)' % (-code, signal.Signals(-code).name)
        except ValueError:
            return 'was killed by signal %d' % -code
    return 'exited with code %d' % code


def launcher_exit_code(node_code):
    """Our exit code for a node that failed with ``node_code``."""
    return node_code if 0 < node_code < 256 else 128 + (-node_code if node_code < 0 else 1)


class StopRequest:
    """Records SIGINT/SIGTERM/SIGHUP sent to the launcher; the supervision loop acts."""

    def __init__(self):
        self.signum = None
        self.previous = {}

    def install(self):
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        self.signum = signum

    def restore(self):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def start_nodes(specs, keep_stdin):
    """Start every node, or none: those started are stopped if one fails to start.

    No thread of ours runs yet (output threads start after the last fork), which
    keeps preexec_fn safe.
    """
    nodes = []
    try:
        for spec in specs:
            nodes.append(Node(spec, keep_stdin))
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


def forward_output(nodes):
    forwarder = OutputForwarder()
    for node in nodes:
        forwarder.follow(node.proc.stdout, node, sys.stdout.buffer)
        forwarder.follow(node.proc.stderr, node, sys.stderr.buffer)
    return forwarder


def stop_nodes(nodes, grace=KILL_GRACE):
    """SIGTERM every node's group, SIGKILL after ``grace`` seconds, reap them all."""
    for node in nodes:
        if node.proc.stdin:
            try:
                node.proc.stdin.close()      # ends remote watchdogs (ssh)
            except OSError:
                pass
        node.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(n.poll() is None for n in nodes):
        time.sleep(POLL_INTERVAL)
    for node in nodes:
        node.signal_group(signal.SIGKILL)    # also strays left in a finished group
        node.proc.wait()
        node.poll()


def supervise(nodes, timeout, stop, shutdown_grace=SHUTDOWN_GRACE,
              exit_grace=EXIT_GRACE, on_poll=None):
    """Watch the nodes until the job is over; return the launcher's exit code.

    Fails on the first node to exit non-zero, on ``timeout`` and on a stop signal.
    Succeeds once every worker exited 0 and the others followed (or, after
    ``shutdown_grace`` seconds, were left to be killed). Once every worker's script is
    done (it exited 0 or printed EXIT_LINE), a worker that has not exited
    ``exit_grace`` seconds later hangs in MXNet's shutdown: it is named and the job
    ends (exit 124) instead of waiting for ``timeout``. ``on_poll()`` runs every
    round (the job's IPC sockets are made private there).
    """
    started = time.monotonic()
    workers_done_at = scripts_done_at = None
    while True:
        if on_poll is not None:
            on_poll()
        if stop.signum is not None:
            say('received %s; stopping all nodes' % signal.Signals(stop.signum).name)
            return 128 + stop.signum
        # one reading of every node a round: a node that fails between two readings
        # must not make the job look finished before its failure is seen
        codes = [node.poll() for node in nodes]
        for node, code in zip(nodes, codes):
            if code:
                say('%s %s; stopping all nodes' % (node.name, describe_exit(code)))
                return launcher_exit_code(code)
        now = time.monotonic()
        workers = [(node, code) for node, code in zip(nodes, codes)
                   if node.spec.role == 'worker']
        if workers_done_at is None and all(code == 0 for node, code in workers):
            workers_done_at = now
        if all(code is not None for code in codes):
            return 0
        if scripts_done_at is None and all(code == 0 or getattr(node, 'script_done', False)
                                           for node, code in workers):
            scripts_done_at = now
        if workers_done_at is not None and now - workers_done_at > shutdown_grace:
            left = ', '.join(n.name for n in nodes if n.poll() is None)
            say('all workers finished; %s still running after %.0f s, killing'
                % (left, shutdown_grace))
            return 0
        if workers_done_at is None and scripts_done_at is not None \
                and now - scripts_done_at > exit_grace:
            hung = [node.name for node, code in workers if code is None]
            left = [n.name for n in nodes if n.poll() is None and n.spec.role != 'worker']
            say('hung at exit: %s not exited %.0f s after every worker\'s script '
                'finished (MXNet\'s shutdown, see docs/LAUNCH.md; a worker waiting in '
                'its exit barrier for a hung one is named too); still running: %s; '
                'stopping all nodes' % (', '.join(hung), exit_grace, ', '.join(hung + left)))
            return EXIT_TIMEOUT
        if timeout is not None and now - started > timeout:
            say('timeout: job still running after %g s; stopping all nodes' % timeout)
            return EXIT_TIMEOUT
        time.sleep(POLL_INTERVAL)


def run_job(specs, timeout=None, keep_stdin=False, shutdown_grace=SHUTDOWN_GRACE,
            exit_grace=EXIT_GRACE):
    """Start ``specs``, supervise them all-or-nothing, stop what is left; exit code."""
    sockets = PrivateSockets(ipc_socket_paths(specs))
    stop = StopRequest()
    stop.install()
    try:
        nodes = start_nodes(specs, keep_stdin)
    except OSError as e:
        stop.restore()
        say('cannot start the job: %s' % e)
        return 127
    forwarder = forward_output(nodes)
    try:
        code = supervise(nodes, timeout, stop, shutdown_grace, exit_grace, sockets.tighten)
    finally:
        stop_nodes(nodes)
        stop.restore()
    forwarder.join(timeout=2.0)
    return code


# ----------------------------------------------- MXNet's own tools/launch.py

def mxnet_tools_launch_path():
    """Path of the installed MXNet's tools/launch.py, found without importing mxnet."""
    spec = importlib.util.find_spec('mxnet')
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError('mxnet is not installed')
    return os.path.join(list(spec.submodule_search_locations)[0], 'tools', 'launch.py')


def _tools_launcher_kind(argv):
    """Value of --launcher in tools/launch.py arguments (its default is ssh)."""
    for i, arg in enumerate(argv):
        if arg == '--launcher' and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith('--launcher='):
            return arg.split('=', 1)[1]
    return 'ssh'


def run_mxnet_tools_launch(argv=None):
    """Run MXNet's tools/launch.py with ``argv``, fixed for Python >= 3.9 and loopback.

    Restores ``Thread.isAlive`` for dmlc_tracker, removes PORT from the environment
    the nodes inherit, and for ``--launcher local`` puts the whole job on 127.0.0.1:
    dmlc overwrites DMLC_PS_ROOT_URI with its guess of the machine's address and
    tools/launch.py has no --host-ip, so the guess itself is replaced; each node's
    own address comes from DMLC_NODE_HOST, which the nodes inherit.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    threading.Thread.isAlive = threading.Thread.is_alive
    os.environ.pop('PORT', None)
    if _tools_launcher_kind(argv) == 'local':
        import dmlc_tracker.tracker
        dmlc_tracker.tracker.get_host_ip = lambda host_ip=None: LOOPBACK
        os.environ['DMLC_NODE_HOST'] = LOOPBACK
    path = mxnet_tools_launch_path()
    sys.argv = [path] + argv
    runpy.run_path(path, run_name='__main__')


# ------------------------------------------------------------------------ CLI

EPILOG = """\
local (default): scheduler, servers and workers on this host, root port picked free
  (or --port), connected over Unix sockets /tmp/<port> (--transport ipc, the default:
  DMLC_LOCAL=1, no TCP port open) or over 127.0.0.1 (--transport tcp). Workers run COMMAND; scheduler and servers run
  "python -c 'import mxnet'" (MXNet runs the server loop inside the import), or
  --server-command. Nodes inherit this environment (PYTHONPATH included) minus PORT,
  plus DMLC_ROLE, DMLC_PS_ROOT_URI/PORT, DMLC_NODE_HOST, DMLC_NUM_WORKER/SERVER,
  DMLC_WORKER_ID/SERVER_ID and --env pairs.
--netns-prefix P (local, root): each node runs in an existing network namespace
  (P-scheduler, P-server-N, P-worker-N; e.g. made by bench/netns.py up) via
  "ip netns exec", with DMLC_NODE_HOST = its namespace's IPv4 address and
  DMLC_PS_ROOT_URI = the scheduler's.
ssh: the scheduler runs here (at --host-ip), servers then workers round-robin over
  the hostfile's hosts (one 'host[:port]' a line), each through
  "ssh host 'export ...; unset PORT; cd DIR; COMMAND'"; the default server command is
  COMMAND itself (as dmlc_tracker does).

All-or-nothing: if any node exits non-zero, all are stopped and the launcher exits
non-zero naming it. --timeout, Ctrl-C and SIGTERM stop everything (exit 124, 130, 143).
Hangs at exit: a worker whose script is done (it exited 0, or printed the line that
kvstore_ext prints at exit for any dist kvstore) and that has not exited --exit-grace
seconds after every worker's script was done is named, and the job stops (exit 124).
ipc socket files are made 0700 as they appear; at start, this user's socket files in
/tmp that nobody listens on (left by a SIGKILLed launcher) are removed.
Each node is its own process group (killed as a group) and dies with the launcher.
Output lines are prefixed "[worker 1] ", "[server 0] ", "[scheduler] ".
Labels are launch indices; ps-lite assigns kv.rank independently. A worker that
announces its kv.rank (the training scripts do: kvstore_ext.launch.announce_rank)
is labelled "[rank R] " from then on, after a line "[launch] worker N is kv.rank R".
PORT is removed because ps-lite takes it as each node's own port; with --transport
ipc each server and worker gets PORT = a port the launcher holds for the job, so that
no two nodes name the same /tmp/<port> socket.

MXNet's own tools/launch.py on Python >= 3.9 (isAlive fix, loopback for local):
  python -c 'import kvstore_ext.launch as L; L.run_mxnet_tools_launch()' \\
      -n 2 -s 1 --launcher local python script.py        (see docs/LAUNCH.md)
"""


def build_parser():
    parser = argparse.ArgumentParser(
        prog='python -m kvstore_ext.launch',
        description='Start an MXNet ps-lite job: one scheduler, SERVERS servers and\n'
                    'WORKERS workers running COMMAND; all-or-nothing.',
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('-n', '--num-workers', type=int, required=True, metavar='WORKERS',
                        help='number of workers (each runs COMMAND)')
    parser.add_argument('-s', '--num-servers', type=int, metavar='SERVERS',
                        help='default: WORKERS, as MXNet\'s tools/launch.py')
    parser.add_argument('--launcher', choices=['local', 'ssh'], default='local')
    parser.add_argument('-H', '--hostfile', help='ssh: one host[:port] a line')
    parser.add_argument('--timeout', type=float, metavar='SECONDS',
                        help='stop the job after SECONDS (exit 124)')
    parser.add_argument('--exit-grace', type=float, default=EXIT_GRACE, metavar='SECONDS',
                        help='once every worker\'s script is done, a worker still running '
                             'SECONDS later is named as hung in shutdown and the job '
                             'stops (exit 124; default %(default)g)')
    parser.add_argument('--env', action='append', default=[], metavar='K=V',
                        help='set K=V on every node (repeatable)')
    parser.add_argument('--server-command', metavar='CMD',
                        help='command line of the scheduler and servers '
                             '(local default: python -c "import mxnet"; ssh: COMMAND)')
    parser.add_argument('--port', type=int, help='scheduler port (default: a free one)')
    parser.add_argument('--host-ip', default='auto',
                        help='ssh: scheduler address the nodes connect to '
                             '(default: guessed as dmlc_tracker does)')
    parser.add_argument('--netns-prefix', metavar='PREFIX',
                        help='local: run each node in network namespace '
                             'PREFIX-scheduler / PREFIX-server-N / PREFIX-worker-N (root)')
    parser.add_argument('--transport', choices=['ipc', 'tcp'],
                        help='local: ipc (default: ps-lite over Unix sockets in /tmp, '
                             'no TCP port open) or tcp (127.0.0.1); --netns-prefix and '
                             'ssh: tcp')
    parser.add_argument('--working-dir', help='ssh: remote directory (default: cwd)')
    parser.add_argument('--ssh', default=SSH_DEFAULT, metavar='CMD',
                        help='ssh: client command (default: %(default)s)')
    parser.add_argument('command', nargs=argparse.REMAINDER, metavar='COMMAND...',
                        help='what each worker runs, e.g. python train.py --kvstore ...')
    return parser


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command[:1] == ['--']:
        args.command = args.command[1:]
    if not args.command:
        parser.error('COMMAND is required')
    if args.num_servers is None:
        args.num_servers = args.num_workers
    if args.num_workers < 1 or args.num_servers < 1:
        parser.error('-n and -s must be at least 1')
    if args.launcher == 'ssh' and not args.hostfile:
        parser.error('--launcher ssh needs -H HOSTFILE')
    if args.launcher == 'ssh' and args.netns_prefix:
        parser.error('--netns-prefix places local nodes; not with --launcher ssh')
    if args.transport is None:
        args.transport = 'ipc' if args.launcher == 'local' and not args.netns_prefix \
            else 'tcp'
    if args.transport == 'ipc' and (args.launcher == 'ssh' or args.netns_prefix):
        parser.error('--transport ipc connects processes of one host through /tmp: not '
                     'with --launcher ssh or --netns-prefix (the links would be bypassed)')
    try:
        args.env = parse_env_pairs(args.env)
    except ValueError as e:
        parser.error(str(e))
    return args


def job_specs(args):
    """(NodeSpecs for the parsed command line, sockets the job's ports are held by:
    close them when the job has ended)."""
    held = []
    if args.launcher == 'local':
        server = (shlex.split(args.server_command) if args.server_command
                  else [sys.executable, '-c', 'import mxnet'])
        env = dict(args.env)
        if args.transport == 'ipc':
            env['DMLC_LOCAL'] = '1'
            held = reserve_ports(1 + args.num_workers + args.num_servers)
            ports = [sock.getsockname()[1] for sock in held]
            port = args.port or ports[0]
        else:
            port = args.port or free_port(LOOPBACK)
        nodes = local_nodes(args.num_workers, args.num_servers, args.command, server,
                            port, env)
        if args.transport == 'tcp':
            for node in nodes:
                node.env.pop('DMLC_LOCAL', None)
        else:
            for node, own in zip(nodes[1:], ports[1:]):     # servers and workers
                node.env['PORT'] = str(own)
        if args.netns_prefix:
            nodes = in_namespaces(nodes, prefix_placement(args.netns_prefix))
        return nodes, held
    server = shlex.split(args.server_command) if args.server_command else args.command
    port = args.port or free_port('')
    commands = ssh_commands(parse_hostfile(args.hostfile), args.num_workers,
                            args.num_servers, args.command, server,
                            resolve_host_ip(args.host_ip), port, args.env,
                            args.working_dir, args.ssh)
    return ssh_nodes(commands), held


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.transport == 'ipc':     # files of nodes whose launcher was SIGKILLed
        remove_stale_ipc_sockets(min_age=STALE_AGE)
    try:
        specs, held = job_specs(args)
    except RuntimeError as e:       # e.g. a --netns-prefix namespace without address
        say('cannot start the job: %s' % e)
        return 2
    started = time.time() - 1
    try:
        return run_job(specs, timeout=args.timeout, keep_stdin=args.launcher == 'ssh',
                       exit_grace=args.exit_grace)
    finally:
        for sock in held:
            sock.close()
        if args.transport == 'ipc':
            remove_stale_ipc_sockets(started)


if __name__ == '__main__':
    sys.exit(main())
