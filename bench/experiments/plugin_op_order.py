"""Do the plugin's operators wait for one another when their arrays do not?

Why: MXNet registers an operator of an external library (lib_api) as asking for the
CPU's parallel-random and temp-space resources (src/c_api/c_api.cc), and an operator
writes every resource it asks for in the engine. With one parallel-random copy (MXNet's
default ``MXNET_CPU_PARALLEL_RAND_COPY=1``) every plugin operator would then wait for
the one queued before it, whatever their arrays: a compressed key's encoder behind the
previous key's decode, which waits for that key's pull (docs/DESIGN.md, "What a step
may wait for in the engine").

How: A is queued on an array that a product of about 50 ms is still writing, B right
after it on an array that is ready. Per pair of operators, the milliseconds until B's
output is readable and until A's: B waiting for A means B's time equals A's. Plugin
operators (``kvx_finite_check``) against MXNet's own (a one-element copy). Run it again
with ``MXNET_CPU_PARALLEL_RAND_COPY=16 MXNET_CPU_TEMP_COPY=16`` to see the resources'
part (the first pair then pays their creation).

    python bench/experiments/plugin_op_order.py
"""
import time

import mxnet as mx

import kvstore_ext  # noqa: F401  (loads the plugin)
from kvstore_ext.ops import op

REPEATS = 3


def main():
    a = mx.nd.ones((700, 700))
    ready = mx.nd.ones((10,))
    a.wait_to_read()

    def slow():
        x = a
        for _ in range(4):
            x = mx.nd.dot(x, a) * 1e-3
        return x

    pairs = {'plugin': lambda x: (op('kvx_finite_check')(x.reshape((-1,))),
                                  op('kvx_finite_check')(ready)),
             'built-in': lambda x: (x.reshape((-1,))[0:1].copy(), ready[0:1].copy())}
    for name, queue in pairs.items():
        for _ in range(REPEATS):
            start = time.perf_counter()
            first, second = queue(slow())
            second.wait_to_read()
            b_ms = 1e3 * (time.perf_counter() - start)
            first.wait_to_read()
            a_ms = 1e3 * (time.perf_counter() - start)
            print('%-8s B (ready array) after %5.1f ms, A (behind the product) after %5.1f ms'
                  % (name, b_ms, a_ms))


if __name__ == '__main__':
    main()
