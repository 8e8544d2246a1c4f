"""An emulated cluster on one machine: a network namespace per node, a bridge, tc links.

Why namespaces: on loopback every byte moves at memory speed, so no compression
scheme can show what it saves. Here each node (scheduler, server, worker) has its own
network stack and one link to a switch, shaped like a real NIC.

Layout (everything lives in namespaces named ``PREFIX-...``; the root namespace and
its interfaces are never touched, not even transiently):

    PREFIX-hub            a bridge ``br0``; one port per node (``h-worker0``, ...)
    PREFIX-worker-0       ``eth0`` = the other end of ``h-worker0``, ``10.212.0.x/24``
    ...

Each veth pair is created inside the hub namespace with its peer placed directly in
the node's namespace. A link is shaped in both directions: ``tbf`` on the node's
``eth0`` egress (what the node sends) and on the hub port's egress (what it
receives), so it behaves as a full-duplex link of ``rate``. ``--delay`` adds ``netem``
(half of the one-way delay on each end), if the kernel has it.

    python bench/netns.py up -n 2 -s 1 --rate 100mbit     # then kvstore_ext/launch.py
    python bench/netns.py down                            #   --netns-prefix kvxc ...

Needs root. Pure helpers (names, address plan, tc argv) are unit-tested without it.
"""
import argparse
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

DEFAULT_PREFIX = 'kvxc'
DEFAULT_SUBNET = '10.212.0.0/24'      # private; exists only inside our namespaces
NODE_IF = 'eth0'
BRIDGE = 'br0'
TBF_QUEUE_S = 0.1                     # tbf queue ('latency'): 100 ms of traffic
TBF_MIN_BURST = 128 * 1024            # >= a 64 KiB GSO packet, so tbf need not cut it
TBF_BURST_S = 0.002                   # or 2 ms of traffic at fast rates


# ------------------------------------------------------------------ pure parts

def netns_name(prefix, role, rank):
    """Namespace of a node; kvstore_ext/launch.py --netns-prefix uses the same names."""
    return '%s-%s' % (prefix, role) if role == 'scheduler' else '%s-%s-%d' % (prefix, role, rank)


def hub_name(prefix):
    return '%s-hub' % prefix


@dataclass(frozen=True)
class Host:
    """One node's place in the cluster."""
    role: str
    rank: int
    netns: str
    ip: str
    hub_if: str           # its port on the bridge (interface in the hub namespace)

    @property
    def name(self):
        return 'scheduler' if self.role == 'scheduler' else '%s %d' % (self.role, self.rank)


def address_plan(prefix, num_workers, num_servers, subnet=DEFAULT_SUBNET):
    """Hosts in launch order (scheduler, servers, workers), addresses from ``subnet``.

    The scheduler gets the subnet's first host address, the others follow in order.
    """
    net = ipaddress.ip_network(subnet)
    roles = ([('scheduler', 0)] + [('server', i) for i in range(num_servers)]
             + [('worker', i) for i in range(num_workers)])
    addresses = net.hosts()
    hosts = []
    for role, rank in roles:
        try:
            ip = str(next(addresses))
        except StopIteration:
            raise ValueError('%s has room for %d hosts, the job needs %d'
                             % (subnet, net.num_addresses - 2, len(roles))) from None
        hub_if = 'h-sched' if role == 'scheduler' else 'h-%s%d' % (role, rank)
        if len(hub_if) > 15:
            raise ValueError('interface name %r too long (Linux: 15 characters)' % hub_if)
        hosts.append(Host(role, rank, netns_name(prefix, role, rank), ip, hub_if))
    return hosts


UNITS = {'bit': 1, 'kbit': 1e3, 'mbit': 1e6, 'gbit': 1e9,
         'bps': 8, 'kbps': 8e3, 'mbps': 8e6, 'gbps': 8e9}   # tc's: 'bps' = bytes/s


UNSHAPED = 'none'                     # a rate: no tbf, the veth's own speed


def parse_rate(text):
    """'100mbit' -> 100e6 bits per second (tc's units; a bare number is bit/s);
    'none' (UNSHAPED) -> inf: the link is left unshaped."""
    if str(text).strip().lower() == UNSHAPED:
        return float('inf')
    match = re.fullmatch(r'\s*([0-9.]+)\s*([a-zA-Z]*)\s*', str(text))
    unit = match.group(2).lower() if match else ''
    if not match or (unit and unit not in UNITS):
        raise ValueError('rate %r: expected a number and one of %s' % (text, ', '.join(UNITS)))
    return float(match.group(1)) * UNITS[unit or 'bit']


def parse_delay(text):
    """'2ms' -> 0.002 seconds ('us', 'ms', 's'; a bare number is milliseconds)."""
    match = re.fullmatch(r'\s*([0-9.]+)\s*(us|ms|s|)\s*', str(text))
    if not match:
        raise ValueError('delay %r: expected e.g. 500us, 2ms' % text)
    return float(match.group(1)) * {'us': 1e-6, 'ms': 1e-3, 's': 1.0, '': 1e-3}[match.group(2)]


def format_rate(bits_per_s):
    if bits_per_s == float('inf'):
        return UNSHAPED
    for unit, scale in (('gbit', 1e9), ('mbit', 1e6), ('kbit', 1e3)):
        if bits_per_s >= scale and bits_per_s % scale == 0:
            return '%d%s' % (bits_per_s // scale, unit)
    return '%dbit' % bits_per_s


def shaping_commands(netns, dev, rate_bps, delay_s=0.0):
    """argv lists that shape ``dev``'s egress in ``netns``: tbf, behind netem if delayed.

    tbf: ``burst`` holds a whole 64 KiB GSO packet (or 2 ms of traffic), the queue
    holds 100 ms of traffic, so TCP rarely sees drops at these rates. An infinite
    rate (UNSHAPED) adds no tbf: nothing at all without a delay, netem alone with one.
    """
    tc = ['tc', '-n', netns, 'qdisc']
    if rate_bps == float('inf'):
        if delay_s <= 0:
            return []
        return [tc + ['replace', 'dev', dev, 'root', 'handle', '1:', 'netem',
                      'delay', '%dus' % round(delay_s * 1e6), 'limit', '100000']]
    rate_bytes = rate_bps / 8
    burst = int(max(TBF_MIN_BURST, rate_bytes * TBF_BURST_S))
    tbf = ['tbf', 'rate', '%dbit' % rate_bps, 'burst', str(burst),
           'latency', '%dms' % (TBF_QUEUE_S * 1000)]
    if delay_s <= 0:
        return [tc + ['replace', 'dev', dev, 'root', 'handle', '1:'] + tbf]
    return [tc + ['replace', 'dev', dev, 'root', 'handle', '1:', 'netem',
                  'delay', '%dus' % round(delay_s * 1e6), 'limit', '100000'],
            tc + ['replace', 'dev', dev, 'parent', '1:1', 'handle', '10:'] + tbf]


def link_shaping_commands(hub, host, rate_bps, delay_s=0.0):
    """Both directions of one node's link; ``delay_s`` is the one-way node-to-node
    delay: a packet crosses two shaped egresses (sender's eth0, receiver's hub port),
    so each adds half."""
    return (shaping_commands(host.netns, NODE_IF, rate_bps, delay_s / 2)
            + shaping_commands(hub, host.hub_if, rate_bps, delay_s / 2))


def setup_commands(hub, hosts, subnet=DEFAULT_SUBNET):
    """argv lists that build the cluster (namespaces, bridge, veths, addresses)."""
    prefix_len = ipaddress.ip_network(subnet).prefixlen
    cmds = [['ip', 'netns', 'add', hub],
            ['ip', '-n', hub, 'link', 'add', BRIDGE, 'type', 'bridge'],
            ['ip', '-n', hub, 'link', 'set', BRIDGE, 'addrgenmode', 'none'],
            ['ip', '-n', hub, 'link', 'set', BRIDGE, 'up']]
    for h in hosts:
        cmds += [['ip', 'netns', 'add', h.netns],
                 ['ip', '-n', h.netns, 'link', 'set', 'lo', 'up'],
                 ['ip', '-n', hub, 'link', 'add', h.hub_if, 'type', 'veth',
                  'peer', 'name', NODE_IF, 'netns', h.netns],
                 ['ip', '-n', hub, 'link', 'set', h.hub_if, 'addrgenmode', 'none'],
                 ['ip', '-n', h.netns, 'link', 'set', NODE_IF, 'addrgenmode', 'none'],
                 ['ip', '-n', hub, 'link', 'set', h.hub_if, 'master', BRIDGE],
                 ['ip', '-n', hub, 'link', 'set', h.hub_if, 'up'],
                 ['ip', '-n', h.netns, 'addr', 'add', '%s/%d' % (h.ip, prefix_len),
                  'dev', NODE_IF],
                 ['ip', '-n', h.netns, 'link', 'set', NODE_IF, 'up']]
    return cmds


def parse_link_stats(text):
    """``ip -s -j link show`` output -> {ifname: (rx_bytes, tx_bytes)}."""
    stats = {}
    for link in json.loads(text or '[]'):
        s = link.get('stats64') or link.get('stats') or {}
        stats[link['ifname']] = (int(s['rx']['bytes']), int(s['tx']['bytes']))
    return stats


# ------------------------------------------------------------------ running ip/tc

class CommandError(RuntimeError):
    pass


def run(argv, check=True):
    """Run one ip/tc command; its stdout. Errors name the command and its stderr."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise CommandError('%s: %s' % (' '.join(argv), done.stderr.strip()))
    return done.stdout


def available():
    """None if namespaces can be made here, else the reason why not."""
    if os.geteuid() != 0:
        return 'needs root (network namespaces, veth, tc)'
    for tool in ('ip', 'tc'):
        try:
            subprocess.run([tool, '-V'], capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return '%r (iproute2) is not available' % tool
    try:
        run(['ip', 'netns', 'list'])
    except CommandError as e:
        return '`ip netns` does not work: %s' % e
    return None


def is_ours(name, prefix):
    """A namespace name this module makes with ``prefix`` (of any cluster size)."""
    return re.fullmatch(re.escape(prefix) + r'-(hub|scheduler|server-\d+|worker-\d+)',
                        name) is not None


def list_namespaces(prefix):
    """Our namespaces with ``prefix``: PREFIX-hub, PREFIX-scheduler, PREFIX-worker-N..."""
    names = [line.split()[0] for line in run(['ip', 'netns', 'list']).splitlines()
             if line.strip()]
    return [n for n in names if is_ours(n, prefix)]


def namespace_pids(netns):
    out = run(['ip', 'netns', 'pids', netns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace_processes(names, grace=3.0):
    """SIGTERM, then SIGKILL, every process inside our namespaces ``names``.

    These can only be nodes we started there (or their children)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for n in names for p in namespace_pids(n)]
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for n in names for p in namespace_pids(n)]
            time.sleep(0.05)
        if not pids:
            return []
    return [p for n in names for p in namespace_pids(n)]


def remove_namespaces(prefix):
    """Remove our namespaces with ``prefix`` and the processes inside; the names
    removed. Used at start (stale ones of a killed run) and at the end."""
    names = list_namespaces(prefix)
    kill_namespace_processes(names)
    for name in names:
        run(['ip', 'netns', 'delete', name], check=False)
    left = list_namespaces(prefix)
    if left:
        raise CommandError('could not remove namespaces %s' % ', '.join(left))
    return names


class Cluster:
    """Namespaces, bridge and shaped links of one job layout; ``with`` removes them.

    ``create`` first removes stale namespaces with the same prefix (a run that was
    SIGKILLed leaves them behind).
    """

    def __init__(self, num_workers, num_servers, prefix=DEFAULT_PREFIX,
                 subnet=DEFAULT_SUBNET):
        self.prefix, self.subnet = prefix, subnet
        self.hub = hub_name(prefix)
        self.hosts = address_plan(prefix, num_workers, num_servers, subnet)
        self.stale = []

    def __enter__(self):
        self.create()
        return self

    def __exit__(self, *exc):
        self.destroy()

    def create(self):
        self.stale = remove_namespaces(self.prefix)
        try:
            for argv in setup_commands(self.hub, self.hosts, self.subnet):
                run(argv)
        except BaseException:
            self.destroy()
            raise

    def shape(self, rate_bps, delay_s=0.0):
        """(Re)shape every link; may be called between jobs."""
        for host in self.hosts:
            if delay_s <= 0:    # drop a netem parent (or tbf) a previous call may have left
                run(['tc', '-n', host.netns, 'qdisc', 'del', 'dev', NODE_IF, 'root'],
                    check=False)
                run(['tc', '-n', self.hub, 'qdisc', 'del', 'dev', host.hub_if, 'root'],
                    check=False)
            for argv in link_shaping_commands(self.hub, host, rate_bps, delay_s):
                try:
                    run(argv)
                except CommandError as e:
                    if 'netem' in argv and 'unknown' in str(e).lower():
                        raise CommandError('--delay needs the kernel\'s netem qdisc '
                                           '(sch_netem), which this kernel lacks: %s' % e)
                    raise

    def counters(self):
        """{node name: {'node': (rx, tx) of its eth0, 'hub': (rx, tx) of its port}}."""
        hub = parse_link_stats(run(['ip', '-n', self.hub, '-s', '-j', 'link', 'show']))
        result = {}
        for host in self.hosts:
            node = parse_link_stats(run(['ip', '-n', host.netns, '-s', '-j', 'link', 'show',
                                         'dev', NODE_IF]))
            result[host.name] = {'node': node[NODE_IF], 'hub': hub[host.hub_if]}
        return result

    def placement(self, spec):
        """For kvstore_ext.launch.in_namespaces: (netns, ip) of a launcher NodeSpec."""
        for host in self.hosts:
            if (host.role, host.rank) == (spec.role, spec.rank):
                return host.netns, host.ip
        raise KeyError('no host for %s %d' % (spec.role, spec.rank))

    def destroy(self):
        remove_namespaces(self.prefix)


# ------------------------------------------------------------------------ CLI

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('action', choices=['up', 'down'])
    parser.add_argument('-n', '--workers', type=int, default=2)
    parser.add_argument('-s', '--servers', type=int, default=1)
    parser.add_argument('--rate', default='100mbit',
                        help='per link and direction; "none": unshaped')
    parser.add_argument('--delay', default='0ms', help='one-way node-to-node (netem)')
    parser.add_argument('--prefix', default=DEFAULT_PREFIX)
    parser.add_argument('--subnet', default=DEFAULT_SUBNET)
    args = parser.parse_args(argv)
    reason = available()
    if reason:
        parser.error(reason)
    if args.action == 'down':
        print('removed: %s' % (' '.join(remove_namespaces(args.prefix)) or 'nothing'))
        return 0
    cluster = Cluster(args.workers, args.servers, args.prefix, args.subnet)
    try:
        cluster.create()
        cluster.shape(parse_rate(args.rate), parse_delay(args.delay))
    except (CommandError, ValueError) as e:
        cluster.destroy()
        parser.exit(1, 'netns.py: %s\n' % e)
    except BaseException:
        cluster.destroy()
        raise
    if cluster.stale:
        print('removed stale namespaces: %s' % ' '.join(cluster.stale))
    for host in cluster.hosts:
        print('%-10s %-22s %s' % (host.name, host.netns, host.ip))
    return 0


if __name__ == '__main__':
    sys.exit(main())
