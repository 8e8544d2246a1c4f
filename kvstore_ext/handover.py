"""Handing the optimizer over to the scheme: its momentum and its learning rate.

Why: Gluon's ``Trainer`` and MXNet's ``Module`` ask ``is_capable('optimizer')``, get
False, and run the optimizer on the workers (``update_on_kvstore=False``), so MXNet
never calls ``kv.set_optimizer`` and the store never sees the optimizer. Some schemes
need two things from it: the momentum (DGC's momentum correction in Hylo, topk,
adacomp and dAD's Hylo fallback: the ``momentum`` parameter) and the current learning
rate (Hylo's ``momentum_masking='lr'``). A user's script that only passes
``kvstore=kv`` gave them neither, and an 8-worker run lost accuracy without a word.

Two routes, the explicit one winning:

1. ``kv.follow(source)`` (the documented call; ``follow_learning_rate`` is its old
   name): ``source`` is a Gluon ``Trainer``, a ``Module``, an MXNet ``Optimizer``, or
   a function returning the learning rate (then the rate only).
2. Without the call, the store looks for the optimizer once, at its first ``pushpull``
   (or ``push``), before any codec exists: it walks up the Python call stack
   (``sys._getframe``, at most ``MAX_FRAMES`` frames) for the ``Trainer`` whose
   ``step``/``allreduce_grads`` called it (its ``_optimizer``), a ``Module`` (its
   ``_optimizer``) or the ``updater`` of MXNet's ``model._update_params`` (its
   ``optimizer``). Limits: a loop that calls ``kv.pushpull`` itself and runs its own
   updates has none of these on the stack, and is told so (below); the optimizer is
   looked for once (a later replacement of the Trainer's optimizer is not seen, its
   rate changes are); it relies on CPython frames, which MXNet's Python runs on.

What is handed over:

* the learning rate: a reader of ``optimizer.learning_rate`` (which follows an
  ``lr_scheduler`` and ``set_learning_rate``), unless a rate reader was given;
* the momentum: for ``SGD`` (and its subclasses) and ``NAG``, ``optimizer.momentum``
  goes to every scheme parameter named ``momentum`` or ``<part>.momentum`` that the
  user did not set. Both keep the heavy-ball velocity ``v = m v + g`` that DGC's
  correction rebuilds from ``S - m S_prev``, so the optimizer's own momentum then
  reproduces the sum of the workers' velocities (NAG's extra ``m v`` term is taken
  from the same velocity). Other optimizers (Adam's ``beta1`` is a moving average,
  Signum, LARS and LBSGD rescale their steps) hand over no momentum: the scheme's
  ``momentum`` stays as set (0: no correction). A momentum the user set wins; if it
  differs from the optimizer's, one warning says so.

The handed-over momentum becomes part of the scheme's parameters (the scheme is
rebuilt with them) before the first key is planned, so every key's codec, a
checkpoint's parameters and any check of the workers' parameters see it; every
worker runs the same script and finds the same optimizer, so the workers agree.

A scheme with a momentum parameter the user did not set, when no optimizer is found,
says so once at the first step, naming ``kv.follow(trainer)``.
"""
import logging
import sys

log = logging.getLogger('kvstore_ext')

MAX_FRAMES = 16         # frames above the store's first pushpull that are looked at


def momentum_names(scheme):
    """The scheme's parameters that take the optimizer's momentum."""
    return [name for name in scheme.params
            if name == 'momentum' or name.endswith('.momentum')]


def optimizer_of(source):
    """The MXNet Optimizer of a Trainer, a Module (None before ``init_optimizer``),
    an Updater or an Optimizer; raises TypeError for anything else."""
    from mxnet import optimizer as opt
    from mxnet.gluon import Trainer
    from mxnet.module import BaseModule
    if isinstance(source, opt.Optimizer):
        return source
    if isinstance(source, Trainer):
        found = source._optimizer
        return found if isinstance(found, opt.Optimizer) else None
    if isinstance(source, BaseModule):
        found = getattr(source, '_optimizer', None)
        return found if isinstance(found, opt.Optimizer) else None
    if isinstance(source, opt.Updater):
        return source.optimizer
    raise TypeError('not a Trainer, Module, Updater or Optimizer: %r' % (source,))


def heavy_ball_momentum(optimizer):
    """The optimizer's momentum if it is SGD's or NAG's heavy-ball momentum, else None
    (see the module docstring)."""
    from mxnet import optimizer as opt
    if isinstance(optimizer, (opt.SGD, opt.NAG)):
        return float(optimizer.momentum or 0.0)
    return None


def find_on_stack(start=2):
    """The optimizer of the Trainer, Module or Module updater that called the store,
    looked for in the callers' frames; None if there is none."""
    from mxnet import optimizer as opt
    from mxnet.gluon import Trainer
    from mxnet.module import BaseModule
    try:
        frame = sys._getframe(start)
    except (AttributeError, ValueError):
        return None
    for _ in range(MAX_FRAMES):
        if frame is None:
            return None
        local = frame.f_locals
        owner = local.get('self')
        if isinstance(owner, (Trainer, BaseModule)):
            found = optimizer_of(owner)
            if found is not None:
                return found
        updater = local.get('updater')
        if isinstance(updater, opt.Updater):
            return updater.optimizer
        frame = frame.f_back
    return None


class Handover:
    """One store's hand-over: what ``follow`` was given and whether the first round
    has taken place."""

    def __init__(self):
        self.source = None      # what kv.follow was given (Trainer, Module, Optimizer)
        self.rate = None        # the learning-rate reader, from the source or a function
        self.done = False       # the first round has looked for the optimizer
        self.warned = False     # a conflict with the user's momentum was said

    def follow(self, store, source, name='follow'):
        """``kv.follow(source)``: see the module docstring. Before the first pushpull."""
        from mxnet.module import BaseModule
        if any(state.codec is not None for state in store._keys.values()):
            raise RuntimeError('%s must be called before the first pushpull: the codecs '
                               'already exist' % name)
        try:
            optimizer = optimizer_of(source)
        except TypeError:
            if callable(source):
                optimizer, read = None, source
            elif hasattr(source, 'learning_rate'):     # anything that reads like one
                optimizer = None

                def read():
                    return source.learning_rate
            else:
                raise TypeError('%s takes a Gluon Trainer, a Module, an MXNet Optimizer '
                                'or a function returning the learning rate, got %r'
                                % (name, source))
        else:
            if isinstance(source, BaseModule):
                # init_optimizer may come after follow: read the optimizer it has then
                def read():
                    return optimizer_of(source).learning_rate
            else:
                holder = source if hasattr(source, 'learning_rate') else optimizer

                def read():
                    return holder.learning_rate
        if optimizer is not None or not isinstance(source, BaseModule):
            _check_rate(read, source, name)
        self.source = source if optimizer is not None or isinstance(source, BaseModule) \
            else None
        self.rate = read
        store._learning_rate = read
        store._scheme.learning_rate = read
        if optimizer is not None:
            apply(store, optimizer, self)

    def first_round(self, store):
        """At the store's first pushpull/push, before any key is planned: hand over
        what ``follow`` gave (a Module's optimizer exists by now) or what the stack
        shows; warn once if the scheme needs the optimizer and none is found."""
        self.done = True
        optimizer = optimizer_of(self.source) if self.source is not None else None
        if optimizer is None:
            optimizer = find_on_stack(start=3)
            if optimizer is not None and self.rate is None:
                def read():
                    return optimizer.learning_rate
                store._learning_rate = read
                store._scheme.learning_rate = read
        if optimizer is not None:
            apply(store, optimizer, self)
            return
        missing = [n for n in momentum_names(store._scheme) if n not in store._scheme.given]
        if missing:
            log.warning('%s: the scheme uses the optimizer\'s momentum%s (parameter %s) but '
                        'no optimizer was handed over and none was found on the call '
                        'stack (a Gluon Trainer or Module finds it by itself): call '
                        'kv.follow(trainer) (or kv.follow(module), kv.follow(optimizer)) '
                        'before the first step, or set %s in the compression parameters; '
                        'momentum correction stays off',
                        store.type, '' if self.rate else ' and learning rate',
                        ', '.join(missing), missing[0])


def _check_rate(read, source, name):
    try:
        lr = float(read())
    except (TypeError, ValueError, AttributeError) as e:
        raise TypeError('%s: the learning rate of %r is not a number (%s)' % (name, source, e))
    if not 0 <= lr < float('inf'):
        raise ValueError('%s: the learning rate of %r is %r, not a finite number >= 0'
                         % (name, source, lr))


def apply(store, optimizer, handover):
    """Give the store's scheme ``optimizer``'s momentum (module docstring): rebuild the
    scheme with it where the user did not set it; keep the user's settings, the rate
    reader and the scheme's state. A conflict with the user's setting is said once
    (``handover.warned``)."""
    momentum = heavy_ball_momentum(optimizer)
    scheme = store._scheme
    names = momentum_names(scheme)
    if momentum is None:
        if names:
            log.info('%s: optimizer %s has no heavy-ball momentum to hand over; the '
                     "scheme's %s stays as set", store.type, type(optimizer).__name__,
                     ', '.join(names))
        return
    handed = {}
    for name in names:
        if name in scheme.given:
            if scheme.params[name] != momentum and not handover.warned:
                handover.warned = True
                log.warning('%s: %s=%g was set explicitly and is kept, but the optimizer\'s '
                            'momentum is %g', store.type, name, scheme.params[name], momentum)
        elif scheme.params[name] != momentum:
            handed[name] = momentum
    if not handed:
        return
    given = {name: scheme.params[name] for name in scheme.given}
    try:
        rebuilt = type(scheme)(**dict(given, **handed))
    except (ValueError, TypeError) as e:
        raise ValueError("%s: the optimizer's momentum %g cannot be the scheme's %s (%s); "
                         'set it in the compression parameters'
                         % (store.type, momentum, ', '.join(handed), e))
    rebuilt.given = scheme.given
    rebuilt.learning_rate = scheme.learning_rate
    rebuilt.restore(scheme.state())
    store._scheme = rebuilt
    log.info('%s: handed over the optimizer\'s momentum %g (%s)', store.type, momentum,
             ', '.join(sorted(handed)))
