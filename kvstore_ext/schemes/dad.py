"""dAD / rank-dAD: Dense layers send what their gradient is made of; other layers go
through a fallback scheme (Hylo by default).

Bischof, Rahman, Ghosh, Plis, "Distributed Auto-Differentiation" (arXiv 2102.09631;
the authors' code: bbradt/catalyst-dad). A Dense layer's weight gradient over a batch
is ``D^T A`` (A: the layer's inputs, rows x in; D: the gradient w.r.t. its output
before the activation, rows x out), so a worker may send A and D, ``rows * (in +
out)`` floats, instead of ``in * out``. ``kvstore_ext.dad.attach(net)`` captures them
(kvstore_ext/dad.py); this scheme, per key:

1. **Which key is which layer.** The store hands the scheme a key's gradient arrays
   (``bind``); a key whose arrays are the weight gradients of an attached Dense is a
   dAD key. Every other key (conv, bias, BatchNorm, a Dense without ``attach``, a
   non-float32 one) takes the ``fallback`` scheme's codec, with the parameters given
   as ``'fallback.<name>'`` (e.g. ``{'fallback': 'hylo', 'fallback.conv_rate': 0.1}``).
   Biases take the fallback too: their exact gradient is D's column sums, but they are
   small (Hylo sends them float32, exactly).
   **Without any attached Dense** (``attach`` never called, or a Module, whose
   layers are symbols) the first step is refused, with the call to make: the run
   would otherwise be the fallback scheme under dAD's name. The store cannot attach
   the layers itself: it sees the Trainer's parameters, not the blocks, and a key's
   first pushpull comes after the forward pass whose rows that step would send, while
   the payload's layout is fixed at that first step.
2. **Layout.** At a dAD key's first step (its plan), its payload is fixed (the server
   key is laid out once): ``capacity`` rows (``dad``: the rows captured at that first
   step, unless ``capacity`` is set; rank-dAD: ``rank``). A layer whose payload is not
   at least 2x smaller than its weight, in every chunk (the weight is cut into row
   ranges above ``chunk_size``, each sending its columns of D and all of A), takes the
   fallback (e.g. MNIST's 10 x 512 output layer at batch 32). So does a weight of fewer
   than ``size_threshold`` elements (32768, as every scheme here, so that all schemes
   compress the same tensors): without it rank-dAD sent MNIST's 10 x 256 output layer
   as rank 4 (2.6x smaller; measured: docs/schemes/dad.md).
3. **The step** (codecs/outer.py): ``method='dad'`` (default) sends U = D, V = A; the
   servers add ``U^T V`` of every worker: the exact sum of the workers' gradients, as
   ``dist_sync`` (to float32 rounding; tests/test_dad.py holds it). ``'oneway'``:
   rank-dAD, each worker sends the rank-``rank`` factors of its ``D^T A`` from
   ``iterations`` power iterations with deflation, run on products with A and D
   (the product is formed only when rows * (in + out) >= in * out), and the servers
   add the products of every worker's factors, float32 pull. ``'rankdad'``: the same,
   and the servers factorise the sum again to rank ``rank`` and reply its factors
   (the authors' second power iteration on the gathered factors; the pull shrinks too).
4. **Error feedback** (``error_feedback``, rank-dAD only; dAD is exact): each worker
   keeps a residual R (out x in) of each dAD weight, factorises ``M = D^T A + R`` (on
   the implicit operator ``D^T (A v) + R v``) and keeps ``M - U^T V``, its own error;
   with ``'rankdad'`` the servers also keep the error of their re-factorisation
   (codecs/outer.py says why the residual is each compressor's own error). The
   residual is checkpointed with the store's state; a void step leaves it unchanged.
   It forms one out x in product a step on the worker (the new residual), what the
   authors' method avoids; the authors keep no residual (``error_feedback=0``).

Defaults: ``method='dad'`` (exact: the scheme's claim, at ``rows * (in + out)`` a
layer); rank-dAD ``rank=4`` (the authors' default is 2; 4 as PowerSGD's here, the top
of PyTorch's advised 1-4), ``iterations=1`` (the authors' default), ``tol=1e-3`` (the
authors'; it only acts with more than one iteration), ``error_feedback=1`` (not the
authors'): measured on the MNIST MLP and CNN at 4 workers, it raised rank-dAD's test
accuracy on the MLP on every seed (1.7 points oneway, 3.1 rankdad, 5 seeds) and lowered
the training loss on every seed of both models (docs/schemes/dad.md). Between the two
rank-dAD methods ``'oneway'`` is the one to pick first: it adds only one approximation
(each worker's), while ``'rankdad'`` approximates the sum once more.
"""

from .base import Scheme
from .. import chunking
from .. import dad as capture
from ..codecs.outer import METHODS, OuterCodec
from ..params import Param

PREFIX = 'fallback.'


class _SchemeNames:
    """The registered schemes other than dad, looked up when a value is checked (the
    registry fills after this module is imported)."""

    def _names(self):
        from ..registry import SCHEMES
        return sorted(name for name in SCHEMES if name != DAD.name)

    def __contains__(self, name):
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


class DAD(Scheme):
    """dAD / rank-dAD: Dense layers send inputs and output deltas, or their factors.

    Every other tensor goes through a fallback scheme (Hylo); see the module."""

    name = 'dad'
    PARAMS = {
        'method': Param('str', 'dad', "'dad' (A and D: the exact sum, about 7x fewer bytes "
                        "pushed at 32 rows), 'oneway' (rank-dAD factors, float32 pull: "
                        "about 35-40x, level with dist_sync with error feedback) or "
                        "'rankdad' (factors, and the servers re-factorise the sum: a "
                        "compressed pull, more loss)", choices=METHODS, rank='tune'),
        'rank': Param('int', 4, "rank-dAD: rank of each worker's factors; 8 narrowed the "
                      "MLP's loss without error feedback", low=1, rank='tune'),
        'capacity': Param('int', 0, "dad: rows a step may capture per layer (0: the rows of "
                          "the layer's first step); set it when batches vary in size",
                          low=0, rank='leave'),
        'error_feedback': Param('int', 1, 'rank-dAD: 1 keeps what the factors leave out '
                                '(a residual a layer on each worker; rankdad: on the '
                                'servers too) and sends it with the next step; 0: the '
                                "authors' rank-dAD, less accurate", low=0, high=1,
                                rank='leave'),
        'iterations': Param('int', 1, 'rank-dAD: power iterations per component (3 did no '
                            'better than 1)', low=1, rank='leave'),
        'tol': Param('float', 1e-3, 'rank-dAD: stop iterating when the vector moves less '
                     '(acts only with more than one iteration)', low=0, rank='leave'),
        'seed': Param('int', 0, 'rank-dAD: seed of the start vectors', low=0, rank='leave'),
        'size_threshold': Param('int', 32768, 'Dense weights with fewer elements take the '
                                'fallback', low=0, rank='leave'),
        'fallback': Param('str', 'hylo', 'scheme of every other tensor (conv, biases, '
                          "layers not attached); its parameters as 'fallback.<name>'",
                          choices=_SchemeNames(), rank='leave'),
        'check_gradient': Param('int', 1, '1: refuse a Dense gradient that is not the '
                                'product of its captured rows (clipping, several passes '
                                'with grad_req=write); 0 sends what the rows say',
                                low=0, high=1, rank='diagnostic'),
    }

    def __init__(self, **given):
        theirs = {k[len(PREFIX):]: v for k, v in given.items() if k.startswith(PREFIX)}
        super().__init__(**{k: v for k, v in given.items() if not k.startswith(PREFIX)})
        if 'chunk_size' in theirs:
            raise ValueError('give chunk_size, not %schunk_size: the fallback cuts tensors '
                             'as dad does' % PREFIX)
        from ..registry import SCHEMES
        self.fallback = SCHEMES[self.params['fallback']](
            chunk_size=self.params['chunk_size'], **theirs)
        # every parameter of the fallback, as set (what a summary or a checkpoint shows)
        self.params.update({PREFIX + k: v for k, v in self.fallback.params.items()
                            if k != 'chunk_size'})
        self.given = frozenset(given)      # the fallback's too (handover.py)
        self._bound = {}        # key -> capture.Layer
        self._plans = {}        # key -> OuterCodec, or None: planned through the fallback

    @property
    def num_workers(self):
        return self.fallback.num_workers

    def param_specs(self):
        """dad's declarations and the fallback's, under their ``fallback.`` names."""
        specs = super().param_specs()
        specs.update({PREFIX + k: p for k, p in self.fallback.param_specs().items()
                      if k != 'chunk_size'})
        return specs

    @num_workers.setter
    def num_workers(self, workers):
        """The store tells the scheme its workers before it plans: the fallback's
        worker-count rules (Hylo's agreement and momentum correction, 'auto') need it."""
        self.fallback.num_workers = workers

    @property
    def learning_rate(self):
        return self.fallback.learning_rate

    @learning_rate.setter
    def learning_rate(self, read):
        """The store hands over the optimizer's learning rate (handover.py):
        the fallback's rules that follow it (Hylo's masking, 'lr') need it."""
        self.fallback.learning_rate = read

    # -- which key is which layer ------------------------------------------------------
    def attach(self, net):
        """``kv.attach(net)``: capture the network's Dense layers (kvstore_ext/dad.py)."""
        capture.attach(net)

    def bind(self, key, arrays):
        handles = {a.handle.value for a in arrays}
        for layer in capture.layers():
            if layer.grad_handles() & handles:
                self._bound[key] = layer
                return
        self._bound.pop(key, None)

    def layer_of(self, key):
        return self._bound.get(key)

    # -- the codec of a key --------------------------------------------------------------
    def codec_for(self, shape, dtype, step=0):
        return self.fallback.codec_for(shape, dtype, step=step)

    def codec_for_key(self, key, shape, dtype, step=0):
        if not self._plans and not capture.layers():
            raise RuntimeError(
                'dist_sync_dad: key %r: no Dense layer is attached to dAD\'s capture, so '
                'every tensor would go through the fallback %r and the run would be plain '
                'dist_sync_%s under another name. Call kvstore_ext.dad.attach(net) once the '
                'network is built, before its first forward pass (or use kvstore '
                'dist_sync_%s)' % (key, self.params['fallback'], self.params['fallback'],
                                   self.params['fallback']))
        if key in self._plans:
            codec = self._plans[key]
            if codec is not None and codec.layer is self._bound.get(key):
                return codec
        codec = self.dad_codec(self._bound.get(key), shape, dtype)
        if codec is not None:
            self._plans[key] = codec
            return codec
        return self.fallback.codec_for_key(key, shape, dtype, step=step)

    def dad_codec(self, layer, shape, dtype):
        """The key's OuterCodec, or None if it takes the fallback."""
        p = self.params
        if layer is None or len(shape) != 2 or shape[0] != layer.units or \
                self.exempt(shape, dtype):
            return None
        capacity = p['capacity']
        if p['method'] == 'dad' and not capacity:
            layer.wait()
            capacity = layer.pending_rows()
            if not capacity:
                return None            # no capture at its first step: the fallback's
        codec = OuterCodec(shape, layer, p['method'], capacity, p['rank'], p['iterations'],
                           p['tol'], p['seed'], bool(p['check_gradient']),
                           error_feedback=bool(p['error_feedback']))
        if not all(c.codec.compressible() for c in chunking.split(codec, p['chunk_size'])):
            return None
        return codec

    # -- the fallback's hooks, for its keys ------------------------------------------------
    def replans_at(self, step):
        return self.fallback.replans_at(step)

    def observes(self, key, step, rank):
        return self._plans.get(key) is None and self.fallback.observes(key, step, rank)

    def observe(self, key, acc, step):
        self.fallback.observe(key, acc, step)

    def settle(self, step, rank, share):
        self.fallback.settle(step, rank, share)

    def step_started(self, step):
        self.fallback.step_started(step)

    def state(self):
        return self.fallback.state()

    def restore(self, state):
        self.fallback.restore(state)
