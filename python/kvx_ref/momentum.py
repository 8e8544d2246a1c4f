"""NumPy reference of Hylo's conv momentum correction (``momentum`` > 0; docs/DESIGN.md,
kvstore_ext/codecs/topk.py MomentumTopKCodec): DGC's momentum correction and factor
masking (Lin et al., "Deep Gradient Compression", ICLR 2018), delivered through an
optimizer that keeps its own momentum.

One step, over workers w, with the optimizer's momentum m:

1. ``u_w = m u_w + grad_w`` (the worker's velocity);
2. the worker sends the top-k filters of ``u_w + residual_w`` (topk_encode); its
   residual keeps the others; with factor masking (``masking``, the default) ``u_w`` is
   zeroed on the filters it sent;
3. ``S = sum_w sent_w`` (the servers decode and add);
4. the step returns ``S - m S_prev`` (``S_prev``: the previous step's S, 0 at first),
   so that an SGD optimizer with momentum m, whose buffer then holds ``S`` (times
   -lr), moves the weights by exactly ``-lr S``: DGC's update, with the optimizer
   unchanged.
"""
import numpy as np

from .codecs import topk_encode, topk_decode
from .wire import HEADER_WORDS

f32 = np.float32


def momentum_topk_step(grads, residuals, velocities, delivered, k, m, masking=True):
    """One step of every worker. ``grads``, ``residuals``, ``velocities``: per worker
    (float32 arrays of the tensor's shape; the last two None at first); ``delivered``:
    the previous S (None at first). Returns (what the step returns, S, new residuals,
    new velocities)."""
    total = np.zeros(grads[0].shape, f32)
    new_residuals, new_velocities = [], []
    for grad, residual, velocity in zip(grads, residuals, velocities):
        grad = np.asarray(grad, f32)
        u = grad.copy() if velocity is None else (f32(m) * velocity + grad).astype(f32)
        residual = np.zeros_like(grad) if residual is None else residual
        payload, new_residual, status = topk_encode(u, residual, k)
        assert status == 0
        decoded, status = topk_decode(payload, grad.size)
        assert status == 0
        total += decoded.reshape(grad.shape)
        sent = np.zeros(grad.shape[0], bool)
        sent[payload[HEADER_WORDS:HEADER_WORDS + k].astype(np.int64)] = True
        u = u.reshape(grad.shape[0], -1).copy()
        if masking:
            u[sent] = 0
        new_residuals.append(new_residual)
        new_velocities.append(u.reshape(grad.shape))
    returned = total if delivered is None else (total - f32(m) * delivered).astype(f32)
    return returned, total, new_residuals, new_velocities
