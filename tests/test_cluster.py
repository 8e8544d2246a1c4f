"""Tests of the emulated cluster (bench/netns.py, bench/cluster.py, launch placement).

Pure parts (address plan, tc and ip command lines, parsing, summaries) run anywhere.
The real runs need root and ``ip netns``; they are skipped with the reason otherwise.
Each real run uses its own namespace prefix and checks afterwards that no namespace
with that prefix and no node of the job (found by the ``job_env`` tag) is left, after
success, after a worker failure and after Ctrl-C.
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import TAG_VAR, tagged_nodes, wait_no_nodes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, 'bench')
sys.path.insert(0, BENCH)
import cluster  # noqa: E402  (loads kvstore_ext/launch.py by path; no mxnet)
import netns  # noqa: E402

CLUSTER = os.path.join(BENCH, 'cluster.py')
PY = sys.executable
RUN_TIMEOUT = 90


# ------------------------------------------------------------------ pure parts

def test_address_plan():
    hosts = netns.address_plan('kvxt', 3, 2, '10.9.8.0/24')
    assert [(h.role, h.rank) for h in hosts] == [
        ('scheduler', 0), ('server', 0), ('server', 1), ('worker', 0), ('worker', 1),
        ('worker', 2)]
    assert [h.ip for h in hosts] == ['10.9.8.%d' % i for i in range(1, 7)]
    assert [h.netns for h in hosts] == ['kvxt-scheduler', 'kvxt-server-0', 'kvxt-server-1',
                                        'kvxt-worker-0', 'kvxt-worker-1', 'kvxt-worker-2']
    assert len({h.hub_if for h in hosts}) == len(hosts)
    assert all(len(h.hub_if) <= 15 for h in hosts)
    assert hosts[0].name == 'scheduler' and hosts[-1].name == 'worker 2'
    with pytest.raises(ValueError, match='room for 6 hosts'):
        netns.address_plan('kvxt', 6, 1, '10.9.8.0/29')


def test_names_agree_with_launcher():
    for role, rank in [('scheduler', 0), ('server', 1), ('worker', 3)]:
        assert netns.netns_name('p', role, rank) == cluster.launch.netns_name('p', role, rank)


def test_parse_rate_and_delay():
    assert netns.parse_rate('100mbit') == 100e6
    assert netns.parse_rate('2.5gbit') == 2.5e9
    assert netns.parse_rate('1mbps') == 8e6            # tc: bps means bytes per second
    assert netns.parse_rate('12345') == 12345
    assert netns.format_rate(400e6) == '400mbit' and netns.format_rate(1e9) == '1gbit'
    assert netns.parse_delay('2ms') == pytest.approx(0.002)
    assert netns.parse_delay('500us') == pytest.approx(0.0005)
    for bad in ('fast', '10 furlongs'):
        with pytest.raises(ValueError):
            netns.parse_rate(bad)
    with pytest.raises(ValueError):
        netns.parse_delay('soon')


def test_shaping_commands():
    [tbf] = netns.shaping_commands('kvxt-worker-0', 'eth0', 100e6)
    assert tbf[:8] == ['tc', '-n', 'kvxt-worker-0', 'qdisc', 'replace', 'dev', 'eth0', 'root']
    assert tbf[tbf.index('tbf') + 1:tbf.index('tbf') + 3] == ['rate', '100000000bit']
    assert int(tbf[tbf.index('burst') + 1]) >= 65536       # a whole GSO packet
    netem, tbf = netns.shaping_commands('ns', 'eth0', 1e9, 0.002)
    assert netem[netem.index('netem'):netem.index('netem') + 3] == ['netem', 'delay', '2000us']
    assert tbf[tbf.index('parent') + 1] == '1:1' and 'tbf' in tbf
    assert int(tbf[tbf.index('burst') + 1]) >= 1e9 / 8 * netns.TBF_BURST_S


def test_link_shaped_both_ways_with_half_the_delay_each():
    host = netns.address_plan('kvxt', 1, 1)[2]
    cmds = netns.link_shaping_commands('kvxt-hub', host, 100e6, 0.004)
    where = [(c[2], c[c.index('dev') + 1]) for c in cmds if 'netem' in c]
    assert where == [('kvxt-worker-0', 'eth0'), ('kvxt-hub', 'h-worker0')]
    assert all(c[c.index('delay') + 1] == '2000us' for c in cmds if 'netem' in c)


def test_setup_never_touches_the_root_namespace():
    """Every ip command names one of our namespaces: -n NS, or netns add NS."""
    hosts = netns.address_plan('kvxt', 2, 1)
    ours = {'kvxt-hub'} | {h.netns for h in hosts}
    for argv in netns.setup_commands('kvxt-hub', hosts):
        assert argv[0] == 'ip'
        if argv[1] == 'netns':
            assert argv[2] == 'add' and argv[3] in ours
        else:
            assert argv[1] == '-n' and argv[2] in ours, argv
        if 'peer' in argv:      # the veth's other end goes straight into the node's ns
            assert argv[-2] == 'netns' and argv[-1] in ours
    adds = [a for a in netns.setup_commands('kvxt-hub', hosts) if 'addr' in a]
    assert [a[a.index('add') + 1] for a in adds] == ['%s/24' % h.ip for h in hosts]


def test_only_our_names_are_ours():
    for name in ('kvxt-hub', 'kvxt-scheduler', 'kvxt-server-0', 'kvxt-worker-12'):
        assert netns.is_ours(name, 'kvxt')
    for name in ('kvxt-other', 'kvxt-hub-2', 'kvxt-x-worker-0', 'kvxtt-hub', 'hub'):
        assert not netns.is_ours(name, 'kvxt')


def test_parse_link_stats():
    text = json.dumps([{'ifname': 'eth0', 'stats64': {'rx': {'bytes': 10}, 'tx': {'bytes': 7}}},
                       {'ifname': 'lo', 'stats64': {'rx': {'bytes': 1}, 'tx': {'bytes': 1}}}])
    assert netns.parse_link_stats(text) == {'eth0': (10, 7), 'lo': (1, 1)}


def test_launcher_places_nodes_in_namespaces():
    launch = cluster.launch
    specs = launch.local_nodes(2, 1, ['python', 'w.py'], ['python', '-c', 'import mxnet'],
                               9000, base_env={'PORT': '1', 'A': 'b'})
    plan = {(h.role, h.rank): (h.netns, h.ip) for h in netns.address_plan('kvxt', 2, 1)}
    placed = launch.in_namespaces(specs, lambda s: plan[(s.role, s.rank)])
    assert [s.name for s in placed] == [s.name for s in specs]
    for spec, orig in zip(placed, specs):
        ns, ip = plan[(spec.role, spec.rank)]
        assert spec.argv == ['ip', 'netns', 'exec', ns] + orig.argv
        assert spec.env['DMLC_NODE_HOST'] == ip and spec.host == ip
        assert spec.env['DMLC_PS_ROOT_URI'] == plan[('scheduler', 0)][1]
        assert spec.env['DMLC_PS_ROOT_PORT'] == '9000' and 'PORT' not in spec.env
        assert spec.env['A'] == 'b'
    assert specs[0].argv[0] == 'python'          # the originals are unchanged


def test_launcher_cli_netns_prefix_is_local_only(tmp_path):
    hosts = tmp_path / 'hosts'
    hosts.write_text('node-a\n')
    done = subprocess.run([PY, cluster.LAUNCH, '--launcher', 'ssh', '-H', str(hosts),
                           '--netns-prefix', 'kvxt', '-n', '1', 'true'],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and 'not with --launcher ssh' in done.stderr


def test_parse_scheme():
    assert cluster.parse_scheme('dist_sync') == ('dist_sync', 'dist_sync', {})
    label, kv, params = cluster.parse_scheme(
        'dist_sync_hylo:aggregation=homomorphic,size_threshold=1000,conv_rate=0.05')
    assert kv == 'dist_sync_hylo'
    assert params == {'aggregation': 'homomorphic', 'size_threshold': 1000, 'conv_rate': 0.05}
    assert label == 'dist_sync_hylo(aggregation=homomorphic,size_threshold=1000,conv_rate=0.05)'
    with pytest.raises(ValueError):
        cluster.parse_scheme('dist_sync_hylo:aggregation')


def fake_worker(rank, step, compute, link, comm=None):
    return {'launch_id': rank, 'parameters': 10, 'gradient_bytes': 40, 'step_s': [step] * 4,
            'compute_step_s': [compute] * 4, 'step_cpu_s': [step / 2] * 4,
            'compute_cpu_s': [compute] * 4, 'link_rx_bytes': link * 2,
            'link_tx_bytes': link * 2,
            'comm_stats': None if comm is None else {'push_bytes': comm * 2,
                                                     'pull_bytes': comm * 2}}


def test_summarize_and_table():
    counters = {'worker 0': {'node': (0, 0), 'hub': (0, 0)}}
    after = {'worker 0': {'node': (100, 50), 'hub': (50, 100)}}
    row = cluster.summarize([fake_worker(0, 0.4, 0.1, 100, 90),
                             fake_worker(1, 0.4, 0.1, 100, 90)], counters, after)
    assert row['step_s'] == 0.4 and row['compute_s'] == 0.1
    assert row['comm_share'] == pytest.approx(0.75)
    assert row['link_bytes_per_step'] == 100 and row['comm_stats_bytes_per_step'] == 90
    assert row['link_over_comm_stats'] == pytest.approx(100 / 90)
    assert row['job_link_bytes'] == {'worker 0': {'rx': 100, 'tx': 50}}
    native = cluster.summarize([fake_worker(0, 0.2, 0.3, 100)], counters, after)
    assert native['comm_share'] == 0 and native['comm_stats_bytes_per_step'] is None
    rows = [dict(row, rate='100mbit', model='vgg', scheme='dist_sync_none',
                 kvstore='dist_sync_none', compression_params={}),
            dict(native, rate='100mbit', model='vgg', scheme='dist_sync', kvstore='dist_sync',
                 compression_params={}),
            {'rate': '100mbit', 'model': 'vgg', 'scheme': 'dist_sync_hylo',
             'error': 'skipped: not registered'}]
    table = cluster.format_table(rows)
    assert '0.50x' in table and '1.00x' in table and 'skipped: not registered' in table


def test_table_flags_a_busy_machine():
    counters = {'worker 0': {'node': (0, 0), 'hub': (0, 0)}}
    worker = fake_worker(0, 0.4, 0.1, 100)
    worker['compute_cpu_s'] = [0.05] * 4            # compute steps waited for a core
    row = cluster.summarize([worker], counters, counters)
    assert row['compute_wall_over_cpu'] == pytest.approx(2.0)
    table = cluster.format_table([dict(row, rate='1gbit', model='vgg', scheme='dist_sync')])
    assert ' !' in table and 'other load on the machine' in table


# ------------------------------------------------------------------ real runs

NO_NETNS = netns.available()
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=str(NO_NETNS))


@pytest.fixture(scope='module')
def scheme():
    """dist_sync_none once kvstore_ext is installed, MXNet's dist_sync until then."""
    types = cluster.plugin_kvstores(PY)
    return 'dist_sync_none' if isinstance(types, set) and 'dist_sync_none' in types \
        else 'dist_sync'


@pytest.fixture
def prefix():
    """A namespace prefix of this test alone; checked to be gone afterwards."""
    name = 'kvxt%s' % uuid.uuid4().hex[:6]
    yield name
    left = netns.list_namespaces(name)
    netns.remove_namespaces(name)
    assert not left, 'namespaces left behind (removed now): %s' % left


def harness_args(prefix, scheme, json_path, *extra):
    return [PY, CLUSTER, '-n', '2', '-s', '1', '--rate', '100mbit', '--models', 'resnet',
            '--schemes', scheme, '--steps', '3', '--warmup', '1', '--prefix', prefix,
            '--json', str(json_path)] + list(extra)


def assert_cleaned_up(prefix, tag):
    assert netns.list_namespaces(prefix) == []
    assert wait_no_nodes(tag, 3.0) == []


@needs_netns
def test_real_run_moves_the_gradient_bytes(job_env, prefix, scheme, tmp_path):
    out = tmp_path / 'run.json'
    start = time.monotonic()
    done = subprocess.run(harness_args(prefix, scheme, out), env=job_env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = json.load(open(out))['runs']
    assert row['exit_code'] == 0 and row['scheme'] == scheme
    grad = row['gradient_bytes']
    assert grad == 4 * row['parameters'] > 1e6
    # every worker's link carried at least the gradient up (push) and down (pull)
    for w in row['workers']:
        assert w['link_tx_bytes'] >= grad * row['steps']
        assert w['link_rx_bytes'] >= grad * row['steps']
    # the server received both workers' pushes on its own link
    assert row['job_link_bytes']['server 0']['rx'] >= 2 * grad * row['steps']
    # the links are really shaped: the server's link carries 2 gradients each way per
    # step, which at 100 Mbit/s takes 2 * grad * 8 / 1e8 s at the very least
    assert row['step_s'] >= 2 * grad * 8 / 100e6
    if scheme != 'dist_sync':
        assert row['comm_stats_bytes_per_step'] >= 2 * grad
    assert 'resnet' in done.stdout and scheme in done.stdout        # the table
    assert_cleaned_up(prefix, job_env[TAG_VAR])
    print('real run: %.1f s' % seconds)


@needs_netns
def test_failing_worker_and_stale_namespace_are_cleaned_up(job_env, prefix, scheme,
                                                           tmp_path):
    # a namespace of a "killed earlier run" with more workers, a process still inside
    stale = '%s-worker-7' % prefix
    subprocess.run(['ip', 'netns', 'add', stale], check=True)
    sleeper = subprocess.Popen(['ip', 'netns', 'exec', stale, 'sleep', '300'])
    try:
        out = tmp_path / 'run.json'
        done = subprocess.run(harness_args(prefix, scheme, out, '--crash-worker', '1'),
                              env=job_env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT)
        assert sleeper.wait(timeout=10) != 0          # killed by the stale check
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 1, done.stderr[-3000:]
    assert 'removed stale namespaces: %s' % stale in done.stderr
    [row] = json.load(open(out))['runs']
    assert row['error'].startswith('FAILED') and row['exit_code'] == 1
    assert 'crashing on purpose' in row['log_tail']
    assert_cleaned_up(prefix, job_env[TAG_VAR])


def server_rx_bytes(prefix):
    """Bytes received so far by server 0's link (0 before the cluster exists)."""
    done = subprocess.run(['ip', '-n', netns.netns_name(prefix, 'server', 0), '-s', '-j',
                           'link', 'show', 'dev', netns.NODE_IF], capture_output=True, text=True)
    return netns.parse_link_stats(done.stdout)[netns.NODE_IF][0] if done.returncode == 0 else 0


@needs_netns
def test_ctrl_c_cleans_up(job_env, prefix, scheme, tmp_path):
    out = tmp_path / 'run.json'
    proc = subprocess.Popen(harness_args(prefix, scheme, out, '--steps', '1000'),
                            env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT / 2
        while server_rx_bytes(prefix) < 5e6:        # training: gradients are flowing
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        assert len(tagged_nodes(job_env[TAG_VAR])) == 4     # scheduler, server, 2 workers
        assert len(netns.list_namespaces(prefix)) == 5      # and the hub
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130, stderr[-3000:]
    assert 'interrupted' in stderr
    assert json.load(open(out))['interrupted']
    assert_cleaned_up(prefix, job_env[TAG_VAR])
