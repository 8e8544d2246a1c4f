"""bench/real_models.py's prediction of a measured cluster row: the row's rate is in
bits/s (tc's unit) and the model's link in bytes/s, and the row's kvstore and
compression parameters choose the scheme. Nothing here runs a job or times anything."""
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
