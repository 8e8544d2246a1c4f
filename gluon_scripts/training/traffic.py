"""Bytes a worker pushes and pulls per step, for the logs and the summary: the
kvstore's own counters where it has them (kvstore_ext types), else what MXNet's dist
kvstores send (every trainable parameter in float32)."""
import numpy as np


class Traffic:
    """Bytes this worker pushes and pulls: the kvstore's own counters (kvstore_ext
    types), else, for MXNet's dist kvstores, the float32 gradients it sends each step
    (every trainable parameter, pushed and pulled whole)."""

    def __init__(self, kv, net):
        self.kv, self.net = kv, net
        self.counted = hasattr(kv, 'comm_stats')
        self.dist = kv.type.startswith('dist')
        self.steps = 0

    @property
    def raw_per_step(self):
        """float32 bytes of all trainable parameters; read when asked, not at start:
        Gluon's deferred initialisation gives shapes only at the first forward."""
        return 4 * sum(int(np.prod(p.shape)) for p in
                       self.net.collect_params().values() if p.grad_req != 'null')

    def snapshot(self):
        if self.counted:
            s = self.kv.comm_stats()
            return {k: s[k] for k in ('raw_bytes', 'push_bytes', 'pull_bytes')}
        wire = self.raw_per_step * self.steps if self.dist else 0
        return {'raw_bytes': self.raw_per_step * self.steps, 'push_bytes': wire,
                'pull_bytes': wire}

    @staticmethod
    def per_step(before, after, steps):
        steps = max(steps, 1)
        return {k: (after[k] - before[k]) / steps for k in after}

    @staticmethod
    def text(rates):
        return 'pushed %s/step, pulled %s/step' % (format_size(rates['push_bytes']),
                                                   format_size(rates['pull_bytes']))


def format_size(n):
    """Bytes as text: '1.5 KB'."""
    for unit in ('B', 'KB', 'MB'):
        if abs(n) < 1024:
            return '%.1f %s' % (n, unit)
        n /= 1024.0
    return '%.1f GB' % n
