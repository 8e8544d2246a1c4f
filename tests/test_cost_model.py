"""The cost model (kvstore_ext/cost.py) and its CLI (kvstore_ext/advise.py), in one process.

* its bytes are the store's: for every registered scheme and aggregation mode, the
  bytes a real one-process step reports in ``comm_stats`` equal the model's, so the
  model cannot drift from the code (the parameter-server transport's padding of Gather
  payloads is the transport's own function, which the model calls);
* its shipped kernel timings are those of bench/results/kernels.json (its codec class
  table, bench/results/codec_times.json: tests/test_codec_table.py);
* wire time falls as the link gets faster; a fast link with little compute picks
  dist_sync (codec time dominates), a slow link a compressing scheme;
* ``python -m kvstore_ext.advise`` on a shapes file and on a gluoncv model prints every
  scheme and a "fastest" line; bad arguments give one clear error each.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import kvstore_ext
from kvstore_ext import advise, cost
from kvstore_ext.schemes import NoCompression

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNK = 4096         # small, so that the tensors below are cut into chunks
SHAPES = {'conv': (64, 64, 3, 3), 'fc': (256, 300), 'bias': (64,), 'wide': (70000,)}
VARIANTS = cost.variants(kvstore_ext.SCHEMES)
LINK = cost.Link(cost.parse_rate('1Gbit'), 50e-6)


def grad(key, step):
    rng = np.random.default_rng([step, sorted(SHAPES).index(key)])
    return (rng.standard_normal(SHAPES[key]) * 0.01).astype(np.float32)


def test_every_scheme_and_mode_is_modelled():
    labels = [v[0] for v in VARIANTS]
    assert sorted({v[1] for v in VARIANTS}) == sorted(kvstore_ext.SCHEMES)
    assert 'dist_sync_hylo:aggregation=server' in labels
    assert 'dist_sync_hylo:aggregation=server,pull=compressed' in labels
    assert len(labels) == len(set(labels))


@pytest.mark.parametrize('label,name,params', VARIANTS, ids=[v[0] for v in VARIANTS])
def test_bytes_equal_the_stores_comm_stats(label, name, params):
    """Steps 2 and 3 of a real one-process store (past any first-step agreement): the
    bytes each adds to comm_stats are the model's for the codecs the store planned."""
    kv = mx.kv.create('dist_sync_' + name)
    if name == 'dad':
        # dAD refuses a run with no Dense layer attached; this one owns none of the keys,
        # so every key takes the fallback, as the model plans it
        from kvstore_ext import dad
        kv.unrelated_dense = mx.gluon.nn.Dense(3, in_units=2)
        dad.attach(kv.unrelated_dense)
    kv.set_gradient_compression(dict(params, chunk_size=CHUNK))
    counts = []
    for step in range(3):
        for key in SHAPES:
            kv.pushpull(key, mx.nd.array(grad(key, step)))
        counts.append(kv.comm_stats())
    scheme = kvstore_ext.SCHEMES[name](chunk_size=CHUNK, **params)
    codecs = cost.plan(scheme, SHAPES, 1)
    for key in SHAPES:
        assert repr(codecs[key]) == repr(kv.plan(key).codec), (label, key)
    model = cost.step_cost(codecs, 1, 1, LINK, 0.0, chunk_size=CHUNK, padded=False)
    for a, b in zip(counts[1:], counts[2:]):
        assert b['push_bytes'] - a['push_bytes'] == model.bytes_push, label
        assert b['pull_bytes'] - a['pull_bytes'] == model.bytes_pull, label


def test_the_parameter_server_pads_gather_payloads_to_rows():
    """Server-decoded payloads travel in whole rows of a row_sparse key: the model's
    push bytes are the transport's (gather_wire_bytes), at least the payload's."""
    from kvstore_ext.transport.ps import gather_wire_bytes
    scheme = kvstore_ext.SCHEMES['hylo'](aggregation='server')
    codec = cost.plan(scheme, {'fc': (256, 300)}, 4)['fc']
    words = codec.payload_words()
    push, pull, _, _ = cost.cost(codec, 4, 1, LINK)
    assert (push, pull) == gather_wire_bytes(words, codec.size)
    assert push >= 4 * words and push != 4 * words   # 1075 words: padded to 2 x 1024


def test_kernel_table_is_the_results_file():
    with open(os.path.join(REPO, cost.KERNELS_SOURCE)) as f:
        results = json.load(f)['results']
    for case, points in cost.KERNEL_TIMES.items():
        measured = [(r['elements'], r['paths']['op']['best_s']) for r in results
                    if r['case'] == case and 'op' in r['paths']]
        assert [n for n, _ in measured] == [n for n, _ in points], case
        np.testing.assert_allclose([t for _, t in points], [t for _, t in measured],
                                   rtol=1e-3, err_msg=case)


def test_per_tensor_cost():
    """cost() unpacks as (bytes_push, bytes_pull, codec_seconds, wire_seconds); a float32
    tensor costs no codec time; a codec the kernel timings do not cover is priced from
    the codec class table, and is None if its class is not there either."""
    hylo = kvstore_ext.SCHEMES['hylo']()
    codecs = cost.plan(hylo, {'conv': (256, 128, 3, 3)}, 4)
    push, pull, codec_s, wire_s = cost.cost(codecs['conv'], 4, 2, LINK)
    raw = 4 * 256 * 128 * 9
    assert 0 < push < raw and 0 < pull < raw and codec_s > 0
    # one chunk: one server carries all 4 workers' payloads; one round trip
    assert wire_s == pytest.approx(4 * max(push, pull) / LINK.rate + 2 * LINK.latency)
    plain = cost.cost(cost.plan(NoCompression(), {'b': (64,)}, 4)['b'], 4, 2, LINK)
    assert plain.codec_seconds == 0 and plain.bytes_push == plain.bytes_pull == 256
    thc = cost.plan(kvstore_ext.SCHEMES['thc'](), {'fc': (256, 300)}, 4)['fc']
    assert cost.kernels_of(thc) is None and cost.cost(thc, 4, 2, LINK).codec_seconds > 0
    rank3 = cost.plan(kvstore_ext.SCHEMES['powersgd'](rank=3), {'fc': (256, 300)}, 4)['fc']
    assert cost.cost(rank3, 4, 2, LINK).codec_seconds is None


def model_shapes():
    """A model of conv and FC layers of a few million parameters."""
    return {'conv1': (64, 3, 7, 7), 'conv2': (256, 128, 3, 3), 'conv3': (512, 256, 3, 3),
            'bn': (512,), 'fc1': (1024, 4608), 'fc1_bias': (1024,), 'fc2': (1000, 1024)}


def predictions(rate, latency, compute, workers=4, servers=2, speeds=None):
    return dict(advise.predict(model_shapes(), workers, servers,
                               cost.Link(cost.parse_rate(rate), latency), compute,
                               speeds=speeds))


def test_wire_time_falls_as_the_link_gets_faster():
    rates = ['10Mbit', '100Mbit', '1Gbit', '10Gbit', '100Gbit']
    for latency in (0.0, 1e-3):
        rows = [predictions(r, latency, 0.01) for r in rates]
        for label in rows[0]:
            wires = [r[label].wire_seconds for r in rows]
            assert all(a > b for a, b in zip(wires, wires[1:])), (label, latency, wires)
            steps = [r[label].step_seconds for r in rows]
            if steps[0] is not None:
                assert all(a > b for a, b in zip(steps, steps[1:])), (label, steps)


def test_a_fast_link_picks_dist_sync_and_a_slow_link_compression():
    """Where moving a byte costs no CPU (transport constants zero), a fast link leaves
    only the codecs' time: dist_sync. With this machine's transport CPU (ps-lite's
    copies and the servers' additions, about 0.7 ns a byte at a server) a server of 4
    workers is CPU-bound at any rate, and sending fewer bytes pays there too."""
    free = cost.KernelSpeeds(transport=cost.TransportCPU({}))
    fast = predictions('400Gbit', 1e-6, 1e-4, speeds=free)
    assert advise.fastest(list(fast.items()))[0] == 'dist_sync'
    costly = predictions('400Gbit', 1e-6, 1e-4)
    assert advise.fastest(list(costly.items()))[0] != 'dist_sync'
    slow = predictions('10Mbit', 50e-6, 0.05)
    label, best = advise.fastest(list(slow.items()))
    assert label not in ('dist_sync', 'dist_sync_none')
    assert best.bytes_push + best.bytes_pull < \
        slow['dist_sync'].bytes_push + slow['dist_sync'].bytes_pull


def test_mxnet_dist_sync_spreads_a_big_array_over_all_servers():
    """MXNet cuts an array above its bigarray bound (10^6 elements) evenly over every
    server; kvstore_ext's transport places each 2^20-element chunk on one server. At 8
    servers a 4M-element gradient from 4 workers loads a server with 1/8 of the sum under
    dist_sync's row and with a whole chunk (1/4) under kvstore_ext's placement."""
    shapes = {'fc': (4096, 1024)}
    link = cost.Link(1e9)
    workers, servers = 4, 8
    rows = dict(advise.predict(shapes, workers, servers, link, 0.0))
    total = workers * 4096 * 1024 * 4
    assert rows['dist_sync'].server_link_seconds == pytest.approx(total / servers / 1e9)
    ours = cost.step_cost(cost.plan(NoCompression(), shapes, workers), workers, servers,
                          link, 0.0)
    assert ours.server_link_seconds == pytest.approx(total / 4 / 1e9)
    small = {'w': (512, 512)}         # below the bound: one server either way
    rows = dict(advise.predict(small, workers, servers, link, 0.0))
    assert rows['dist_sync'].server_link_seconds == pytest.approx(
        workers * 512 * 512 * 4 / 1e9)


def test_overlap_hides_wire_time_behind_compute():
    none = predictions('100Mbit', 0.0, 0.2)['dist_sync']
    half = dict(advise.predict(model_shapes(), 4, 2, cost.Link(cost.parse_rate('100Mbit')),
                               0.2, overlap=0.5))['dist_sync']
    assert none.step_seconds - half.step_seconds == pytest.approx(
        min(0.1, none.wire_seconds))


def test_units():
    assert cost.parse_rate('10Gbit') == 10e9 / 8
    assert cost.parse_rate('100mbit/s') == 100e6 / 8
    assert cost.parse_duration('50us') == pytest.approx(50e-6)
    assert cost.parse_duration('0') == 0
    for bad in ('fast', '10', '10GB', '-1Gbit', '0Gbit'):
        with pytest.raises(ValueError, match='link rate'):
            cost.parse_rate(bad)
    with pytest.raises(ValueError, match='duration'):
        cost.parse_duration('5')


def shapes_file(tmp_path, shapes=None):
    path = tmp_path / 'shapes.json'
    path.write_text(json.dumps(shapes or {k: list(s) for k, s in model_shapes().items()}))
    return str(path)


def check_report(text):
    for label in ['dist_sync'] + [v[0] for v in VARIANTS]:
        assert any(line.split()[:1] == [label] for line in text.splitlines()), label
    fastest = [line for line in text.splitlines() if line.startswith('fastest: ')]
    assert len(fastest) == 1
    assert fastest[0].split()[1].rstrip(',') in ['dist_sync'] + [v[0] for v in VARIANTS]


def test_advise_cli_on_a_shapes_file(tmp_path):
    out = subprocess.run(
        [sys.executable, '-m', 'kvstore_ext.advise', '--shapes', shapes_file(tmp_path),
         '--workers', '4', '--servers', '2', '--link', '100Mbit', '--compute-ms', '30',
         '--json', str(tmp_path / 'out.json')],
        capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    check_report(out.stdout)
    rows = json.loads((tmp_path / 'out.json').read_text())['rows']
    assert [r['kvstore'] for r in rows] == ['dist_sync'] + [v[0] for v in VARIANTS]


def test_advise_on_a_gluoncv_model(capsys):
    assert advise.main(['--model', 'cifar_resnet20_v1', '--workers', '2',
                        '--link', '10Gbit', '--compute-ms', '5']) == 0
    text = capsys.readouterr().out
    check_report(text)
    assert text.startswith('cifar_resnet20_v1: ')


def test_calibrate_measures_every_codec():
    """--calibrate times each planned codec on this machine: every step is predicted."""
    from kvstore_ext.cost_calibrate import calibrate
    shapes = {'conv': (64, 64, 3, 3), 'fc': (256, 300), 'bias': (64,)}
    speeds = calibrate(VARIANTS, shapes, repeats=1)
    rows = advise.predict(shapes, 1, 1, LINK, 0.01, speeds=speeds)
    assert all(c.step_seconds is not None for _, c in rows), \
        [label for label, c in rows if c.step_seconds is None]
    assert all(w >= 0 and s >= 0 for w, s in speeds.measured.values())


@pytest.mark.parametrize('args,message', [
    (['--link', 'fast'], "link rate 'fast'"),
    (['--workers', '0'], '--workers must be >= 1'),
    (['--servers', '-1'], '--servers must be >= 1'),
    (['--latency', '5'], "duration '5'"),
    (['--overlap', '2'], '--overlap must be within'),
    (['--compute-ms', '-3'], '--compute-ms must be >= 0'),
])
def test_bad_arguments(tmp_path, capsys, args, message):
    base = {'--shapes': shapes_file(tmp_path), '--link': '1Gbit', '--compute-ms': '10'}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    with pytest.raises(SystemExit) as stop:
        advise.main([x for kv in base.items() for x in kv])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize('content,message', [
    (None, 'cannot read it'),
    ('[1, 2]', 'expected a JSON object'),
    ('{"fc": [10, 0]}', "parameter 'fc': a shape is a non-empty list"),
    ('{"fc": "10x3"}', "parameter 'fc'"),
    ('not json', 'not JSON'),
])
def test_bad_shapes_files(tmp_path, capsys, content, message):
    path = tmp_path / 'shapes.json'
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit):
        advise.main(['--shapes', str(path), '--link', '1Gbit', '--compute-ms', '10'])
    assert message in capsys.readouterr().err


def test_bad_model_and_missing_source(capsys):
    with pytest.raises(SystemExit):
        advise.main(['--model', 'resnet_nonesuch', '--link', '1Gbit', '--compute-ms', '1'])
    assert "--model 'resnet_nonesuch': not a gluoncv model-zoo name" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        advise.main(['--link', '1Gbit', '--compute-ms', '1'])
    assert 'one of the arguments --model --shapes is required' in capsys.readouterr().err


# ---- the links' pipeline (kvstore_ext/pipeline.py) and the transport CPU term -------------

def float32_step(shapes, workers, servers, link, **kw):
    """The step of float32 keys (MXNet's pushpull: no codec), with the transport CPU
    term's constants ``transport`` (default: none)."""
    speeds = cost.KernelSpeeds(transport=kw.pop('transport', None) or cost.TransportCPU({}))
    return cost.step_cost(cost.plan(NoCompression(), shapes, workers), workers, servers,
                          link, 0.0, speeds, **kw)


def test_one_key_goes_in_then_out_at_its_server():
    """A server sends a key's sum only after every worker's push of it is in: one key
    takes (I + O) / B on the server's link, not max(I, O) / B."""
    workers, n, link = 3, 250000, cost.Link(1e8, 20e-6)
    step = float32_step({'w': (n,)}, workers, 1, link)
    assert step.wire_seconds == pytest.approx(workers * (4 * n + 4 * n) / link.rate
                                              + 2 * link.latency)
    # one worker, one server: the worker's own link too carries its push, then its pull
    alone = float32_step({'w': (n,)}, 1, 1, link)
    assert alone.wire_seconds == pytest.approx(8 * n / link.rate + 2 * link.latency)


@pytest.mark.parametrize('keys', [2, 10, 400])
def test_many_small_keys_overlap_in_and_out(keys):
    """Equal keys on one server: each key's pulls leave while the next key's pushes come
    in, so the step takes the busier direction plus one key's out: (n + 1) / n of
    max(I, O) / B, which tends to the former full-duplex model's max() as keys grow."""
    workers, link = 2, cost.Link(1e7)
    shapes = {'k%d' % i: (1000,) for i in range(keys)}
    step = float32_step(shapes, workers, 1, link)
    busier = workers * 4 * 1000 * keys / link.rate
    assert step.server_link_seconds == pytest.approx(busier)
    assert step.pipeline_seconds == pytest.approx(busier * (keys + 1) / keys)


def test_a_tensors_chunks_are_pulled_after_all_its_pushes():
    """The transport pushes every chunk of a tensor before it asks for any pull, and the
    requests follow the pushes on the worker's connection: three chunks on one server
    take in + out of the whole tensor; three tensors of one chunk each pipeline."""
    workers, link = 2, cost.Link(1e7)
    one = float32_step({'w': (3 * CHUNK,)}, workers, 1, link, chunk_size=CHUNK)
    assert one.pipeline_seconds == pytest.approx(workers * 2 * 4 * 3 * CHUNK / link.rate)
    three = float32_step({k: (CHUNK,) for k in 'abc'}, workers, 1, link, chunk_size=CHUNK)
    assert three.pipeline_seconds == pytest.approx(workers * 4 * 4 * CHUNK / link.rate)


def test_two_keys_by_hand():
    """W = 2 workers, 1 server, 1 byte/s. Key 1 pushes 2 bytes and pulls 1; key 2
    pushes 1 and pulls 3. Server in: key 1 from 0 to 4, key 2 from 4 to 6 (the workers
    pushed it from 2 to 3). Server out: key 1 from 4 to 6; key 2 only once its pushes are
    in, from 6 to 12. Step: 12 (the former model: max(I, O) = 8; in + out: 14)."""
    from kvstore_ext import pipeline
    transfers = [pipeline.Transfer(0, 2, 1), pipeline.Transfer(0, 1, 3)]
    assert pipeline.makespan(transfers, 2, 1, 1.0) == pytest.approx(12)
    # key 2 a later round of key 1's tensor: pushed only once key 1's pull is done (6)
    staged = [pipeline.Transfer(0, 2, 1), pipeline.Transfer(0, 1, 3, waits_for=[0])]
    assert pipeline.makespan(staged, 2, 1, 1.0) == pytest.approx(6 + 2 + 6)


def test_pipeline_never_beats_the_busiest_link():
    """Whatever the shapes, servers and placement: at least max(P, Q, I_s, O_s) / B."""
    link = cost.Link(1e9)
    for servers in (1, 2, 3):
        for name in ('hylo', '2bit', 'none'):
            scheme = kvstore_ext.SCHEMES[name](chunk_size=CHUNK)
            step = cost.step_cost(cost.plan(scheme, SHAPES, 4), 4, servers, link, 0.0,
                                  chunk_size=CHUNK)
            assert step.pipeline_seconds >= max(step.worker_link_seconds,
                                                step.server_link_seconds) * (1 - 1e-12)


def test_transport_cpu_is_zero_when_its_constants_are():
    link = cost.Link(1e8, 10e-6)
    shapes = {'a': (30000,), 'b': (5000,)}
    step = float32_step(shapes, 4, 1, link)
    assert step.transport_seconds == 0
    assert step.step_seconds == pytest.approx(step.wire_seconds)


def test_transport_cpu_per_key_and_byte():
    """Worker: 2 keys, 4 x 35000 bytes each way; server: 4 workers' messages and bytes.
    The busier node's CPU adds to the step."""
    link = cost.Link(1e8, 10e-6)
    shapes = {'a': (30000,), 'b': (5000,)}
    cpu = cost.TransportCPU({'worker_s_per_key': 1e-4, 'worker_s_per_byte': 1e-9,
                             'server_s_per_key': 2e-5, 'server_s_per_byte': 2e-9})
    step = float32_step(shapes, 4, 1, link, transport=cpu)
    worker = 2 * 1e-4 + 2 * 4 * 35000 * 1e-9
    server = 4 * 2 * 2e-5 + 4 * 2 * 4 * 35000 * 2e-9
    assert step.transport_seconds == pytest.approx(max(worker, server))
    assert step.step_seconds == pytest.approx(step.wire_seconds + max(worker, server))
    # every node on one core (as the emulated cluster's on two): at least every node's
    # CPU over the cores, here more than the busier node's alone
    shared = float32_step(shapes, 4, 1, cost.Link(1e12), transport=cpu, host_cores=1)
    assert shared.host_seconds == pytest.approx(4 * worker + server)
    assert shared.host_seconds > shared.transport_seconds + shared.wire_seconds
    assert shared.step_seconds == pytest.approx(shared.host_seconds)


def test_transport_constants_are_the_results_file():
    with open(os.path.join(REPO, cost.TRANSPORT_SOURCE)) as f:
        measured = json.load(f)
    for name in cost.TransportCPU.FIELDS:
        assert cost.TRANSPORT_CPU[name] == pytest.approx(measured[name], rel=1e-3), name
        assert cost.TRANSPORT_CPU[name] > 0, name


def test_bad_transport_constant_is_one_clear_error():
    with pytest.raises(ValueError, match='worker_s_per_byte must be >= 0'):
        cost.TransportCPU({'worker_s_per_byte': -1e-9})
    with pytest.raises(ValueError, match='host_cores must be above 0'):
        float32_step({'a': (10,)}, 2, 1, LINK, host_cores=0)
