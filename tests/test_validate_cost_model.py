"""The pure parts of the cost model's validation on the emulated cluster: the unshaped
link rate of bench/netns.py and the predictions of bench/validate_cost_model.py.
Nothing here creates a namespace or times anything."""
import math
import os
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench')
sys.path.insert(0, BENCH)

import netns  # noqa: E402
import validate_cost_model as vcm  # noqa: E402


def test_unshaped_rate_parses_formats_and_shapes_nothing():
    assert netns.parse_rate('none') == math.inf
    assert netns.parse_rate(' None ') == math.inf
    assert netns.format_rate(math.inf) == 'none'
    assert netns.shaping_commands('ns', 'eth0', math.inf) == []
    host = netns.address_plan('kvxt', 1, 1)[1]
    assert netns.link_shaping_commands('kvxt-hub', host, math.inf) == []
    # with a delay: netem alone, no tbf under it
    [netem] = netns.shaping_commands('ns', 'eth0', math.inf, 0.002)
    assert 'netem' in netem and 'tbf' not in netem and '2000us' in netem
    # a finite rate is shaped as before
    assert 'tbf' in netns.shaping_commands('ns', 'eth0', 50e6)[0]


SHAPES = {'conv': (128, 64, 3, 3), 'fc': (512, 4096), 'bias': (512,)}


def test_dist_sync_prediction_is_float32_bytes_over_the_link_plus_compute():
    rate = 200e6
    p = vcm.predict(SHAPES, 'dist_sync', {}, 2, 1, rate, 0.0, 0.05)
    floats = sum(int(np.prod(s)) for s in SHAPES.values())
    # one server: it receives every worker's push and sends every worker the sum
    assert p['bytes_push'] == p['bytes_pull'] == 4 * floats
    # in push order (conv, fc, bias), each key's sum leaves once its pushes are in: the
    # server's link takes conv's in, fc's in and out (the big key), then bias's out
    conv, fc, bias = (4 * int(np.prod(SHAPES[k])) for k in ('conv', 'fc', 'bias'))
    assert p['wire_s'] == pytest.approx(2 * (conv + 2 * fc + bias) / (rate / 8))
    assert p['busiest_link_s'] == pytest.approx(2 * 4 * floats / (rate / 8))
    assert p['codec_s'] == 0 and p['compressed_tensors'] == 0
    assert p['transport_s'] > 0 and p['host_s'] is None
    assert p['step_s'] == pytest.approx(0.05 + p['transport_s'] + p['wire_s'])
    # the diagnostic: every push in, then every pull out, one after the other
    assert p['serial_server_step_s'] == pytest.approx(
        0.05 + p['transport_s'] + 2 * p['busiest_link_s'])


def test_prediction_follows_the_scheme_and_the_measured_compute():
    from kvstore_ext import cost
    slow = vcm.predict(SHAPES, 'dist_sync_hylo', {}, 2, 1, 50e6, 1e-4, 0.05)
    assert slow['compressed_tensors'] == 2 and slow['bytes_push'] < 4 * 512 * 4096
    more = vcm.predict(SHAPES, 'dist_sync_hylo', {}, 2, 1, 50e6, 1e-4, 0.25)
    assert more['step_s'] - slow['step_s'] == pytest.approx(0.2)
    # the same as the cost model asked directly
    scheme = vcm.scheme_of('dist_sync_hylo', {})
    direct = cost.step_cost(cost.plan(scheme, SHAPES, 2), 2, 1, cost.Link(50e6 / 8, 1e-4),
                            0.05)
    assert slow['step_s'] == pytest.approx(direct.step_seconds)


def test_policy_auto_with_a_measured_rate_is_predicted_at_the_links_rate():
    for rate in (50e6, 1e12):      # a slow link compresses, a very fast one does not
        given = vcm.predict(SHAPES, 'dist_sync_hylo', {'policy': 'auto', 'link_rate': rate},
                            2, 1, rate, 0.0, 0.05)
        measured = vcm.predict(SHAPES, 'dist_sync_hylo', {'policy': 'auto'}, 2, 1, rate,
                               0.0, 0.05)
        assert measured == given
    assert vcm.predict(SHAPES, 'dist_sync_hylo', {'policy': 'auto'}, 2, 1, 50e6, 0, 0
                       )['compressed_tensors'] == 2
    assert vcm.predict(SHAPES, 'dist_sync_hylo', {'policy': 'auto'}, 2, 1, 1e12, 0, 0
                       )['compressed_tensors'] == 0


def test_unknown_kvstore_is_one_clear_error_and_a_row_keeps_it():
    with pytest.raises(ValueError, match='dist_sync_nope'):
        vcm.scheme_of('dist_sync_nope', {})
    row = {'kvstore': 'dist_sync_nope', 'compression_params': {}, 'workers': 2,
           'servers': 1, 'compute_s': 0.05,
           'link': {'rate_bps': 50e6, 'latency_s': 0.0, 'probe': {'rate_bps': 4e7}}}
    vcm.predict_row(row, SHAPES, None)
    assert row['predicted'] is None and 'dist_sync_nope' in row['predict_error']


def test_unshaped_link_is_predicted_at_the_probes_rate():
    link = {'rate_bps': math.inf, 'latency_s': 5e-5, 'probe': {'rate_bps': 3e9}}
    assert vcm.link_rate_of(link) == 3e9
    assert vcm.link_rate_of(dict(link, rate_bps=50e6)) == 50e6
    [(label, kvstore, params)] = vcm.schemes_at(['AUTO_GIVEN'], 3e9)
    assert kvstore == 'dist_sync_hylo' and params == {'policy': 'auto',
                                                      'link_rate': 3000000000}


def test_speeds_file_round_trips(tmp_path):
    from kvstore_ext import cost
    codec = cost.plan(vcm.scheme_of('dist_sync_hylo', {}), {'fc': (512, 4096)}, 2)['fc']
    speeds = cost.MeasuredSpeeds({cost.signature(codec): (0.003, 0.001)}, source='here')
    path = str(tmp_path / 'speeds.json')
    vcm.save_speeds(speeds, path)
    loaded = vcm.load_speeds(path)
    assert loaded.source == 'here'
    assert loaded.codec_seconds(codec, 2) == pytest.approx((0.003, 0.002))
    # what the file lacks comes from the shipped table
    other = cost.plan(vcm.scheme_of('dist_sync_hylo', {}), {'c': (64, 32, 3, 3)}, 2)['c']
    assert loaded.codec_seconds(other, 2) == cost.KernelSpeeds().codec_seconds(other, 2)


def test_calibrate_adds_only_what_the_speeds_file_lacks(tmp_path):
    """--calibrate (calibrate_into) times every codec into a new file; on a file that
    lacks one codec (a plan that changed since), it times and adds that one alone, and
    keeps the others' measurements; each calibration records the load average."""
    import json
    from kvstore_ext import cost
    path = str(tmp_path / 'speeds.json')
    variants = [('dist_sync_hylo', 'hylo', {})]
    shapes = {'conv': (128, 64, 3, 3), 'fc': (256, 512), 'bias': (64,)}
    first = vcm.calibrate_into(path, variants, shapes, repeats=1)
    planned = cost.plan(vcm.scheme_of('dist_sync_hylo', {}), shapes, 1)
    assert not planned['conv'].passthrough and not planned['fc'].passthrough
    wanted = sorted(cost.signature(planned[k]) for k in ('conv', 'fc'))
    assert sorted(first.measured) == wanted
    with open(path) as f:
        saved = json.load(f)
    conv = cost.signature(planned['conv'])
    kept = saved['measured'].pop(conv)
    saved['measured'][cost.signature(planned['fc'])] = [1.0, 2.0]   # a mark: not re-timed
    with open(path, 'w') as f:
        json.dump(saved, f)
    again = vcm.calibrate_into(path, variants, shapes, repeats=1)
    assert again.measured[cost.signature(planned['fc'])] == (1.0, 2.0)
    assert conv in again.measured and len(kept) == 2
    with open(path) as f:
        records = json.load(f)['calibrations']
    assert [r['codecs'] for r in records] == [wanted, [conv]]
    assert all(len(r['loadavg_before']) == 3 for r in records)
    # nothing lacking: nothing timed, the file unchanged
    before = open(path).read()
    vcm.calibrate_into(path, variants, shapes, repeats=1)
    assert open(path).read() == before


def test_recalibrate_times_a_class_again_and_keeps_the_others(tmp_path):
    """--calibrate --recalibrate CLASS (calibrate_into's ``again``): the entries of that
    codec class are timed anew though the file has them (their code changed); the
    others keep their numbers, and the file's source says which class was re-timed."""
    import json
    from kvstore_ext import cost
    path = str(tmp_path / 'speeds.json')
    variants = [('dist_sync_hylo', 'hylo', {})]
    shapes = {'conv': (128, 64, 3, 3), 'fc': (256, 512)}
    vcm.calibrate_into(path, variants, shapes, repeats=1)
    planned = cost.plan(vcm.scheme_of('dist_sync_hylo', {}), shapes, 1)
    conv, fc = cost.signature(planned['conv']), cost.signature(planned['fc'])
    with open(path) as f:
        saved = json.load(f)
    saved['measured'] = {conv: [1.0, 2.0], fc: [3.0, 4.0]}       # marks: not timings
    with open(path, 'w') as f:
        json.dump(saved, f)
    again = vcm.calibrate_into(path, variants, shapes, repeats=1,
                               again=[fc.split('(')[0]])
    assert again.measured[conv] == (1.0, 2.0)
    assert fc in again.measured and again.measured[fc] != (3.0, 4.0)
    assert '1 codecs of %s timed again' % fc.split('(')[0] in again.source
    with open(path) as f:
        assert json.load(f)['calibrations'][-1]['codecs'] == [fc]


def test_replace_moves_the_old_rows_of_a_cell_aside():
    """--replace: a re-measured cell's new row takes the place of its old ones, which
    are kept in replaced_runs; rows of other cells stay."""
    def row(scheme, rate, step_s):
        return {'workers': 2, 'servers': 1, 'model': 'vgg', 'rate': rate,
                'scheme': scheme, 'step_s': step_s}
    result = {'runs': [row('dist_sync_fp16', '1gbit', 1.0), row('dist_sync', '1gbit', 2.0),
                       row('dist_sync_fp16', 'none', 3.0)]}
    new = row('dist_sync_fp16', '1gbit', 0.5)
    vcm.replace_cell(result, new)
    assert result['runs'] == [row('dist_sync', '1gbit', 2.0), row('dist_sync_fp16', 'none', 3.0)]
    assert result['replaced_runs'] == [row('dist_sync_fp16', '1gbit', 1.0)]


def test_a_rows_policy_is_the_agreed_rate_with_every_workers_fit():
    """bench/cluster.py's row carries policy='auto''s decisions (the same on every
    worker) once, with each worker's own rate fit; None for another kvstore."""
    fits = [{'rate_bits': 9e8, 'method': 'line'}, {'rate_bits': 7e8, 'method': 'line'}]
    workers = [{'policy': {'rate_bits': 8e8, 'rate_source': 'measured',
                           'compressed': {'0': True, '1': False}, 'rate_fit': fit}}
               for fit in fits]
    got = vcm.cluster.policy_of(workers)
    assert got == {'rate_bits': 8e8, 'rate_source': 'measured',
                   'compressed': {'0': True, '1': False}, 'rate_fits': fits}
    assert vcm.cluster.policy_of([{'policy': None}, {'policy': None}]) is None
    assert vcm.cluster.policy_of([{}, {}]) is None
