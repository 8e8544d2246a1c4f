"""bench/real_models.py's prediction of a measured cluster row: the row's rate is in
bits/s (tc's unit) and the model's link in bytes/s, and the row's kvstore and
compression parameters choose the scheme; its codec speeds are calibrated once and
reused, and the host term applies to the measured rows only. Nothing here runs a cluster
job; the calibration times a small model's codecs in one process."""
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench')
sys.path.insert(0, BENCH)

import real_models  # noqa: E402


def test_a_row_is_predicted_at_its_rate_in_bytes():
    """2 workers push a 4 MB float32 tensor to 1 server over 8 Mbit/s (1 MB/s): the
    server's link carries 8 MB in, 8 s, then (one key: its sum leaves once every push is
    in) 8 MB out, 8 s, plus the row's compute time (no transport CPU here)."""
    from kvstore_ext import cost
    row = {'rate_bps': 8e6, 'num_workers': 2, 'num_servers': 1, 'compute_s': 0.5,
           'kvstore': 'dist_sync', 'compression_params': {}}
    free = cost.KernelSpeeds(transport=cost.TransportCPU({}))
    got = real_models.predict_run(row, {'w': (1000, 1000)}, free)
    assert got['bytes_push'] == got['bytes_pull'] == 4000000
    assert got['step_s'] == pytest.approx(16.5)
    row.update(kvstore='dist_sync_hylo', compression_params={'aggregation': 'server'})
    hylo = real_models.predict_run(row, {'w': (1000, 1000)}, cost.KernelSpeeds())
    assert hylo['bytes_push'] < got['bytes_push'] and hylo['step_s'] is not None


# A small model in place of ResNet-50 and VGG-16 (shapes_of is the only door to them):
# every scheme compresses its conv and FC weights, the bias stays float32.
SMALL = {'conv': (64, 32, 3, 3), 'fc': (256, 512), 'bias': (64,)}


@pytest.fixture(scope='module')
def predicted_then_extrapolated(tmp_path_factory):
    """`predict` on a measured file of the small model, then `extrapolate`, with the
    real codec calibration counted: what each calibration timed, and both outputs."""
    import kvstore_ext.cost_calibrate as cc
    tmp = tmp_path_factory.mktemp('real_models')
    measured, scale = str(tmp / 'cluster.json'), str(tmp / 'scale.json')
    rows = [{'model': 'small', 'scheme': kvstore, 'kvstore': kvstore,
             'compression_params': {}, 'rate_bps': rate, 'rate': '%dbit' % rate,
             'num_workers': 2, 'num_servers': 1, 'compute_s': 0.02, 'step_s': 0.05}
            for kvstore in ('dist_sync', 'dist_sync_hylo') for rate in (1e9, 4e9)]
    with open(measured, 'w') as f:
        json.dump({'config': {}, 'runs': rows}, f)
    timed, calibrate = [], cc.calibrate

    def counted(*args, **kwargs):
        speeds = calibrate(*args, **kwargs)
        timed.append(sorted(speeds.measured))
        return speeds
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cc, 'calibrate', counted)
        mp.setattr(real_models, 'shapes_of', lambda model: dict(SMALL))
        mp.setattr(real_models, 'SPEEDS', str(tmp / 'speeds.json'), raising=False)
        assert real_models.main(['predict', '--json', measured]) == 0
        assert real_models.main(['extrapolate', '--models', 'small', '--workers', '2', '16',
                                 '--links', '1Gbit', '--compute-ms', 'small=20',
                                 '--json', scale]) == 0
    with open(measured) as f, open(scale) as g:
        return {'timed': timed, 'speeds': str(tmp / 'speeds.json'),
                'measured': json.load(f), 'scale': json.load(g)}


def test_codecs_are_calibrated_once_and_the_speeds_file_reused(predicted_then_extrapolated):
    """`predict` times the codecs and saves them; `extrapolate` after it times none and
    predicts from the same file, which records the load average of its calibration."""
    import validate_cost_model
    got = predicted_then_extrapolated
    first, *later = got['timed']
    assert first and all(not codecs for codecs in later), got['timed']
    with open(got['speeds']) as f:
        saved = json.load(f)
    assert sorted(saved['measured']) == first
    [record] = saved['calibrations']
    assert record['codecs'] == first
    assert len(record['loadavg_before']) == len(record['loadavg_after']) == 3
    speeds = validate_cost_model.load_speeds(got['speeds'])
    for cell in got['scale']['cells']:
        from kvstore_ext import advise, cost
        rows = advise.predict(SMALL, cell['workers'], cell['workers'],
                              cost.Link(cost.parse_rate(cell['link']), 50e-6),
                              cell['compute_ms'] / 1e3, 0.0, speeds)
        assert cell['step_ms'] == pytest.approx(
            {label: 1e3 * c.step_seconds for label, c in rows})
    assert got['scale']['speeds']['loadavg'] == [[record['loadavg_before'][0],
                                                   record['loadavg_after'][0]]]


def test_the_host_term_is_in_the_measured_rows_not_in_the_extrapolation(
        predicted_then_extrapolated):
    """The measured rows' nodes shared this machine's cores: predicted with the host
    term, as validate_cost_model predicts its jobs. The extrapolation is a real
    cluster (every node its own cores): without it."""
    import validate_cost_model
    from kvstore_ext import advise, cost
    got = predicted_then_extrapolated
    assert all(row['predicted']['host_s'] is not None for row in got['measured']['runs'])
    assert got['measured']['host_cores'] == os.cpu_count()
    speeds = validate_cost_model.load_speeds(got['speeds'])
    for row in got['measured']['runs']:
        assert row['predicted'] == validate_cost_model.predict(
            SMALL, row['kvstore'], {}, 2, 1, row['rate_bps'], 0.0, row['compute_s'],
            speeds, os.cpu_count())
    # a host term that binds whatever this machine's codec speeds (every node of a
    # 16-worker cluster on a hundredth of a core) would change the extrapolated steps;
    # with 2 cores it binds only when the calibrated codecs are slow (a loaded machine)
    cell = [c for c in got['scale']['cells'] if c['workers'] == 16][0]
    link = cost.Link(cost.parse_rate(cell['link']), 50e-6)
    shared = cost.scheme_step(vcm_scheme('dist_sync_hylo'), SMALL, 16, 16, link, 0.02,
                              speeds, host_cores=0.01)
    own = dict(advise.predict(SMALL, 16, 16, link, 0.02, 0.0, speeds))['dist_sync_hylo']
    assert shared.step_seconds > own.step_seconds
    assert cell['step_ms']['dist_sync_hylo'] == pytest.approx(1e3 * own.step_seconds)


def vcm_scheme(kvstore):
    import validate_cost_model
    return validate_cost_model.scheme_of(kvstore, {})
