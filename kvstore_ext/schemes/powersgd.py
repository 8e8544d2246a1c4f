"""PowerSGD: rank-r gradient approximation with error feedback, in two additive rounds.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", NeurIPS 2019 (arXiv 1905.13727). Per tensor, after the
worker has summed its devices:

1. **Which tensors: those where it pays in bytes.** A tensor of 2 or more float32
   axes is compressed if its rank-r factors are at least 2x smaller than it,
   ``2 * rank * (rows + cols) <= rows * cols`` for its ``rows x cols`` view: the rule
   of PyTorch's powerSGD_hook (``min_compression_rate`` 2). There is no size rule by
   default (``size_threshold`` 0): a small matrix that passes the rule saves bytes like
   a large one (on the MNIST CNN cnn512, conv1 32 x 25 and fc2 10 x 512 do, and with
   them rank 4 sends what PyTorch's hook sends, 20,982 words a step, where the former
   size rule of 32768 elements sent 37,130). 1-D tensors (biases, batch-norm
   parameters) and non-float32 tensors go float32, uncompressed.
2. **Matrix view.** A tensor of 2 or more axes is viewed as ``O x rest`` (conv weights
   ``O x (I kh kw)``, FC weights as they are).
3. **Whole matrices.** A matrix is one low-rank problem (one P, one Q), cut into row
   ranges (chunking.py), each its own problem, only if its factors hold more than
   ``chunk_size`` words (codecs/powersgd.py says why).
4. **The step** (codecs/powersgd.py, numbered there): ``M = grad + residual``;
   ``P = sum_w M_w Q`` (round 'P'); P orthonormalised identically on every worker;
   ``Q = sum_w M_w^T P`` (round 'Q'); every worker gets ``P Q^T``, the rank-r
   approximation of the sum; each keeps its own error ``M_w - P Q_w^T`` (error
   feedback) and the orthonormalised Q for the next step (warm start, checkpointed).
   Both rounds are additive: the stock server sums them, pushes and pulls alike carry
   ``rank * (rows + cols)`` floats instead of ``rows * cols``.
5. **Warm-up** (``warmup_steps``, default 0): the first steps of every compressible
   tensor go float32, as PyTorch's hook does (``start_powerSGD_iter``); the scheme then
   re-plans the key (``replans_at``) to PowerSGD, with a fresh residual and Q.

``rank`` 4 by default: PyTorch's hook documents that "typically only a small value 1-4
is used" and advises raising the rank from 1 (its default) until accuracy is
satisfactory; runs here are short (32 steps an epoch at 4 workers), with little time to
make up for a coarse approximation, so the top of that range. Rank 4 sends 2.4-110x
fewer floats than the tensors it compresses in the bundled MNIST models hold (cnn512's
fc2 10 x 512: 2.4x; its fc1 512 x 3136: 110x).
"""

from .base import Scheme
from .. import chunking
from ..codecs.powersgd import PowerSGDCodec
from ..params import Param


class PowerSGD(Scheme):
    name = 'powersgd'
    PARAMS = {
        'rank': Param('int', 4, 'rank r of the approximation P Q^T: bytes grow with it; '
                      "PyTorch's advice: raise it by factors of 2 until accuracy is "
                      'satisfactory (8 narrowed the MLP\'s loss at 27x instead of 46x)',
                      low=1, rank='tune'),
        'warmup_steps': Param('int', 0, 'the first this many steps of every compressible '
                              'tensor go float32 (dense warm-up), then the key is '
                              're-planned; PyTorch suggests 10% of training', low=0,
                              rank='tune'),
        'size_threshold': Param('int', 0, 'tensors with fewer elements go uncompressed; '
                                '0: none, the bytes rule alone decides (a tensor is '
                                'compressed where its rank-r factors are at least 2x '
                                'smaller)', low=0, rank='leave'),
        'seed': Param('int', 0, 'seed of the initial Q (the same on every worker)', low=0,
                      rank='leave'),
    }

    def replans_at(self, step):
        return step == self.params['warmup_steps'] > 0

    def codec_for(self, shape, dtype, step=0):
        p = self.params
        if self.exempt(shape, dtype) or len(shape) < 2 or step < p['warmup_steps']:
            return self.uncompressed(shape, dtype)
        codec = PowerSGDCodec(shape, p['rank'], p['seed'])
        if not all(c.codec.compressible() for c in chunking.split(codec, p['chunk_size'])):
            # (a matrix is cut only where its factors exceed chunk_size: then every
            # chunk must pay)
            return self.uncompressed(shape, dtype)
        return codec
