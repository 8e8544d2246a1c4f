"""One worker of the failure tests (run under kvstore_ext.launch).

--mode nonfinite: rank 0's gradient holds a NaN at step 2: every worker's sum of that
  step is NaN (rank 0's contribution is void) and training goes on: at steps 3 and 4
  each worker checks the sum against what one-process stores of every rank give (rank
  0's store sees the same NaN and keeps its residual), and prints a checksum that the
  test compares across workers. --aggregation homomorphic or --pull compressed: the
  same, without the one-process comparison (a threshold agreed over workers; a reply
  the servers re-encode). --kvstore dist_sync_thc (or another scheme): the same with
  that scheme's defaults. --replan: Hylo re-plans the key to float32 at that very
  step, handing over its residual (Codec.owed): the void step must not lose it, so
  each worker's sums over the finite steps equal the finite steps' gradients.
--mode malformed: at step 1, rank 1 pushes a payload with a corrupted header; every
  worker checks that this round's sum is NaN (the server rejected it and lived on) and
  that the next round is correct again.
--mode kill-server: after step 1, rank 0 kills this job's server (SIGKILL; found in /proc
  by its DMLC_ROLE and the job's root port) and both workers go on pushing.
"""
import argparse
import os
import signal

import numpy as np

from job_util import hylo_float32_from, job_pids, one_process_store


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--mode', choices=('nonfinite', 'malformed', 'kill-server'),
                        required=True)
    parser.add_argument('--aggregation', default='server')
    parser.add_argument('--pull', default='float32')
    parser.add_argument('--nan-ranks', default='0')
    parser.add_argument('--kvstore', default='dist_sync_hylo',
                        help='another scheme: its defaults, no one-process comparison')
    parser.add_argument('--replan', action='store_true',
                        help='Hylo re-plans the key to float32 at the NaN step')
    args = parser.parse_args()
    NAN_RANKS[:] = [int(r) for r in args.nan_ranks.split(',')]
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    hylo = args.kvstore == 'dist_sync_hylo'
    params = {'size_threshold': 10}
    if hylo:
        params['aggregation'] = args.aggregation
    if args.pull != 'float32':
        params['pull'] = args.pull
    kv = mx.kv.create(replanning_hylo() if args.replan else args.kvstore)
    kv.set_gradient_compression(params)
    shape = (40, 25)
    alone = None
    delivered = gradients = 0
    if (args.mode == 'nonfinite' and hylo and args.aggregation == 'server'
            and args.pull == 'float32' and not args.replan):
        alone = [one_process_store('dist_sync_hylo', params) for _ in range(kv.num_workers)]
    for step in range(5 if args.mode == 'nonfinite' else 4):
        if args.mode == 'nonfinite':
            expect = None
            if alone is not None:
                outs = [gradient(rank, step, shape) for rank in range(kv.num_workers)]
                for store, out in zip(alone, outs):
                    store.pushpull('w', out)       # one worker's decoded payload
                expect = sum(o.asnumpy() for o in outs)
            value = gradient(kv.rank, step, shape)
            kv.pushpull('w', value)
            out = value.asnumpy()
            if step == 2:
                # (float32 goes through MXNet's pushpull: NaN where the NaN is)
                assert np.isnan(out).any() if args.replan else np.isnan(out).all(), out
            else:
                assert np.isfinite(out).all() and abs(out).sum() > 0, out
                if expect is not None:
                    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)
                if args.replan:
                    delivered = delivered + out
                    gradients = gradients + sum(gradient(rank, step, shape).asnumpy()
                                                for rank in range(kv.num_workers))
            print('step %d ok checksum %.9g' % (step, np.nansum(out)), flush=True)
            continue
        grad = np.random.default_rng([kv.rank, step]).standard_normal(shape).astype(np.float32)
        codec_encode = None
        if args.mode == 'malformed' and kv.rank == 1 and step == 1:
            # fault injection: the store's own codec (kv.plan gives it, to read;
            # here it is changed on purpose) sends a malformed payload once
            codec = kv.plan('w').chunks[0].codec
            codec_encode = codec.encode

            def corrupted(g, r, _encode=codec_encode):
                payload = _encode(g, r)
                payload[2] = 99.0          # unsupported version
                return payload
            codec.encode = corrupted
        value = mx.nd.array(grad)
        kv.pushpull('w', value)
        out = value.asnumpy()
        if codec_encode is not None:
            codec.encode = codec_encode
        if args.mode == 'malformed':
            if step == 1:
                assert np.isnan(out).all(), out
            else:
                assert np.isfinite(out).all() and abs(out.sum()) > 0, out
        print('step %d ok' % step, flush=True)
        if args.mode == 'kill-server' and kv.rank == 0 and step == 1:
            for pid in job_pids('server'):
                print('killing server pid %d' % pid, flush=True)
                os.kill(pid, signal.SIGKILL)
    if args.replan:
        # every key float32 from step 2 on, and the residuals handed over at step 3
        # (the void step 2 lost its gradients, as dist_sync's does, and nothing else)
        assert kv.key_state('w').residual is None
        np.testing.assert_allclose(delivered, gradients, rtol=1e-5, atol=1e-4)
        print('finite steps delivered their gradients', flush=True)


def replanning_hylo():
    """The kvstore type of a Hylo that re-plans every key to float32 at step 2."""
    import kvstore_ext
    return kvstore_ext.register_scheme(hylo_float32_from(2, 'test_replan_at_two')).__name__


NAN_RANKS = [0]        # whose gradient holds a NaN at step 2 (--nan-ranks)


def gradient(rank, step, shape):
    """Rank's gradient at step; at step 2 those of NAN_RANKS hold a NaN."""
    import mxnet as mx
    grad = np.random.default_rng([rank, step]).standard_normal(shape).astype(np.float32)
    if rank in NAN_RANKS and step == 2:
        grad[3, 3] = np.nan
    return mx.nd.array(grad)


if __name__ == '__main__':
    main()
