"""NumPy reference of DGC's momentum correction and factor masking (Lin et al., "Deep
Gradient Compression", ICLR 2018) around a top-k codec, delivered through an optimizer
that keeps its own momentum (kvstore_ext/codecs/momentum.py): Hylo's conv top-k
(``momentum_topk_step``), dist_sync_topk's element top-k
(``momentum_element_topk_step``) and dist_sync_adacomp's selection
(``momentum_adacomp_step``); and Hylo's FC ternary coding the velocity without masking
(``momentum_ternary_step``).

One step, over workers w, with the optimizer's momentum m:

1. ``u_w = m u_w + grad_w`` (the worker's velocity);
2. the worker sends the top-k (filters, or elements) of ``u_w + residual_w``; its
   residual keeps the rest; with factor masking (``masking``, the default) ``u_w`` is
   zeroed on what it sent (``masking`` False: kept; the masking that follows the
   learning rate says which of the two a step does). AdaComp: ``u_w``
   takes the gradient's place in the codec, ``G = u_w + residual_w`` and
   ``H = G + u_w``; what is sent are AdaComp's elements,
   the residual keeps ``G - sign * scale`` on them (not 0: AdaComp's own rule);
3. ``S = sum_w sent_w`` (the servers decode and add);
4. the step returns ``S - m S_prev`` (``S_prev``: the previous step's S, 0 at first),
   so that an SGD optimizer with momentum m, whose buffer then holds ``S`` (times
   -lr), moves the weights by exactly ``-lr S``: DGC's update, with the optimizer
   unchanged.

A key that leaves the correction (a re-plan) hands over ``momentum_owed``: a gradient
whose sum over workers, ``(1 - m) sum_w residual_w + m sum_w u_w - m S_prev``, leaves
the optimizer's buffer as momentum SGD's would be and moves the weights by the unsent
velocities exactly once.
"""
import numpy as np

from .codecs import (adacomp_decode, adacomp_encode, adacomp_entry_words,
                     element_topk_decode, element_topk_encode, element_topk_index_words,
                     ternary_decode, ternary_encode, topk_decode, topk_encode)
from .wire import HEADER_WORDS

f32 = np.float32


def _step(grads, residuals, velocities, delivered, m, masking, encode, decode, sent_rows):
    total = np.zeros(grads[0].shape, f32)
    new_residuals, new_velocities = [], []
    for grad, residual, velocity in zip(grads, residuals, velocities):
        grad = np.asarray(grad, f32)
        u = grad.copy() if velocity is None else (f32(m) * velocity + grad).astype(f32)
        residual = np.zeros_like(grad) if residual is None else residual
        payload, new_residual, status = encode(u, residual)
        assert status == 0
        decoded, status = decode(payload, grad.size)
        assert status == 0
        total += decoded.reshape(grad.shape)
        rows, sent = sent_rows(payload, grad)
        u = u.reshape(rows, -1).copy()
        if masking:
            u[sent] = 0
        new_residuals.append(new_residual)
        new_velocities.append(u.reshape(grad.shape))
    returned = total if delivered is None else (total - f32(m) * delivered).astype(f32)
    return returned, total, new_residuals, new_velocities


def momentum_topk_step(grads, residuals, velocities, delivered, k, m, masking=True):
    """One step of every worker, filter top-k. ``grads``, ``residuals``,
    ``velocities``: per worker (float32 arrays of the tensor's shape; the last two None
    at first); ``delivered``: the previous S (None at first). Returns (what the step
    returns, S, new residuals, new velocities)."""
    def sent_filters(payload, grad):
        return grad.shape[0], payload[HEADER_WORDS:HEADER_WORDS + k].astype(np.int64)
    return _step(grads, residuals, velocities, delivered, m, masking,
                 lambda u, r: topk_encode(u, r, k), topk_decode, sent_filters)


def momentum_element_topk_step(grads, residuals, velocities, delivered, k, m,
                               masking=True):
    """The same for element top-k (a 1-D chunk of ``k`` sent elements)."""
    def sent_elements(payload, grad):
        width = element_topk_index_words(grad.size) + 1
        entries = payload[HEADER_WORDS:].reshape(k, width).astype(np.int64)
        sent = entries[:, 0] + (entries[:, 1] << 24 if width == 3 else 0)
        return grad.size, sent
    return _step(grads, residuals, velocities, delivered, m, masking,
                 lambda u, r: element_topk_encode(u, r, k), element_topk_decode,
                 sent_elements)


def momentum_adacomp_step(grads, residuals, velocities, delivered, bin_len, capacity, m,
                          masking=True):
    """The same for AdaComp (a 1-D chunk; ``bin_len`` and ``capacity`` as
    ``adacomp_encode``): the velocity is encoded in the gradient's place, so
    ``G = u + residual`` and ``H = G + u``; the elements sent are the payload's
    ``count`` entries (the slot's padding is not sent)."""
    def sent_elements(payload, grad):
        count, width = int(payload[6]), adacomp_entry_words(grad.size)
        words = payload[HEADER_WORDS:HEADER_WORDS + count * width].astype(np.int64)
        codes = words.reshape(count, width)
        codes = codes[:, 0] + (codes[:, 1] << 24 if width == 2 else 0)
        return grad.size, codes >> 1

    def decode(payload, n):
        return adacomp_decode(payload[:HEADER_WORDS + int(payload[7])], n)
    return _step(grads, residuals, velocities, delivered, m, masking,
                 lambda u, r: adacomp_encode(u, r, bin_len, capacity), decode,
                 sent_elements)


def momentum_ternary_step(grads, residuals, velocities, delivered, scale, m, value='round'):
    """The same for Hylo's FC ternary (a 1-D chunk, t = ``scale`` * mean|u + residual|,
    v by ``value``): every value is coded, none masked, so the velocity is never
    zeroed."""
    def nothing_masked(payload, grad):
        return grad.size, np.zeros(0, np.int64)
    return _step(grads, residuals, velocities, delivered, m, False,
                 lambda u, r: ternary_encode(u, r, scale, value=value), ternary_decode,
                 nothing_masked)


def momentum_fp16_step(grads, residuals, velocities, delivered, m):
    """dist_sync_fp16's float16 codec (codecs.fp16_encode) coding the velocity, never
    masked: the correction around a codec that says nothing of what it sent
    (kvstore_ext's ``MomentumCorrected`` wraps any codec)."""
    from .codecs import fp16_encode
    workers = len(grads)

    def encode(u, residual):
        return fp16_encode(u, residual, workers)

    def decode(payload, n):
        return np.asarray(payload, np.float32).reshape(-1), 0

    def nothing_masked(payload, grad):
        return grad.size, np.zeros(0, np.int64)
    return _step(grads, residuals, velocities, delivered, m, False,
                 encode, decode, nothing_masked)


def momentum_owed(residual, velocity, delivered, m, num_workers):
    """What one worker sends with the first step after its key leaves the
    correction: ``(1 - m) residual + m u - m S_prev / num_workers`` (absent arrays: 0)."""
    parts = [(1 - m) * residual if residual is not None else 0.0,
             m * velocity if velocity is not None else 0.0,
             -(m / num_workers) * delivered if delivered is not None else 0.0]
    return np.asarray(sum(parts), dtype=np.float32)
