"""kvstore_ext.blas: NumPy's OpenBLAS runs on one thread inside ``one_thread()``, the
count it had comes back after (nested blocks and other threads included), and the
store's host linear algebra (dAD's gradient check, rank-dAD's factors) runs inside it.
"""
import threading

import numpy as np
import pytest

from kvstore_ext import blas, lowrank
from kvstore_ext.codecs.outer import OuterCodec


def numpy_threads():
    (get, _), = blas.controls()        # exactly NumPy's own OpenBLAS, found
    return get()


@pytest.fixture(autouse=True)
def two_threads():
    """NumPy's BLAS on 2 threads (as on the 2-core machines), whatever it had."""
    (get, set_), = blas.controls()
    had = get()
    set_(2)
    yield
    set_(had)


def test_one_thread_inside_and_restored_after():
    with blas.one_thread():
        assert numpy_threads() == 1
        with blas.one_thread():
            assert numpy_threads() == 1
        assert numpy_threads() == 1             # the inner block left it held
    assert numpy_threads() == 2


def test_held_while_any_thread_is_inside():
    entered, release = threading.Event(), threading.Event()

    def other():
        with blas.one_thread():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(10)
    with blas.one_thread():
        pass                                  # this block ends first
    assert numpy_threads() == 1               # the other thread is still inside
    release.set()
    thread.join(10)
    assert numpy_threads() == 2


def test_the_store_s_host_products_run_on_one_thread(monkeypatch):
    seen = []

    def spy(function):
        def wrapped(*args, **kwargs):
            seen.append(numpy_threads())
            return function(*args, **kwargs)
        return wrapped

    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 9)).astype(np.float32)
    d = rng.standard_normal((6, 5)).astype(np.float32)
    monkeypatch.setattr(lowrank, 'power_factors', spy(lowrank.power_factors))
    lowrank.factors_of_product(a, d, 2, 1)
    codec = OuterCodec((5, 9), layer=None)
    monkeypatch.setattr(codec, 'probe', spy(codec.probe))
    codec.check_gradient(d.T @ a, a, d)
    assert seen == [1, 1] and numpy_threads() == 2
