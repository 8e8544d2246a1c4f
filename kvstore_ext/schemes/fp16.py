"""Half precision: float16 payloads, summed by the stock server; error feedback optional.

Per tensor, after the worker has summed its devices:

1. **Size threshold.** Tensors with fewer than ``size_threshold`` elements (32768, as the
   other schemes, so that every scheme compresses the same tensors) and non-float32
   tensors go float32, uncompressed.
2. **Residual** (``error_feedback=1``; off by default). ``acc = grad + residual``; with
   ``error_feedback=0`` acc is the gradient and no residual is kept (codecs/fp16.py):
   float16 keeps 11 significant bits, so what rounding loses is a relative 2**-11 of
   each value, far below a minibatch gradient's own noise, and on cnn512 the runs
   ended as accurate without it, with a faster step
   (docs/decisions/fp16-error-feedback.md).
3. **Overflow.** acc is clipped to the largest float16 L with ``num_workers * L <=
   65504``, so that no worker's value and no partial sum at the server overflows
   float16; with error feedback what the clip holds back stays in the residual.
4. **Rounding.** The clipped acc is rounded to float16 (to nearest, ties to even); with
   error feedback the rounding error stays in the residual.
5. **Aggregation.** ``'sum'`` (the default): the halves travel in a float16 key;
   MXNet's server adds them (in float32, rounded once to float16: measured) and
   workers pull the float16 sum. ``'server'``: the halves travel two to a float32 word
   and the servers decode and add them in float32 with the plugin's kernels, then
   reply the sum rounded once to float16 (codecs/fp16.py, ``Float16PairsCodec``),
   slower on loopback than the stock server's sum (docs/schemes/fp16.md). Either way both
   directions carry 2 bytes an element (2x smaller than float32), and the last
   rounding is not fed back (docs/schemes/fp16.md).
"""

from .base import Scheme, SIZE_THRESHOLD
from ..codecs import Float16Codec, Float16PairsCodec
from ..params import Param


class Float16(Scheme):
    name = 'fp16'
    PARAMS = {
        'error_feedback': Param('int', 0, '1 keeps what the float16 rounding and the '
                                'overflow clip leave out and sends it with the next steps '
                                '(a residual a tensor, two passes over it a step); 0, as '
                                "PyTorch's fp16_compress_hook, keeps none: the same "
                                'accuracy on cnn512 over 6 seeds, a faster step',
                                low=0, high=1, rank='tune'),
        'aggregation': Param('str', 'sum', "'sum': MXNet's stock server adds the float16 "
                             "keys; 'server': the servers decode the halves and add them "
                             "in float32 with the plugin's kernels, then reply the sum as "
                             'float16: the same bytes, but slower on loopback at 4 workers '
                             '(its Gather round costs the workers and the servers more '
                             'CPU than the stock sum)',
                             choices=('sum', 'server'), rank='tune'),
        'size_threshold': SIZE_THRESHOLD,
    }

    def codec_for(self, shape, dtype, step=0):
        if self.exempt(shape, dtype):
            return self.uncompressed(shape, dtype)
        feedback = bool(self.params['error_feedback'])
        if self.params['aggregation'] == 'server':
            return Float16PairsCodec(shape, feedback)
        return Float16Codec(shape, feedback)
