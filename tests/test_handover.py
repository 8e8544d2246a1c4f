"""What a plain MXNet script gets without kvstore_ext-specific calls (one process):

* the optimizer's momentum and learning rate reach the scheme from a Gluon Trainer and
  from a Module that call the store, before any codec is made (kvstore_ext/handover.py);
  ``kv.follow`` wins over what is found, a momentum the user set wins over both;
* a scheme that uses the momentum and finds no optimizer warns once, naming the call;
* ``fit.py --gc-type``'s dict (``{'type': ..., 'threshold': args.gc_threshold}``) is
  accepted by every scheme: 2-bit uses the threshold, the others ignore it with one
  warning (kvstore_ext/mxnet_keys.py);
* ``dist_sync_dad`` without ``kvstore_ext.dad.attach(net)`` refuses its first step,
  naming the call, rather than run as its fallback.
"""
import gc
import logging

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon

import kvstore_ext
from kvstore_ext.codecs import AdditiveTopKCodec, MomentumCorrected

CONV = (64, 32, 5, 5)       # 51,200 weights: Hylo's conv top-k
# momentum_correction='on': 'auto' corrects from 8 workers, this store has one
HYLO = {'momentum_correction': 'on'}


def small_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(CONV[0], CONV[2], in_channels=CONV[1]), gluon.nn.Flatten(),
            gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    return net


def trainer_steps(kv, optimizer_params, steps=1, net=None):
    """``steps`` Gluon steps through ``kv`` with nothing but ``kvstore=kv``."""
    net = net or small_net()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', optimizer_params, kvstore=kv)
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, 32, 8, 8)))
    for _ in range(steps):
        with autograd.record():
            loss = net(x).square().mean()
        loss.backward()
        trainer.step(2)
    return trainer


def conv_codec(kv):
    key = next(k for k in kv.codec_plan() if kv.plan(k).layer == 'conv')
    return kv.plan(key).chunks[0].codec


def test_a_trainer_hands_over_without_a_call(caplog):
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(HYLO)
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        trainer = trainer_steps(kv, {'learning_rate': 0.05, 'momentum': 0.9})
    assert kv.scheme.params['momentum'] == 0.9
    codec = conv_codec(kv)                                      # planned with it
    assert isinstance(codec, MomentumCorrected) and type(codec.inner) is AdditiveTopKCodec
    assert kv.scheme.learning_rate() == 0.05
    trainer.set_learning_rate(0.01)                                  # a schedule moves it
    assert kv.scheme.learning_rate() == 0.01
    assert not caplog.records


def test_a_module_hands_over_without_a_call():
    net = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=1024, name='fc1')
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(net, num_hidden=10, name='fc2'),
                               name='softmax')
    rng = np.random.default_rng(0)
    train = mx.io.NDArrayIter(rng.standard_normal((32, 64)).astype(np.float32),
                              rng.integers(0, 10, 32).astype(np.float32), batch_size=16,
                              label_name='softmax_label')
    kv = mx.kv.create('dist_sync_hylo')
    mod = mx.mod.Module(net, context=mx.cpu())
    mod.fit(train, kvstore=kv, optimizer='sgd', num_epoch=1,
            optimizer_params={'learning_rate': 0.2, 'momentum': 0.8,
                              'lr_scheduler': mx.lr_scheduler.FactorScheduler(1, 0.5)})
    assert kv.scheme.params['momentum'] == 0.8
    assert kv.scheme.learning_rate() == mod._optimizer.learning_rate < 0.2


def test_nothing_found_warns_once_with_the_call(caplog):
    kv = mx.kv.create('dist_sync_hylo')
    rng = np.random.default_rng(1)
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        for step in range(2):
            for key, shape in (('conv', CONV), ('fc', (512, 100))):
                kv.pushpull(key, mx.nd.array(rng.standard_normal(shape)))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and 'kv.follow(trainer)' in said[0] and 'momentum' in said[0]
    assert kv.scheme.params['momentum'] == 0.0
    # a scheme without momentum has nothing to ask for
    caplog.clear()
    kv = mx.kv.create('dist_sync_thc')
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        kv.pushpull('fc', mx.nd.array(rng.standard_normal((512, 100))))
    assert not caplog.records


def test_the_call_and_the_users_setting_win(caplog):
    # kv.follow wins over the Trainer found on the stack
    kv = mx.kv.create('dist_sync_hylo')
    kv.set_gradient_compression(HYLO)
    kv.follow(mx.optimizer.SGD(learning_rate=0.3, momentum=0.5))
    trainer_steps(kv, {'learning_rate': 0.05, 'momentum': 0.9})
    assert kv.scheme.params['momentum'] == 0.5 and kv.scheme.learning_rate() == 0.3
    # a momentum set by the user wins over the optimizer's, with one warning
    kv = mx.kv.create('dist_sync_topk')
    kv.set_gradient_compression({'momentum': 0.7})
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        trainer_steps(kv, {'learning_rate': 0.05, 'momentum': 0.9}, steps=2)
    assert kv.scheme.params['momentum'] == 0.7
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and 'momentum=0.7' in said[0] and '0.9' in said[0]


def test_follow_refuses_what_is_no_optimizer():
    kv = mx.kv.create('dist_sync_hylo')
    with pytest.raises(TypeError, match='follow takes a Gluon Trainer, a Module'):
        kv.follow(object())
    with pytest.raises(ValueError, match="optimizer's momentum 0.9999"):
        mx.kv.create('dist_sync_hylo').follow(mx.optimizer.SGD(momentum=0.9999))


@pytest.mark.parametrize('scheme', sorted(kvstore_ext.SCHEMES))
def test_fit_py_gc_type_dict(scheme, caplog):
    """Exactly what MXNet's example/image-classification/common/fit.py passes."""
    kv = mx.kv.create('dist_sync_' + scheme)
    default = dict(kv.scheme.params)
    with caplog.at_level(logging.WARNING, logger='kvstore_ext'):
        kv.set_gradient_compression({'type': scheme, 'threshold': 0.25})
    said = [r.getMessage() for r in caplog.records]
    if scheme == '2bit':        # MXNet's 2-bit rule: its threshold
        assert kv.scheme.params == dict(default, threshold=0.25) and not said
    else:
        assert kv.scheme.params == default
        assert len(said) == 1 and 'ignoring compression parameter threshold=0.25' in said[0]


def test_dad_without_attach_refuses_its_first_step():
    gc.collect()            # attached layers of other tests are gone
    assert not kvstore_ext.dad.layers()
    kv = mx.kv.create('dist_sync_dad')
    net = small_net()
    with pytest.raises(RuntimeError, match=r'kvstore_ext\.dad\.attach\(net\)'):
        trainer_steps(kv, {'learning_rate': 0.05}, net=net)
    # attached, the same network sends its Dense layer as dAD (10 x 1024 is below the
    # default size_threshold)
    kv = mx.kv.create('dist_sync_dad')
    kv.set_gradient_compression({'size_threshold': 0})
    net = small_net()
    kvstore_ext.dad.attach(net)
    trainer_steps(kv, {'learning_rate': 0.05}, net=net)
    assert sum(d.startswith('dad') for d in kv.codec_plan().values()) == 1


def test_two_workers_hand_over_alike(tmp_path, job_env):
    """A real 2-worker job (ps-lite, our launcher): every worker's scheme gets the
    Trainer's momentum and rate before its codecs are made, and the workers' parameters
    agree."""
    import json
    import os
    from test_dist_aggregate import launch
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'dist_jobs',
                       'handover_job.py')
    launch(tmp_path, job_env, 2, 1, [job, '--out', str(tmp_path)], timeout=240)
    ranks = [json.load(open(str(tmp_path / ('rank%d.json' % r)))) for r in range(2)]
    assert ranks[0]['params'] == ranks[1]['params']
    for got in ranks:
        assert got['params']['momentum'] == 0.9 and got['rate'] == 0.05
        assert got['conv_codec'] == 'MomentumCorrected(AdditiveTopKCodec)'
