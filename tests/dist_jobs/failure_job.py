"""One worker of the failure tests (run under kvstore_ext.launch).

--mode nonfinite: rank 0 pushes a NaN gradient at step 2 and does not catch the error.
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--mode', choices=('nonfinite', 'malformed', 'kill-server'),
                        required=True)
    args = parser.parse_args()
    import mxnet as mx
    import kvstore_ext  # noqa: F401
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression({'size_threshold': 10})
    shape = (40, 25)
    for step in range(4):
        grad = np.random.default_rng([kv.rank, step]).standard_normal(shape).astype(np.float32)
        if args.mode == 'nonfinite' and kv.rank == 0 and step == 2:
            grad[3, 3] = np.nan
        codec_encode = None
        if args.mode == 'malformed' and kv.rank == 1 and step == 1:
            state = kv._keys.get('w')
            codec_encode = state.chunks[0].codec.encode

            def corrupted(g, r, _encode=codec_encode):
                payload = _encode(g, r)
                payload[2] = 99.0          # unsupported version
                return payload
            state.chunks[0].codec.encode = corrupted
        value = mx.nd.array(grad)
        kv.pushpull('w', value)
        out = value.asnumpy()
        if codec_encode is not None:
            state.chunks[0].codec.encode = codec_encode
        if args.mode == 'malformed':
            if step == 1:
                assert np.isnan(out).all(), out
            else:
                assert np.isfinite(out).all() and abs(out.sum()) > 0, out
        print('step %d ok' % step, flush=True)
        if args.mode == 'kill-server' and kv.rank == 0 and step == 1:
            for pid in servers_of_this_job():
                print('killing server pid %d' % pid, flush=True)
                os.kill(pid, signal.SIGKILL)


def servers_of_this_job():
    """Pids of the processes whose environment says DMLC_ROLE=server with our root port."""
    port = os.environ['DMLC_PS_ROOT_PORT'].encode()
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as f:
                env = dict(item.split(b'=', 1) for item in f.read().split(b'\0') if b'=' in item)
        except OSError:
            continue
        if env.get(b'DMLC_ROLE') == b'server' and env.get(b'DMLC_PS_ROOT_PORT') == port:
            found.append(int(entry))
    assert found, 'no server of this job found'
    return found


if __name__ == '__main__':
    main()
