"""The shipped codec speed table (cost.CODEC_TIMES, bench/results/codec_times.json): the
cost model's fallback for the codecs its kernel timings (cost.kernels_of) do not cover.

* the copy in cost.py is the results file;
* a codec kernels_of does not cover is priced from its class's rows, linearly
  interpolated on its elements (checked by hand from the rows); a class absent from the
  table (another rank, a wrapper the defaults do not plan) is still unpriced;
* the codecs kernels_of covers keep their kernel prices;
* ``advise`` now predicts a step for every registered scheme and mode.
"""
import json
import os

import pytest

import kvstore_ext
from kvstore_ext import advise, cost
from kvstore_ext.codecs import Float16Codec, PowerSGDCodec
from kvstore_ext.codecs.element_topk import ElementTopKCodec
from kvstore_ext.codecs.momentum import MomentumCorrected

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = cost.Link(cost.parse_rate('1Gbit'), 50e-6)


def test_codec_table_is_the_results_file():
    with open(os.path.join(REPO, cost.CODEC_TIMES_SOURCE)) as f:
        measured = json.load(f)['codecs']
    assert sorted(cost.CODEC_TIMES) == sorted(measured)
    for key, rows in measured.items():
        assert [r[0] for r in cost.CODEC_TIMES[key]] == [r[0] for r in rows], key
        assert [r[0] for r in rows] == sorted({r[0] for r in rows}), key
        for mine, theirs in zip(cost.CODEC_TIMES[key], rows):
            assert mine[1:] == pytest.approx(theirs[1:], rel=1e-3), key
            assert theirs[1] > 0 and theirs[2] >= 0, key


def by_hand(rows, n, column):
    """Linear between the two rows around ``n`` (``n`` within the rows)."""
    below = max((r for r in rows if r[0] <= n), key=lambda r: r[0])
    above = min((r for r in rows if r[0] >= n), key=lambda r: r[0])
    if below[0] == above[0]:
        return below[column]
    return below[column] + (above[column] - below[column]) * (n - below[0]) / (
        above[0] - below[0])


def planned(label, shape, workers=4):
    name, _, given = label.partition(':')
    params = dict(kv.split('=') for kv in given.split(',')) if given else {}
    scheme = kvstore_ext.SCHEMES[name[len('dist_sync_'):]](**params)
    return cost.plan(scheme, {'w': shape}, workers)['w']


@pytest.mark.parametrize('label,shape', [('dist_sync_powersgd', (650, 1000)),
                                         ('dist_sync_fp16', (650000,)),
                                         ('dist_sync_thc', (650, 1000))])
def test_a_codec_kernels_of_does_not_cover_is_priced_from_its_class(label, shape):
    codec = planned(label, shape)
    assert cost.kernels_of(codec) is None
    rows = cost.CODEC_TIMES[cost.codec_class(codec)]
    # the table holds rows on both sides of 650,000 elements: interpolated, not the ends
    assert rows[0][0] < codec.size < rows[-1][0] and codec.size not in [r[0] for r in rows]
    workers = 4
    worker, server = cost.KernelSpeeds().codec_seconds(codec, workers)
    assert worker == pytest.approx(by_hand(rows, codec.size, 1))
    assert server == pytest.approx(workers * by_hand(rows, codec.size, 2))
    below = max(r for r in rows if r[0] < codec.size)
    above = min(r for r in rows if r[0] > codec.size)
    assert min(below[1], above[1]) <= worker <= max(below[1], above[1])


def test_interpolation_on_a_given_table_by_hand():
    """Linear between rows; the first row's time below it; proportional above the last."""
    table = {'PowerSGDCodec[rank=4]': [(10000, 1e-4, 0.0), (1000000, 2.08e-3, 0.0)]}
    speeds = cost.KernelSpeeds(codec_times=table)
    # 505000 elements: halfway, (1e-4 + 2.08e-3) / 2
    assert speeds.codec_seconds(PowerSGDCodec((505, 1000), 4), 8) == pytest.approx(
        (1.09e-3, 0.0))
    assert speeds.codec_seconds(PowerSGDCodec((50, 100), 4), 8) == pytest.approx(
        (1e-4, 0.0))
    assert speeds.codec_seconds(PowerSGDCodec((2000, 1000), 4), 8) == pytest.approx(
        (4.16e-3, 0.0))
    server = {'Float16PairsCodec': [(1000, 1e-5, 2e-6), (3000, 3e-5, 6e-6)]}
    # 2000 elements: 2e-5 a worker, 4e-6 a worker's payload at the servers, x 3 workers
    assert cost.KernelSpeeds(codec_times=server).codec_seconds(
        kvstore_ext.codecs.Float16PairsCodec((2000,)), 3) == pytest.approx((2e-5, 1.2e-5))


def test_a_class_absent_from_the_table_is_not_priced():
    speeds = cost.KernelSpeeds()
    other_rank = PowerSGDCodec((1000, 1000), 3)
    assert cost.codec_class(other_rank) == 'PowerSGDCodec[rank=3]'
    assert cost.codec_class(other_rank) not in cost.CODEC_TIMES
    assert speeds.codec_seconds(other_rank, 4) is None
    corrected = MomentumCorrected(ElementTopKCodec((1000, 1000), 0.02), 0.9)
    assert cost.codec_class(corrected) == 'MomentumCorrected/ElementTopKCodec'
    assert cost.codec_class(corrected) not in cost.CODEC_TIMES
    assert speeds.codec_seconds(corrected, 4) is None
    # and a table without the class prices nothing
    assert cost.KernelSpeeds(codec_times={'x': [(1, 1.0, 0.0)]}).codec_seconds(
        Float16Codec((1000,), False), 4) is None


def test_the_codecs_kernels_of_covers_keep_their_kernel_prices():
    """Hylo's codecs (and 2-bit's) are priced by their kernels, whatever the table."""
    shapes = {'conv': (256, 128, 3, 3), 'fc': (1024, 4608)}
    for label in ('dist_sync_hylo', 'dist_sync_hylo:aggregation=server', 'dist_sync_2bit'):
        scheme_name, _, given = label.partition(':')
        params = dict(kv.split('=') for kv in given.split(',')) if given else {}
        codecs = cost.plan(kvstore_ext.SCHEMES[scheme_name[len('dist_sync_'):]](**params),
                           shapes, 8)
        for codec in codecs.values():
            assert cost.kernels_of(codec) is not None
            poisoned = {cost.codec_class(codec): [(1, 99.0, 99.0)]}
            assert cost.KernelSpeeds(codec_times=poisoned).codec_seconds(codec, 8) == \
                cost.KernelSpeeds(codec_times={}).codec_seconds(codec, 8)


def test_advise_predicts_a_step_for_every_scheme(tmp_path, capsys):
    shapes = {'conv1': [64, 3, 7, 7], 'conv2': [256, 128, 3, 3], 'bn': [256],
              'fc': [1000, 2048], 'fc_bias': [1000]}
    path = tmp_path / 'shapes.json'
    path.write_text(json.dumps(shapes))
    assert advise.main(['--shapes', str(path), '--workers', '8', '--servers', '2',
                        '--link', '10Gbit', '--compute-ms', '250']) == 0
    text = capsys.readouterr().out
    assert 'codec speed not measured' not in text
    rows = advise.predict({k: tuple(v) for k, v in shapes.items()}, 8, 2,
                          cost.Link(cost.parse_rate('10Gbit'), 50e-6), 0.25)
    labels = [label for label, _ in rows]
    for label in ('dist_sync_adacomp', 'dist_sync_fp16',
                  'dist_sync_fp16:aggregation=server', 'dist_sync_lgreco',
                  'dist_sync_powersgd', 'dist_sync_thc', 'dist_sync_topk'):
        assert label in labels
    assert [label for label, c in rows if c.step_seconds is None] == []
    assert all(c.step_seconds > 0.25 for _, c in rows)
