"""One worker of the dist_sync_lgreco test: aggregate_job's loop (pushes from two
devices, saves what it pulled, its residuals and its plans) with gradients whose
layers differ in character, so that L-GreCo's ranks move away from the default."""
import numpy as np

import aggregate_job as base

SHAPES = {'a': (48, 200), 'b': (30, 90), 'c': (20, 60), 'bias': (30,)}


def gradient(rank, step, key, device):
    """'a' nearly rank 2 (large), 'b' a steep spectrum on a fixed basis (small), 'c'
    noise; each worker and device adds its own noise."""
    rng = np.random.default_rng([rank, step, device, sorted(SHAPES).index(key)])
    shape = SHAPES[key]
    fixed = np.random.default_rng(99)
    noise = rng.standard_normal(shape)
    if key == 'a':
        low = fixed.standard_normal((48, 2)) @ fixed.standard_normal((2, 200))
        return (0.5 * low + 0.02 * noise).astype(np.float32)
    if key == 'b':
        u = np.linalg.qr(fixed.standard_normal((30, 30)))[0]
        v = np.linalg.qr(fixed.standard_normal((90, 30)))[0]
        spectrum = 15 * 0.6 ** np.arange(30)
        return ((u * spectrum) @ v.T + 0.01 * noise).astype(np.float32)
    return noise.astype(np.float32)


if __name__ == '__main__':
    base.SHAPES, base.gradient = SHAPES, gradient
    base.main()
