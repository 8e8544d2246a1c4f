"""What the test jobs (and conftest.py) share: finding a job's processes in /proc, and
a one-process store to replay a worker with."""
import os


def environ(pid):
    """The environment of process ``pid`` as a list of b'KEY=VALUE' (empty if gone)."""
    try:
        with open('/proc/%s/environ' % pid, 'rb') as f:
            return f.read().split(b'\0')
    except OSError:
        return []


def pids_with(*entries):
    """Pids of the live processes whose environment holds every one of ``entries``
    (b'KEY=VALUE'); an entry ending in '=' matches any value of that key."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        env = environ(entry)
        if env and all(any(v == e or (e.endswith(b'=') and v.startswith(e)) for v in env)
                       for e in entries):
            found.append(int(entry))
    return found


def job_pids(role=None):
    """Pids of this job's processes (found by its root port), of ``role`` if given."""
    entries = [b'DMLC_PS_ROOT_PORT=' + os.environ['DMLC_PS_ROOT_PORT'].encode()]
    if role:
        entries.append(b'DMLC_ROLE=' + role.encode())
    return pids_with(*entries)


def one_process_store(kvstore, params):
    """A ``kvstore`` of one worker (the launcher's DMLC_ROLE hidden while it is made):
    its pushpull returns this worker's decoded payload, with this worker's residual."""
    import mxnet as mx
    role = os.environ.pop('DMLC_ROLE')
    try:
        store = mx.kv.create(kvstore)
    finally:
        os.environ['DMLC_ROLE'] = role
    store.set_gradient_compression(params)
    return store


def hylo_float32_from(first, name):
    """A Hylo scheme class, named ``name``, that re-plans every key to float32 at step
    ``first`` (what a re-plan hands over is then tested)."""
    from kvstore_ext.schemes import Hylo

    class Float32From(Hylo):
        def replans_at(self, step):
            return step == first

        def codec_for(self, shape, dtype, step=0):
            return (super().codec_for(shape, dtype) if step < first
                    else self.uncompressed(shape, dtype))

    Float32From.name = name
    return Float32From
