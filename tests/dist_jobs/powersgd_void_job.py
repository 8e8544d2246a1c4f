"""One worker of test_powersgd_void.py's job (run under kvstore_ext.launch).

Every key is one chunk of ``dist_sync_powersgd``, so no whole-gradient check runs: a
NaN/Inf must be found in the summed P or Q. Steps 0 and 2 are finite; at step 1 one
worker's gradient of each key holds a non-finite value (CASES: that worker, the row,
the column, the value), or, for ``'overflow'``, finite values whose P overflows. Column
ZERO_COL of every gradient is zero, so after step 0 Q's row ZERO_COL is exactly zero
(the ``zero_q`` keys put their value there: NaN * 0 and Inf * 0 must still reach P).
Saves per step what it pulled, its residual and Q, and the keys' modes and the
package's log records, for the test to compare with the NumPy reference.
"""
import argparse
import json
import logging
import os

import numpy as np

SHAPE = (30, 50)
ZERO_COL = 7
PARAMS = {'size_threshold': 0, 'rank': 2}
STEPS = 3
BAD_STEP = 1
CASES = {               # key: (rank, row, column, value)
    'first_nan': (0, 0, 11, np.nan),
    'middle_inf': (1, 15, 11, np.inf),
    'last_neginf': (0, 29, 11, -np.inf),
    'zero_q_nan': (1, 15, ZERO_COL, np.nan),
    'zero_q_inf': (0, 29, ZERO_COL, np.inf),
    'overflow': (1, 15, None, None),    # row 15 = 3e38 * sign(Q[:, 0]): finite, P not
}


def gradient(rank, step, key):
    """A worker's finite gradient of ``key`` at ``step`` (the test recomputes it):
    PARAMS['rank'] strong directions (the same on every worker) of distinct strengths
    over noise (each worker's own), so that float32 and the float64 reference follow
    the same subspace of the sum."""
    shared = np.random.default_rng([step, sorted(CASES).index(key)])
    own = np.random.default_rng([rank, step, sorted(CASES).index(key), 1])
    rows, cols, r = SHAPE[0], SHAPE[1], PARAMS['rank']
    left = np.linalg.qr(shared.standard_normal((rows, r)))[0]
    right = np.linalg.qr(shared.standard_normal((cols, r)))[0]
    grad = (left * (20.0 * 0.5 ** np.arange(r))) @ right.T
    grad = (grad + 0.1 * own.standard_normal(SHAPE)).astype(np.float32)
    grad[:, ZERO_COL] = 0
    return grad


def spoil(grad, key, q):
    """Step BAD_STEP's gradient of the worker CASES names: a non-finite value, or a
    row aligned with Q's first column whose P = M Q overflows float32."""
    _, row, column, value = CASES[key]
    if value is None:
        grad[row] = 3e38 * np.sign(q[:, 0])
    else:
        grad[row, column] = value
    return grad


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--out', required=True)
    args = parser.parse_args()

    import mxnet as mx
    import kvstore_ext  # noqa: F401  registers the kvstore types
    records = Records()
    logger = logging.getLogger('kvstore_ext')
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    kv = mx.kv.create('dist_sync_powersgd')
    kv.set_gradient_compression(PARAMS)
    saved = {}
    for step in range(STEPS):
        for key in sorted(CASES):
            grad = gradient(kv.rank, step, key)
            if step == BAD_STEP and CASES[key][0] == kv.rank:
                grad = spoil(grad, key, kv.key_state(key).chunks[0]['Q'])
            value = mx.nd.array(grad)
            kv.pushpull(key, value)
            state = kv.key_state(key)
            saved['out/%s/%d' % (key, step)] = value.asnumpy()
            saved['res/%s/%d' % (key, step)] = state.residual
            saved['q/%s/%d' % (key, step)] = state.chunks[0]['Q']
    np.savez(os.path.join(args.out, 'rank%d.npz' % kv.rank), **saved)
    with open(os.path.join(args.out, 'rank%d.json' % kv.rank), 'w') as f:
        json.dump({'modes': {key: kv.plan(key).mode for key in CASES},
                   'logs': records.records}, f)


if __name__ == '__main__':
    main()
