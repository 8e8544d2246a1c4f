"""One worker of the dist_sync_lgreco_hylo test: aggregate_job's loop (pushes from two
devices, saves what it pulled, its residuals and its plans) with layers whose filter
norms and magnitudes differ, so that L-GreCo moves Hylo's knobs away from the
defaults."""
import numpy as np

import aggregate_job as base

SHAPES = {'a': (32, 8, 3, 3), 'b': (24, 10, 3, 3), 'fc': (40, 50), 'bias': (30,)}


def gradient(rank, step, key, device):
    """'a': a conv layer whose energy sits in 4 fixed filters (few filters lose little);
    'b': a conv layer of noise (every filter alike); 'fc': heavy-tailed values (Student
    t, so thresholds matter). Each worker and device adds its own draw."""
    rng = np.random.default_rng([rank, step, device, sorted(SHAPES).index(key)])
    shape = SHAPES[key]
    if key == 'a':
        g = 0.05 * rng.standard_normal(shape)
        g[[3, 9, 17, 30]] += 1.0 + 0.1 * rng.standard_normal((4,) + shape[1:])
        return g.astype(np.float32)
    if key == 'fc':
        return (0.1 * rng.standard_t(3, shape)).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


if __name__ == '__main__':
    base.SHAPES, base.gradient = SHAPES, gradient
    base.main()
