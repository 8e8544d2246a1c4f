"""Single-core throughput of kvstore_ext's codec kernels, against a memory copy.

For every codec kernel (fp32 pass-through, Hylo's conv filter selection, Hylo's FC
ternary, the homomorphic variants, MXNet's 2-bit layout) and every size, it times

* ``kernel``: the C++ kernel through its C API (cpp/capi.h, ctypes), one thread;
* ``copy``:   ``memmove`` of the same float32 array (n floats read, n written), timed
  *interleaved* with every other measurement (copy, kernel, kernel, copy, ...), so that
  each ratio to copy comes from pairs taken at the same moment of a shared machine;
* ``op``:     our MXNet operator (``kvstore_ext.ops.op('kvx_...')`` on NDArrays, outputs
  allocated by MXNet, ``wait_to_read``): the kernel plus MXNet's dispatch;
* ``numpy``:  the NumPy reference (python/kvx_ref), up to ``--ref-max-size`` elements;
* ``mxnet``:  MXNet's built-in 2-bit compression, as its kvstore runs it: MXNet 1.9 has
  no quantize operator for Python, so its ``kvstore::GradientCompression`` object is
  made and its ``Quantize`` / ``Dequantize`` methods are called directly on NDArrays
  (exported C++ symbols of libmxnet.so; an NDArray handle is an ``NDArray*``). That is
  exactly what ``CommDevice::ReduceCompressed`` calls on every push (engine push, the
  ``quantize_2bit`` kernel, wait). Checked bit-exact against our ``twobit_encode``.
  As a cross-check, a ``device`` kvstore on one CPU context is timed doing push+pull
  with and without ``set_gradient_compression({'type': '2bit'})``: the difference is
  MXNet's quantize + dequantize + one reduce copy of the compressed path.

Throughput is "GB/s of gradient": 4 bytes x elements of the float32 gradient (the
decoded tensor for decoders) / time. A copy moves 8 bytes per element (4 read, 4
written); so copy's "GB/s of gradient" is half the bytes it moves. Each case also
states how many bytes per element its implementation's passes read and write
(``traffic``, a model) and the resulting "bytes moved" rate.

Time is the CPU time of this process (all threads): on a shared machine, time during
which other jobs hold the core is not counted (``--clock wall`` to change). Repetitions
are short blocks of interleaved copy / path samples; ``kernel/copy`` is the median over
blocks of (best copy time / best path time) in the block. ``kernel/numpy`` and
``kernel/mxnet`` divide two such copy-normalised throughputs, so a change of machine
load between the two measurements cancels out.

Also measured: the FC encoder run chunk by chunk (``--chunk``, 64K elements: the
second pass then reads from L2), MXNet's quantize against ours as the fraction of
elements over the threshold varies (``--sweep-sizes``; MXNet's kernel branches), and
with ``--profile`` each pass of the encoders separately, through a small C++ driver
compiled around the kernel sources in cpp/ (source checkout only), in cache and in memory.
Method and findings: docs/KERNELS.md.

    python bench/kernels.py [--max-size 1e8] [--json PATH] [--plot PATH] [--profile]
"""
import argparse
import ctypes
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
f32 = np.float32

FC_SCALE = 2.0        # Hylo's default fc_scale: t = 2 * mean|acc|
WORKERS = 4           # homomorphic ternary: base 9, 7 digits a word
TOPK_CASES = [(576, 0.05), (4608, 0.02), (4608, 0.05), (4608, 0.10)]   # encode
TOPK_DECODE_CASES = [(576, 0.05), (4608, 0.05)]
HOM_FILTER = (4608, 0.05)


# ---- command line -----------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--sizes', default='1e4,1e5,1e6,1e7,1e8',
                   help='comma-separated element counts (default %(default)s)')
    p.add_argument('--max-size', type=float, default=1e8,
                   help='drop sizes above this (10^8 takes a few minutes)')
    p.add_argument('--ref-max-size', type=float, default=1e6,
                   help='largest size for the NumPy reference (it is slow)')
    p.add_argument('--mxnet-max-size', type=float, default=1e8,
                   help="largest size for MXNet's built-in 2-bit and the kvstore check")
    p.add_argument('--budget', type=float, default=0.3,
                   help='seconds of timing per case and path (more repetitions = less noise)')
    p.add_argument('--sample', type=float, default=1e-3,
                   help='target seconds of one timed sample (small sizes loop inside it)')
    p.add_argument('--block', type=float, default=0.03,
                   help='target seconds of one block of alternations (one ratio)')
    p.add_argument('--alternations', type=int, default=5,
                   help='most copy/kernel alternations in a block (at least 2)')
    p.add_argument('--min-reps', type=int, default=5, help='fewest blocks (3 for slow ones)')
    p.add_argument('--max-reps', type=int, default=30, help='most blocks')
    p.add_argument('--mxnet-threads', type=int, default=1,
                   help="OMP threads of MXNet's own kernels (default 1: a one-core comparison)")
    p.add_argument('--only', default='',
                   help='comma-separated substrings: run only the cases whose name matches')
    p.add_argument('--no-op', action='store_true', help='skip the MXNet operator path')
    p.add_argument('--no-kvstore', action='store_true', help='skip the kvstore cross-check')
    p.add_argument('--chunk', type=int, default=65536,
                   help='also time the FC encoder run chunk by chunk, chunks of this many '
                        'elements (0: skip)')
    p.add_argument('--sweep-sizes', default='1e6,1e7',
                   help="sizes of the threshold sweep (MXNet's branchy quantize; '' to skip)")
    p.add_argument('--sweep-fractions', default='0.001,0.01,0.05,0.11,0.25,0.5',
                   help='fractions of elements over the threshold in the sweep')
    p.add_argument('--profile', action='store_true',
                   help='time each pass of the encoders separately (needs g++, cpp/ sources)')
    p.add_argument('--profile-sizes', default='1e5,1e7')
    p.add_argument('--json', help='write raw numbers here')
    p.add_argument('--plot', help='write a PNG here')
    p.add_argument('--clock', choices=sorted(CLOCK), default='cpu',
                   help='cpu: CPU time of the process (immune to preemption by other jobs; '
                        'default); wall: elapsed time')
    p.add_argument('--seed', type=int, default=0)
    return p.parse_args(argv)


# ---- environment --------------------------------------------------------------------------

def import_everything(args):
    """Import mxnet (with its thread count set first), kvstore_ext and the NumPy reference."""
    os.environ['OMP_NUM_THREADS'] = str(args.mxnet_threads)
    os.environ['MXNET_OMP_MAX_THREADS'] = str(args.mxnet_threads)
    import mxnet as mx
    try:
        import kvstore_ext
    except ImportError:
        sys.path.insert(0, REPO)
        import kvstore_ext
    from kvstore_ext import _lib, ops
    ref = None
    try:
        from kvx_ref import codecs as ref
    except ImportError:
        if os.path.isdir(os.path.join(REPO, 'python', 'kvx_ref')):
            sys.path.insert(0, os.path.join(REPO, 'python'))
            from kvx_ref import codecs as ref
    return mx, kvstore_ext, _lib, ops, ref


def load_capi(path):
    lib = ctypes.CDLL(path)
    P, I64, D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    sigs = {
        'kvx_fp32_encode': [P, I64, P],
        'kvx_fp32_decode': [P, I64, I64, P],
        'kvx_fp32_decode_add': [P, I64, I64, P],
        'kvx_filter_scores': [P, I64, I64, P],
        'kvx_topk_encode': [P, P, I64, I64, I64, P],
        'kvx_topk_decode': [P, I64, I64, P],
        'kvx_topk_decode_add': [P, I64, I64, P],
        'kvx_topk_gather': [P, P, I64, I64, P, I64, P],
        'kvx_topk_scatter': [P, P, I64, I64, I64, P],
        'kvx_ternary_encode': [P, P, I64, D, D, P],
        'kvx_ternary_decode': [P, I64, I64, P],
        'kvx_ternary_decode_add': [P, I64, I64, P],
        'kvx_ternary_encode_sum': [P, P, I64, D, I64, P],
        'kvx_ternary_decode_sum': [P, I64, D, I64, I64, P],
        'kvx_twobit_encode': [P, P, I64, D, P],
        'kvx_twobit_decode': [P, I64, D, P],
        'kvx_abi_version': [],
        'kvx_ternary_sum_words': [I64, I64],
    }
    for name, argtypes in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int64 if name == 'kvx_ternary_sum_words' else ctypes.c_int
    return lib


class MXNetTwoBit:
    """MXNet's own 2-bit compression object (src/kvstore/gradient_compression.cc).

    Layout (from its constructor): vtable pointer, int type_, float threshold_.
    ``Quantize(const NDArray& from, NDArray* to, NDArray* residual, int priority)``
    pushes MXNet's ``quantize_2bit`` kernel to the engine; ``Dequantize(from, to, prio)``
    its inverse. The caller waits on the outputs.
    """
    CTOR = '_ZN5mxnet7kvstore19GradientCompressionC1Ev'
    SET = '_ZN5mxnet7kvstore19GradientCompression20SetTwoBitCompressionEf'
    QUANTIZE = '_ZN5mxnet7kvstore19GradientCompression8QuantizeERKNS_7NDArrayEPS2_S5_i'
    DEQUANTIZE = '_ZN5mxnet7kvstore19GradientCompression10DequantizeERKNS_7NDArrayEPS2_i'

    def __init__(self, mx, threshold):
        from mxnet.base import _LIB
        lib = ctypes.CDLL(_LIB._name)
        self._obj = ctypes.create_string_buffer(64)   # the object is 16 bytes
        self._this = ctypes.addressof(self._obj)
        ctor = getattr(lib, self.CTOR)
        ctor.argtypes, ctor.restype = [ctypes.c_void_p], None
        ctor(self._this)
        setter = getattr(lib, self.SET)
        setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_float], None
        setter(self._this, threshold)
        self._q = getattr(lib, self.QUANTIZE)
        self._q.argtypes, self._q.restype = [ctypes.c_void_p] * 4 + [ctypes.c_int], None
        self._d = getattr(lib, self.DEQUANTIZE)
        self._d.argtypes, self._d.restype = [ctypes.c_void_p] * 3 + [ctypes.c_int], None

    def quantize(self, grad, words, residual):
        self._q(self._this, grad.handle.value, words.handle.value, residual.handle.value, 0)

    def dequantize(self, words, out):
        self._d(self._this, words.handle.value, out.handle.value, 0)


def ptr(a):
    return a.ctypes.data


def machine_info(args, lib_path):
    info = {'python': sys.version.split()[0], 'platform': platform.platform(),
            'cpus': os.cpu_count(), 'mxnet_threads': args.mxnet_threads}
    try:
        with open('/proc/cpuinfo') as f:
            text = f.read()
        model = [l.split(':', 1)[1].strip() for l in text.splitlines() if l.startswith('model name')]
        flags = [l.split(':', 1)[1].split() for l in text.splitlines() if l.startswith('flags')]
        info['cpu'] = model[0] if model else '?'
        info['simd'] = sorted(f for f in (flags[0] if flags else [])
                              if f in ('avx2', 'avx512f', 'avx512bw', 'avx512vl', 'fma'))
    except OSError:
        pass
    try:
        info['loadavg'] = list(os.getloadavg())
    except OSError:
        pass
    info['library'] = lib_path
    return info


# ---- timing -----------------------------------------------------------------------------

CLOCK = {'cpu': time.process_time, 'wall': time.perf_counter}
clock = time.process_time


def per_call(fn, inner):
    """Seconds per call of ``fn`` over ``inner`` calls, on the chosen clock.

    The default clock is the CPU time of this process, all threads summed
    (CLOCK_PROCESS_CPUTIME_ID): the kernels run on the calling thread, MXNet's paths on
    its engine thread while the caller sleeps in wait_to_read, and time during which
    other jobs of a shared machine hold the core is not counted (on an idle machine it
    equals wall time for a single thread). Memory-bandwidth contention still counts."""
    t0 = clock()
    for _ in range(inner):
        fn()
    return (clock() - t0) / inner


def calibrate(fn, setup, target):
    """Warm up (first touch of fresh pages) and pick the calls per timed sample."""
    if setup:
        setup()
    fn()
    if setup:
        setup()
    t = per_call(fn, 1)
    inner = 1 if t >= target else max(1, min(100000, int(target / max(t, 1e-8))))
    return t, inner


def paired(copy, fn, setup, args):
    """Time ``fn`` interleaved with ``copy``.

    Repetitions are blocks of a few alternations (copy, fn, fn, copy, ...) lasting tens
    of milliseconds; each block gives one ratio, the best copy sample over the best fn
    sample of that block (the best removes preemption, the short block shares the
    machine's memory load between both), and the reported ratio is the median over
    blocks. ``setup`` runs, untimed, before each sample of ``fn`` (it restores the
    residual, so that every sample sees the same data)."""
    tc, inner_c = calibrate(copy, None, args.sample)
    tf, inner_f = calibrate(fn, setup, args.sample)
    alt_time = tc * inner_c + tf * inner_f
    alts = max(2, min(args.alternations, int(args.block / max(alt_time, 1e-9))))
    block_time = alts * alt_time
    min_blocks = args.min_reps if block_time < 0.5 else 3
    blocks = max(min_blocks, min(args.max_reps, int(args.budget / max(block_time, 1e-9))))
    tcopy, tfn, ratios = [], [], []
    for b in range(blocks):
        bc, bf = [], []
        for a in range(alts):
            for which in ((0, 1) if (a + b) % 2 == 0 else (1, 0)):
                if which == 0:
                    bc.append(per_call(copy, inner_c))
                else:
                    if setup:
                        setup()
                    bf.append(per_call(fn, inner_f))
        ratios.append(min(bc) / min(bf))
        tcopy += bc
        tfn += bf
    return {'best_s': min(tfn), 'median_s': statistics.median(tfn),
            'copy_best_s': min(tcopy), 'copy_median_s': statistics.median(tcopy),
            'frac_copy': statistics.median(ratios),
            'frac_copy_iqr': [float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75))],
            'blocks': blocks, 'alternations': alts, 'inner': inner_f, 'copy_inner': inner_c}


# ---- cases ------------------------------------------------------------------------------

class Case:
    """One kernel at one size: its paths (callables) and its traffic model."""

    def __init__(self, name, group, kind, n, traffic, note=''):
        self.name, self.group, self.kind, self.n = name, group, kind, n
        self.traffic = traffic      # bytes per gradient element read + written by its passes
        self.note = note
        self.paths = {}             # path name -> (fn, setup)
        self.copy = None            # memmove of the same n floats


def build_cases(n, mx, lib, ops, ref, args, rng):
    """Arrays and cases for one size; returns (cases, keepalive)."""
    g = rng.standard_normal(n, dtype=f32)
    r0 = (0.5 * rng.standard_normal(n, dtype=f32)).astype(f32)
    acc0 = (g + r0).astype(f32)
    t = float(f32(FC_SCALE * np.abs(acc0.astype(np.float64)).mean()))   # fixed t ~ adaptive t
    over_t = float((np.abs(acc0) >= t).mean())
    del acc0
    r = r0.copy()
    out = np.zeros(n, f32)
    acc = np.zeros(n, f32)
    acc_ref = np.zeros(n, f32)
    dst = np.zeros(n, f32)
    keep = [g, r0, r, out, acc, acc_ref, dst]

    def copy_of(m):
        return lambda: ctypes.memmove(ptr(dst), ptr(g), 4 * m)

    def restore(m):
        return lambda: np.copyto(r[:m], r0[:m])

    def check(status, what):
        if status != 0:
            raise RuntimeError('%s returned status %d' % (what, status))

    # NDArrays of the operator path and of MXNet's built-in compression
    G, R0, R = mx.nd.array(g), mx.nd.array(r0), mx.nd.array(r0)
    ACC = mx.nd.zeros(n)
    keep += [G, R0, R, ACC]

    def restore_nd():
        R0.copyto(R)
        R.wait_to_read()

    def wait(*arrays):
        for a in arrays:
            a.wait_to_read()

    use_ref = ref is not None and n <= args.ref_max_size
    cases = []

    def add(case, kernel, kernel_setup=None, op=None, op_setup=None, numpy=None):
        case.copy = copy_of(case.n)
        case.paths['kernel'] = (kernel, kernel_setup)
        if op is not None and not args.no_op:
            case.paths['op'] = (op, op_setup)
        if numpy is not None and use_ref:
            case.paths['numpy'] = (numpy, None)
        cases.append(case)

    # -- fp32 pass-through ---------------------------------------------------------------
    p32 = np.zeros(n + 8, f32)
    check(lib.kvx_fp32_encode(ptr(g), n, ptr(p32)), 'fp32_encode')
    P32 = mx.nd.array(p32)
    keep += [p32, P32]
    f = ops.op('kvx_fp32_encode')
    add(Case('fp32_encode', 'fp32', 'encode', n, 12, 'finite check + memcpy'),
        lambda: lib.kvx_fp32_encode(ptr(g), n, ptr(p32)),
        op=lambda f=f: wait(*f(G)),
        numpy=lambda: ref.fp32_encode(g))
    f = ops.op('kvx_fp32_decode')
    add(Case('fp32_decode', 'fp32', 'decode', n, 8, 'header check + memcpy'),
        lambda: lib.kvx_fp32_decode(ptr(p32), n + 8, n, ptr(out)),
        op=lambda f=f: wait(*f(P32, size=n)),
        numpy=lambda: ref.fp32_decode(p32, n))
    f = ops.op('kvx_fp32_decode_add')
    add(Case('fp32_decode_add', 'fp32', 'decode', n, 12, 'acc += payload'),
        lambda: lib.kvx_fp32_decode_add(ptr(p32), n + 8, n, ptr(acc)),
        op=lambda f=f: wait(f(P32, ACC), ACC),
        numpy=lambda: np.add(acc_ref, ref.fp32_decode(p32, n)[0], out=acc_ref))

    # -- conv filter selection (Hylo top-k) ------------------------------------------------
    def layout(fsize, rate):
        filters = max(1, int(round(n / fsize)))
        while filters * fsize > n:
            filters -= 1
        filters = max(filters, 1)
        k = min(filters, max(1, math.ceil(rate * filters)))
        return filters, k, filters * fsize

    for fsize, rate in TOPK_CASES:
        filters, k, m = layout(fsize, rate)
        if m > n:
            continue
        words = 8 + k + k * fsize
        payload = np.zeros(words, f32)
        keep.append(payload)
        G2, R2 = G[0:m].reshape((filters, fsize)), R[0:m].reshape((filters, fsize))
        g2, r02 = g[:m].reshape(filters, fsize), r0[:m].reshape(filters, fsize)
        f = ops.op('kvx_topk_encode')
        add(Case('topk_encode F=%d %g%%' % (fsize, 100 * rate), 'topk encode', 'encode', m,
                 20 + 4 * k / filters, 'scores pass + split pass (%d of %d filters)' % (k, filters)),
            lambda payload=payload, filters=filters, fsize=fsize, k=k: lib.kvx_topk_encode(
                ptr(g), ptr(r), filters, fsize, k, ptr(payload)),
            kernel_setup=restore(m),
            op=lambda f=f, G2=G2, R2=R2, k=k: wait(*f(G2, R2, k=k), R2), op_setup=restore_nd,
            numpy=lambda g2=g2, r02=r02, k=k: ref.topk_encode(g2, r02, k))

    for fsize, rate in TOPK_DECODE_CASES:
        filters, k, m = layout(fsize, rate)
        words = 8 + k + k * fsize
        payload = np.zeros(words, f32)
        rtmp = r0[:m].copy()
        check(lib.kvx_topk_encode(ptr(g), ptr(rtmp), filters, fsize, k, ptr(payload)),
              'topk_encode')
        P = mx.nd.array(payload)
        ACC2 = ACC[0:m].reshape((filters, fsize))
        keep += [payload, P, ACC2]
        shape = ops.shape_attr((filters, fsize))
        f = ops.op('kvx_topk_decode')
        add(Case('topk_decode F=%d %g%%' % (fsize, 100 * rate), 'topk decode', 'decode', m,
                 4 + 8 * k / filters, 'zero fill + k rows copied'),
            lambda payload=payload, words=words, m=m: lib.kvx_topk_decode(
                ptr(payload), words, m, ptr(out)),
            op=lambda f=f, P=P, shape=shape: wait(*f(P, shape=shape)),
            numpy=lambda payload=payload, m=m: ref.topk_decode(payload, m))
        f = ops.op('kvx_topk_decode_add')
        add(Case('topk_decode_add F=%d %g%%' % (fsize, 100 * rate), 'topk decode', 'decode', m,
                 12 * k / filters, 'acc[k rows] += values'),
            lambda payload=payload, words=words, m=m: lib.kvx_topk_decode_add(
                ptr(payload), words, m, ptr(acc)),
            op=lambda f=f, P=P, ACC2=ACC2: wait(f(P, ACC2), ACC2),
            numpy=lambda payload=payload, m=m: np.add(
                acc_ref[:m], ref.topk_decode(payload, m)[0], out=acc_ref[:m]))

    # -- homomorphic conv: scores, gather, scatter ----------------------------------------
    fsize, rate = HOM_FILTER
    filters, k, m = layout(fsize, rate)
    idx = np.linspace(0, filters - 1, k).round().astype(np.int64)
    idx = np.unique(idx).astype(f32)
    k = idx.size
    scores = np.zeros(filters, np.float64)
    values = np.zeros(k * fsize, f32)
    rtmp = r0[:m].copy()
    check(lib.kvx_topk_gather(ptr(g), ptr(rtmp), filters, fsize, ptr(idx), k, ptr(values)),
          'topk_gather')
    IDX, VAL = mx.nd.array(idx), mx.nd.array(values)
    G2, R2 = G[0:m].reshape((filters, fsize)), R[0:m].reshape((filters, fsize))
    g2, r02 = g[:m].reshape(filters, fsize), r0[:m].reshape(filters, fsize)
    vals_work = np.zeros_like(values)
    keep += [idx, scores, values, vals_work, IDX, VAL, rtmp, G2, R2]
    f = ops.op('kvx_filter_scores')
    add(Case('filter_scores F=%d' % fsize, 'homomorphic conv', 'encode', m, 4,
             'float64 squared norms, NumPy order'),
        lambda: lib.kvx_filter_scores(ptr(g), filters, fsize, ptr(scores)),
        op=lambda f=f, G2=G2: wait(f(G2)),
        numpy=lambda g2=g2: ref.filter_scores(g2))
    f = ops.op('kvx_topk_gather')
    add(Case('topk_gather F=%d %g%%' % (fsize, 100 * rate), 'homomorphic conv', 'encode', m,
             20 + 4 * k / filters, 'finite pass + split pass'),
        lambda: lib.kvx_topk_gather(ptr(g), ptr(r), filters, fsize, ptr(idx), k, ptr(vals_work)),
        kernel_setup=restore(m),
        op=lambda f=f, G2=G2, R2=R2: wait(*f(G2, R2, IDX), R2), op_setup=restore_nd,
        numpy=lambda g2=g2, r02=r02: ref.topk_gather(g2, r02, idx))
    f = ops.op('kvx_topk_scatter')
    shape = ops.shape_attr((filters, fsize))
    add(Case('topk_scatter F=%d %g%%' % (fsize, 100 * rate), 'homomorphic conv', 'decode', m,
             4 + 8 * k / filters, 'zero fill + k rows copied'),
        lambda: lib.kvx_topk_scatter(ptr(values), ptr(idx), k, filters, fsize, ptr(out)),
        op=lambda f=f, shape=shape: wait(*f(VAL, IDX, shape=shape)),
        numpy=lambda: ref.topk_scatter(values, idx, (filters, fsize)))

    # -- Hylo FC ternary ------------------------------------------------------------------
    tw = 8 + -(-n // 15)
    pt = np.zeros(tw, f32)
    rtmp = r0.copy()
    check(lib.kvx_ternary_encode(ptr(g), ptr(rtmp), n, FC_SCALE, 0.0, ptr(pt)), 'ternary_encode')
    del rtmp
    PT = mx.nd.array(pt)
    pt_work = np.zeros_like(pt)
    keep += [pt, PT, pt_work]
    body = 4 / 15
    f = ops.op('kvx_ternary_encode')
    add(Case('ternary_encode adaptive', 'FC ternary', 'encode', n, 8 + 12 + body,
             'sum|acc| pass + pack pass'),
        lambda: lib.kvx_ternary_encode(ptr(g), ptr(r), n, FC_SCALE, 0.0, ptr(pt_work)),
        kernel_setup=restore(n),
        op=lambda f=f: wait(*f(G, R, scale=FC_SCALE, threshold=0.0), R), op_setup=restore_nd,
        numpy=lambda: ref.ternary_encode(g, r0, FC_SCALE))
    add(Case('ternary_encode fixed t', 'FC ternary', 'encode', n, 8 + 12 + body,
             'finite pass + pack pass'),
        lambda: lib.kvx_ternary_encode(ptr(g), ptr(r), n, FC_SCALE, t, ptr(pt_work)),
        kernel_setup=restore(n),
        op=lambda f=f: wait(*f(G, R, scale=FC_SCALE, threshold=t), R), op_setup=restore_nd,
        numpy=lambda: ref.ternary_encode(g, r0, FC_SCALE, t))
    if args.chunk and n >= 4 * args.chunk:
        # The same encoder applied to consecutive chunks of args.chunk elements (as the
        # codecs' chunking does, with a smaller chunk_size): grad + residual of a chunk
        # stay in L2 between the two passes, so only one pass reads them from memory.
        c = args.chunk
        starts = list(range(0, n, c))
        pc = np.zeros(len(starts) * (8 + -(-c // 15)), f32)
        offsets = [(s0, min(c, n - s0), i * (8 + -(-c // 15))) for i, s0 in enumerate(starts)]
        keep.append(pc)
        gp, rp, pp = ptr(g), ptr(r), ptr(pc)
        enc = lib.kvx_ternary_encode

        def chunked(threshold):
            def run():
                for s0, m0, w0 in offsets:
                    enc(gp + 4 * s0, rp + 4 * s0, m0, FC_SCALE, threshold, pp + 4 * w0)
            return run

        add(Case('ternary_encode adaptive, %dK chunks' % (c // 1024), 'FC ternary', 'encode', n,
                 8 + 12 + body, 'per chunk: sum|acc| pass + pack pass (2nd pass from L2)'),
            chunked(0.0), kernel_setup=restore(n))
        add(Case('ternary_encode fixed t, %dK chunks' % (c // 1024), 'FC ternary', 'encode', n,
                 8 + 12 + body, 'per chunk: finite pass + pack pass (2nd pass from L2)'),
            chunked(t), kernel_setup=restore(n))
    f = ops.op('kvx_ternary_decode')
    shape = ops.shape_attr((n,))
    add(Case('ternary_decode', 'FC ternary', 'decode', n, 4 + 2 * body,
             'word check + table expand'),
        lambda: lib.kvx_ternary_decode(ptr(pt), tw, n, ptr(out)),
        op=lambda f=f, shape=shape: wait(*f(PT, shape=shape)),
        numpy=lambda: ref.ternary_decode(pt, n))
    f = ops.op('kvx_ternary_decode_add')
    add(Case('ternary_decode_add', 'FC ternary', 'decode', n, 8 + 2 * body,
             'word check + acc += expand'),
        lambda: lib.kvx_ternary_decode_add(ptr(pt), tw, n, ptr(acc)),
        op=lambda f=f: wait(f(PT, ACC), ACC),
        numpy=lambda: np.add(acc_ref, ref.ternary_decode(pt, n)[0], out=acc_ref))

    # -- homomorphic ternary, 4 workers ----------------------------------------------------
    sw = int(lib.kvx_ternary_sum_words(n, WORKERS))
    summed = np.zeros(sw, f32)
    words = np.zeros(sw, f32)
    for c in (1.0, -1.0, 0.5, -0.5):           # four workers' payloads, summed exactly
        rtmp = (c * r0).astype(f32)
        check(lib.kvx_ternary_encode_sum(ptr(g), ptr(rtmp), n, t, WORKERS, ptr(words)),
              'ternary_encode_sum')
        summed += words
    del rtmp
    SUM = mx.nd.array(summed)
    keep += [summed, words, SUM]
    digits = -(-n // sw) if sw else 1
    f = ops.op('kvx_ternary_encode_sum')
    add(Case('ternary_encode_sum n=%d' % WORKERS, 'homomorphic ternary', 'encode', n,
             8 + 12 + 4 / digits, 'finite pass + pack pass (base %d)' % (2 * WORKERS + 1)),
        lambda: lib.kvx_ternary_encode_sum(ptr(g), ptr(r), n, t, WORKERS, ptr(words)),
        kernel_setup=restore(n),
        op=lambda f=f: wait(*f(G, R, threshold=t, num_workers=WORKERS), R), op_setup=restore_nd,
        numpy=lambda: ref.ternary_encode_sum(g, r0, t, WORKERS))
    f = ops.op('kvx_ternary_decode_sum')
    add(Case('ternary_decode_sum n=%d' % WORKERS, 'homomorphic ternary', 'decode', n,
             4 + 8 / digits, 'word check + table expand'),
        lambda: lib.kvx_ternary_decode_sum(ptr(summed), sw, t, WORKERS, n, ptr(out)),
        op=lambda f=f, shape=shape: wait(*f(SUM, threshold=t, num_workers=WORKERS, shape=shape)),
        numpy=lambda: ref.ternary_decode_sum(summed, t, WORKERS, n))

    # -- MXNet's 2-bit layout: ours and MXNet's own ----------------------------------------
    nw = -(-n // 16)
    tb = np.zeros(nw, np.uint32)
    rtmp = r0.copy()
    check(lib.kvx_twobit_encode(ptr(g), ptr(rtmp), n, t, ptr(tb)), 'twobit_encode')
    del rtmp
    tb_work = np.zeros_like(tb)
    TB = mx.nd.array(tb.view(f32))
    keep += [tb, tb_work, TB]
    f = ops.op('kvx_twobit_encode')
    add(Case('twobit_encode', 'MXNet 2-bit layout', 'encode', n, 12 + 0.25,
             'one fused pass, no finite check'),
        lambda: lib.kvx_twobit_encode(ptr(g), ptr(r), n, t, ptr(tb_work)),
        kernel_setup=restore(n),
        op=lambda f=f: wait(f(G, R, threshold=t), R), op_setup=restore_nd,
        numpy=lambda: ref.twobit_encode(g, r0, t))
    f = ops.op('kvx_twobit_decode')
    add(Case('twobit_decode', 'MXNet 2-bit layout', 'decode', n, 4 + 0.25, 'one pass'),
        lambda: lib.kvx_twobit_decode(ptr(tb), n, t, ptr(out)),
        op=lambda f=f, shape=shape: wait(f(TB, threshold=t, shape=shape)),
        numpy=lambda: ref.twobit_decode(tb, t, n))

    if n <= args.mxnet_max_size:
        builtin = MXNetTwoBit(mx, t)
        W = mx.nd.zeros(nw)
        OUT = mx.nd.zeros(n)
        builtin.quantize(G, W, R)        # first call; check MXNet's layout against ours
        wait(W, R)
        same = np.array_equal(W.asnumpy().view(np.uint32), tb)
        if not same:
            print('warning: MXNet quantize_2bit words differ from kvx_twobit_encode at n=%d' % n)
        restore_nd()
        keep += [builtin, W, OUT]
        q = Case('MXNet 2bit quantize', 'MXNet built-in', 'encode', n, 12 + 0.25,
                 "GradientCompression::Quantize (branchy kernel), engine push + wait")
        q.copy = copy_of(n)
        q.paths['mxnet'] = (lambda: (builtin.quantize(G, W, R), wait(W, R)), restore_nd)
        q.bitexact = same
        cases.append(q)
        d = Case('MXNet 2bit dequantize', 'MXNet built-in', 'decode', n, 4 + 0.25,
                 'GradientCompression::Dequantize, engine push + wait')
        d.copy = copy_of(n)
        d.paths['mxnet'] = (lambda: (builtin.dequantize(W, OUT), wait(OUT)), None)
        cases.append(d)
    for case in cases:
        case.threshold, case.over_t = t, over_t
    return cases, keep, t


def kvstore_check(n, mx, t, args, rng):
    """MXNet's own compressed push+pull against the uncompressed one ('device' kvstore,
    one CPU context, no updater): with 2-bit, a push runs Quantize, Dequantize and a
    one-input ElementwiseSum; without, the pushed array is stored as is. Both pulls copy.
    Pushes cycle through four independent N(0, 1) gradients, so that the kvstore's own
    residual (which cannot be reset from outside) behaves as in training, zero-mean
    steps with error feedback: one constant gradient would pile up in it and push ever
    more elements over t, the slow end of MXNet's branchy kernel."""
    g = rng.standard_normal(n, dtype=f32)
    grads = [mx.nd.array(g)] + [mx.nd.array(rng.standard_normal(n, dtype=f32)) for _ in range(3)]
    dst_np = np.zeros(n, f32)
    O = mx.nd.zeros(n)
    res = {}
    stores = {}
    for kind in ('none', '2bit'):
        kv = mx.kv.create('device')
        if kind == '2bit':
            kv.set_gradient_compression({'type': '2bit', 'threshold': t})
        kv.init(0, mx.nd.zeros(n))
        stores[kind] = kv
    step = [0]

    def run(kv):
        step[0] += 1
        kv.push(0, grads[step[0] % len(grads)])
        kv.pull(0, out=O)
        O.wait_to_read()

    copy = lambda: ctypes.memmove(ptr(dst_np), ptr(g), 4 * n)
    for kind, kv in stores.items():
        res[kind] = paired(copy, lambda kv=kv: run(kv), None, args)
    return res


def threshold_sweep(n, mx, lib, args, rng):
    """MXNet's quantize_2bit branches on every element (``if acc >= t ... else if acc <= -t``),
    so its speed depends on how many elements cross the threshold; ours are branch-free.
    For several fractions p of elements over t (t = the (1-p) quantile of |acc|), time
    MXNet's Quantize, our fixed-t ternary_encode and our twobit_encode, each paired
    with the copy, residual restored before every sample."""
    g = rng.standard_normal(n, dtype=f32)
    r0 = (0.5 * rng.standard_normal(n, dtype=f32)).astype(f32)
    absacc = np.abs((g + r0).astype(f32))
    r = r0.copy()
    dst = np.zeros(n, f32)
    pt = np.zeros(8 + -(-n // 15), f32)
    tb = np.zeros(-(-n // 16), np.uint32)
    G, R0, R, W = mx.nd.array(g), mx.nd.array(r0), mx.nd.array(r0), mx.nd.zeros(-(-n // 16))
    copy = lambda: ctypes.memmove(ptr(dst), ptr(g), 4 * n)
    restore = lambda: np.copyto(r, r0)

    def restore_nd():
        R0.copyto(R)
        R.wait_to_read()

    rows = []
    for p in [float(x) for x in args.sweep_fractions.split(',')]:
        t = float(f32(np.quantile(absacc, 1.0 - p)))
        builtin = MXNetTwoBit(mx, t)
        paths = {
            'mxnet': paired(copy, lambda: (builtin.quantize(G, W, R), W.wait_to_read(),
                                           R.wait_to_read()), restore_nd, args),
            'ternary_encode fixed t': paired(copy, lambda: lib.kvx_ternary_encode(
                ptr(g), ptr(r), n, FC_SCALE, t, ptr(pt)), restore, args),
            'twobit_encode': paired(copy, lambda: lib.kvx_twobit_encode(
                ptr(g), ptr(r), n, t, ptr(tb)), restore, args),
        }
        row = {'size': n, 'fraction_over_t': float((absacc >= t).mean()), 'threshold': t,
               'paths': {k: dict(v, gbps=gbps(n, v['best_s']), copy_gbps=gbps(n, v['copy_best_s']))
                         for k, v in paths.items()}}
        row['ratios'] = {k: v['frac_copy'] / paths['mxnet']['frac_copy']
                         for k, v in paths.items() if k != 'mxnet'}
        rows.append(row)
    return rows


# ---- reporting ----------------------------------------------------------------------------

def gbps(n, seconds):
    return 4.0 * n / seconds / 1e9


def summarise(case, measured):
    """Per-path GB/s and the ratios of one case."""
    row = {'case': case.name, 'group': case.group, 'kind': case.kind, 'elements': case.n,
           'traffic_bytes_per_element': case.traffic, 'passes': case.note, 'paths': {}}
    if hasattr(case, 'bitexact'):
        row['bitexact_with_kvx_twobit'] = case.bitexact
    for path, m in measured.items():
        m = dict(m)
        m['gbps'] = gbps(case.n, m['best_s'])
        m['moved_gbps'] = case.traffic * case.n / m['best_s'] / 1e9
        m['copy_gbps'] = gbps(case.n, m['copy_best_s'])
        m['copy_moved_gbps'] = 8.0 * case.n / m['copy_best_s'] / 1e9
        row['paths'][path] = m
    return row


def add_ratios(rows):
    """kernel/copy, kernel/numpy, kernel/mxnet (copy-normalised) per row."""
    by_size = {}
    for row in rows:
        by_size.setdefault(row['size'], {})[row['case']] = row
    for size, cases in by_size.items():
        mxq = cases.get('MXNet 2bit quantize', {}).get('paths', {}).get('mxnet')
        mxd = cases.get('MXNet 2bit dequantize', {}).get('paths', {}).get('mxnet')
        for row in cases.values():
            k = row['paths'].get('kernel')
            if not k:
                continue
            ratios = {'vs_copy': k['frac_copy']}
            if 'numpy' in row['paths']:
                ratios['vs_numpy'] = k['frac_copy'] / row['paths']['numpy']['frac_copy']
            if 'op' in row['paths']:
                ratios['op_overhead_us'] = 1e6 * (row['paths']['op']['best_s'] - k['best_s'])
                ratios['op_vs_copy'] = row['paths']['op']['frac_copy']
            mx_ref = mxq if row['kind'] == 'encode' else mxd
            if mx_ref:
                ratios['vs_mxnet_2bit'] = k['frac_copy'] / mx_ref['frac_copy']
            row['ratios'] = ratios


def fmt(x, spec='%.2f'):
    return '-' if x is None else spec % x


def print_table(rows, size):
    print('\nn = %s elements (%s MB of float32 gradient)' % (f'{size:,}', fmt(4 * size / 1e6, '%.3g')))
    head = ('%-28s %6s %7s %7s %7s %6s %7s %7s %7s %8s %8s' %
            ('case', 'B/el', 'GB/s', 'moved', 'copy', 'k/copy', 'op GB/s', 'op +us',
             'np GB/s', 'k/numpy', 'k/MX2bit'))
    print(head)
    print('-' * len(head))
    for row in rows:
        if row['size'] != size:
            continue
        paths, ratios = row['paths'], row.get('ratios', {})
        main = paths.get('kernel') or paths.get('mxnet')
        print('%-28s %6.2f %7.2f %7.2f %7.2f %6.2f %7s %7s %7s %8s %8s' % (
            row['case'][:28], row['traffic_bytes_per_element'], main['gbps'], main['moved_gbps'],
            main['copy_gbps'], main['frac_copy'],
            fmt(paths.get('op', {}).get('gbps')), fmt(ratios.get('op_overhead_us'), '%.0f'),
            fmt(paths.get('numpy', {}).get('gbps'), '%.3f'), fmt(ratios.get('vs_numpy'), '%.0f'),
            fmt(ratios.get('vs_mxnet_2bit'), '%.1f')))


def check_targets(rows, kvstore):
    """The kernels' targets, at every measured size >= 10^6 (out of cache)."""
    out = []
    for row in rows:
        if row['size'] < 10 ** 6 or 'ratios' not in row:
            continue
        r = row['ratios']
        if row['case'] == 'ternary_encode adaptive':
            out.append({'target': "Hylo FC 2-bit encode (adaptive t, residual) >= 40% of copy",
                        'size': row['size'], 'value': r['vs_copy'], 'holds': r['vs_copy'] >= 0.40})
            if 'vs_mxnet_2bit' in r:
                out.append({'target': "Hylo FC 2-bit encode >= 10x MXNet's built-in 2-bit",
                            'size': row['size'], 'value': r['vs_mxnet_2bit'],
                            'holds': r['vs_mxnet_2bit'] >= 10})
        if row['case'].startswith('ternary_encode adaptive,'):
            out.append({'target': 'same, %s' % row['case'][len('ternary_encode '):],
                        'size': row['size'], 'value': r['vs_copy'], 'holds': r['vs_copy'] >= 0.40})
        if row['case'].startswith('topk_encode'):
            out.append({'target': 'filter selection (%s) >= 25%% of copy' % row['case'],
                        'size': row['size'], 'value': r['vs_copy'], 'holds': r['vs_copy'] >= 0.25})
    return out


# ---- per-pass profile -----------------------------------------------------------------------

PROFILE_DRIVER = r'''
// Times each pass of the encoders separately (the kernel sources are included, so that
// their static passes can be called), interleaved with a memcpy of the same n floats; best
// of R, CPU time.
#include "wire.cc"
#include "kernel_util.cc"
#include "stats.cc"
#include "codecs/topk.cc"
#include "codecs/ternary.cc"
#include "codecs/twobit.cc"
#include <time.h>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>
using namespace kvx;
int main(int argc, char** argv) {
  const int64_t n = std::atoll(argv[1]);
  const int rounds = std::atoi(argv[2]);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> g(n), r(n), dst(n), words(n / 7 + 16);
  std::vector<uint32_t> tb(n / 16 + 1);
  for (auto& v : g) v = normal(rng);
  for (auto& v : r) v = 0.5f * normal(rng);
  const float t = 1.8f;
  const int64_t fs = 4608, filters = std::max<int64_t>(1, n / fs), k = (filters + 19) / 20;
  std::vector<double> scores(filters);
  std::vector<int64_t> sent(k);
  for (int64_t i = 0; i < k; ++i) sent[i] = i * (filters / k);
  std::vector<float> vals(k * fs), pay(topk_payload_words(k, fs)), tp(ternary_payload_words(n));
  std::vector<float> cp((n / 65536 + 1) * ternary_payload_words(65536));
  volatile double sink = 0;
  struct P { const char* name; int64_t elems; double traffic; std::function<void()> run; };
  const int64_t m = filters * fs;
  std::vector<P> passes = {
    {"memcpy", n, 8, [&] { std::memcpy(dst.data(), g.data(), n * 4); }},
    {"all_finite(g)", n, 4, [&] { sink = all_finite(g.data(), n); }},
    {"acc_all_finite(g,r)", n, 8, [&] { sink = acc_all_finite(g.data(), r.data(), n); }},
    {"acc_abs_sum(g,r)", n, 8, [&] { sink = acc_abs_sum(g.data(), r.data(), n); }},
    {"ternary_pack<15> base 3", n, 12 + 4.0 / 15, [&] {
       ternary_pack<15>(g.data(), r.data(), n, t, t, 3, words.data()); }},
    {"ternary_pack<7> base 9", n, 12 + 4.0 / 7, [&] {
       ternary_pack<7>(g.data(), r.data(), n, t, t, 9, words.data()); }},
    {"twobit_pack", n, 12.25, [&] { twobit_pack(g.data(), r.data(), n, t, tb.data()); }},
    {"acc_filter_scores F=4608", m, 8, [&] {
       acc_filter_scores(g.data(), r.data(), filters, fs, scores.data()); }},
    {"split_rows F=4608 5%", m, 12 + 4.0 * k / filters, [&] {
       split_rows(g.data(), r.data(), filters, fs, sent.data(), k, vals.data()); }},
    {"ternary_encode fixed (total)", n, 20 + 4.0 / 15, [&] {
       ternary_encode(g.data(), r.data(), n, 2.0, t, tp.data()); }},
    {"ternary_encode adaptive (total)", n, 20 + 4.0 / 15, [&] {
       ternary_encode(g.data(), r.data(), n, 2.0, 0.0, tp.data()); }},
    {"topk_encode F=4608 5% (total)", m, 20 + 4.0 * k / filters, [&] {
       topk_encode(g.data(), r.data(), filters, fs, k, pay.data()); }},
    {"ternary_encode adaptive, 64K chunks", n, 20 + 4.0 / 15, [&] {
       const int64_t c = 65536;
       for (int64_t s = 0, w = 0; s < n; s += c, w += ternary_payload_words(c))
         ternary_encode(g.data() + s, r.data() + s, std::min(c, n - s), 2.0, 0.0, cp.data() + w);
     }},
  };
  std::vector<double> best(passes.size(), 1e300), copy_best(passes.size(), 1e300);
  const int inner = n < 1000000 ? 50 : 1;
  // CPU time of this (single-threaded) process: preemption by other jobs is not counted.
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  for (auto& p : passes) p.run();  // warm up
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < passes.size(); ++i) {
      auto t0 = now();
      for (int j = 0; j < inner; ++j) passes[0].run();
      auto t1 = now();
      for (int j = 0; j < inner; ++j) passes[i].run();
      auto t2 = now();
      copy_best[i] = std::min(copy_best[i], (t1 - t0) / inner);
      best[i] = std::min(best[i], (t2 - t1) / inner);
    }
  }
  for (size_t i = 0; i < passes.size(); ++i) {
    // name, elements, traffic bytes/element, seconds, copy seconds (same n)
    std::printf("%s\t%lld\t%.4f\t%.9g\t%.9g\n", passes[i].name,
                static_cast<long long>(passes[i].elems), passes[i].traffic, best[i],
                copy_best[i] * passes[i].elems / n);
  }
  return 0;
}
'''


def run_profile(args):
    """Compile the driver with the CMake flags and time each pass; None if impossible."""
    src = os.path.join(REPO, 'cpp', 'codecs', 'ternary.cc')
    cxx = shutil.which('g++')
    if not (os.path.isfile(src) and cxx):
        print('profile skipped: needs g++ and the source checkout (cpp/)')
        return None
    results = {'flags': '-O3 -ffp-contract=off -fno-fast-math -std=c++17', 'sizes': {}}
    with tempfile.TemporaryDirectory() as tmp:
        driver = os.path.join(tmp, 'passes.cc')
        with open(driver, 'w') as f:
            f.write(PROFILE_DRIVER)
        exe = os.path.join(tmp, 'passes')
        subprocess.run([cxx, '-O3', '-ffp-contract=off', '-fno-fast-math', '-std=c++17',
                        '-I', os.path.join(REPO, 'cpp'), driver, '-o', exe], check=True)
        for size in parse_sizes(args.profile_sizes, 1e12):
            rounds = 30 if size <= 10 ** 6 else 15
            text = subprocess.run([exe, str(size), str(rounds)], check=True,
                                  capture_output=True, text=True).stdout
            rows = []
            for line in text.strip().splitlines():
                name, elems, traffic, sec, copy_sec = line.split('\t')
                elems, traffic, sec, copy_sec = int(elems), float(traffic), float(sec), float(copy_sec)
                rows.append({'pass': name, 'elements': elems, 'traffic_bytes_per_element': traffic,
                             'ms': 1e3 * sec, 'gbps': gbps(elems, sec),
                             'moved_gbps': traffic * elems / sec / 1e9,
                             'copy_ms': 1e3 * copy_sec, 'frac_copy_time': copy_sec / sec})
            results['sizes'][str(size)] = rows
            print('\nper-pass profile, n = %s (best of %d, memcpy interleaved)' % (f'{size:,}', rounds))
            print('%-34s %9s %8s %9s %9s' % ('pass', 'ms', 'GB/s', 'moved', 'copy/pass'))
            for row in rows:
                print('%-34s %9.3f %8.2f %9.2f %9.2f' % (row['pass'], row['ms'], row['gbps'],
                                                         row['moved_gbps'], row['frac_copy_time']))
    return results


# ---- main ---------------------------------------------------------------------------------

def parse_sizes(text, max_size):
    sizes = [int(float(s)) for s in text.split(',') if s.strip()]
    return [s for s in sizes if s <= max_size]


def main(argv=None):
    global clock
    args = parse_args(argv)
    clock = CLOCK[args.clock]
    mx, kvstore_ext, _lib, ops, ref = import_everything(args)
    lib_path = _lib.library_path()
    _lib.load_test_ops()     # the decoders and pieces the benchmark times
    lib = load_capi(lib_path)
    info = machine_info(args, lib_path)
    null = lib.kvx_abi_version
    info['ctypes_call_overhead_us'] = 1e6 * min(per_call(null, 20000) for _ in range(5))
    if ref is None:
        print('NumPy reference (python/kvx_ref) not found: its column stays empty')
    print('kernels of %s\n%s, %s, MXNet OMP threads %d, ctypes call %.2f us' % (
        lib_path, info.get('cpu', '?'), ' '.join(info.get('simd', [])), args.mxnet_threads,
        info['ctypes_call_overhead_us']))
    only = [s for s in args.only.split(',') if s]
    rng = np.random.default_rng(args.seed)
    rows, kv_rows = [], []
    for size in parse_sizes(args.sizes, args.max_size):
        started = time.time()
        cases, keep, t = build_cases(size, mx, lib, ops, ref, args, rng)
        for case in cases:
            if only and not any(s in case.name for s in only):
                continue
            measured = {}
            for path, (fn, setup) in case.paths.items():
                measured[path] = paired(case.copy, fn, setup, args)
            row = summarise(case, measured)
            row['size'] = size
            row['threshold'] = case.threshold
            row['fraction_over_t'] = case.over_t
            rows.append(row)
        del cases, keep
        gc.collect()
        if not args.no_kvstore and size <= args.mxnet_max_size and size >= 10 ** 5:
            res = kvstore_check(size, mx, t, args, rng)
            kv_rows.append({'size': size, **{k: dict(v, gbps=gbps(size, v['best_s']))
                                             for k, v in res.items()},
                            'diff_s': res['2bit']['best_s'] - res['none']['best_s']})
            gc.collect()
        add_ratios(rows)
        print_table(rows, size)
        print('(%.0f s)' % (time.time() - started))
    add_ratios(rows)
    if kv_rows:
        print("\nMXNet kvstore check ('device', 1 CPU context): push+pull with 2-bit vs without")
        print('%12s %10s %10s %12s %14s %14s' % ('n', 'none ms', '2bit ms', 'diff ms',
                                                 'diff GB/s', 'direct Q+D ms'))
        direct = {(r['size'], r['case']): r['paths']['mxnet']['best_s'] for r in rows
                  if r['case'].startswith('MXNet 2bit')}
        for r in kv_rows:
            qd = [direct.get((r['size'], c)) for c in ('MXNet 2bit quantize', 'MXNet 2bit dequantize')]
            qd_ms = 1e3 * sum(qd) if all(qd) else None
            r['direct_quantize_plus_dequantize_s'] = qd_ms / 1e3 if qd_ms else None
            print('%12s %10.3f %10.3f %12.3f %14.3f %14s' % (
                f"{r['size']:,}", 1e3 * r['none']['best_s'], 1e3 * r['2bit']['best_s'],
                1e3 * r['diff_s'], gbps(r['size'], r['diff_s']) if r['diff_s'] > 0 else float('nan'),
                fmt(qd_ms, '%.3f')))
    sweep_rows = []
    for size in parse_sizes(args.sweep_sizes, min(args.max_size, args.mxnet_max_size)):
        sweep_rows += threshold_sweep(size, mx, lib, args, rng)
        gc.collect()
    if sweep_rows:
        print("\nthreshold sweep: MXNet's branchy quantize vs our branch-free encoders "
              "(GB/s of gradient; x = copy-normalised ratio to MXNet)")
        print('%12s %8s %9s %9s %7s %9s %7s %8s' % ('n', 'over t', 'MXNet', 'ternary', 'x',
                                                    'twobit', 'x', 'copy'))
        for r in sweep_rows:
            P = r['paths']
            print('%12s %7.1f%% %9.2f %9.2f %7.1f %9.2f %7.1f %8.2f' % (
                f"{r['size']:,}", 100 * r['fraction_over_t'], P['mxnet']['gbps'],
                P['ternary_encode fixed t']['gbps'], r['ratios']['ternary_encode fixed t'],
                P['twobit_encode']['gbps'], r['ratios']['twobit_encode'],
                P['mxnet']['copy_gbps']))
    targets = check_targets(rows, kv_rows)
    if targets:
        print('\ntargets (sizes >= 10^6):')
        for tg in targets:
            print('  %-62s n=%-11s %6.2f  %s' % (tg['target'], f"{tg['size']:,}", tg['value'],
                                                'holds' if tg['holds'] else 'MISSED'))
    profile = run_profile(args) if args.profile else None
    result = {'meta': dict(info, args=vars(args),
                           definitions={
                               'time': 'CPU time of the benchmark process (all threads) when '
                                       'clock=cpu, else wall time',
                               'gbps': '4 bytes x elements of float32 gradient (decoded tensor '
                                       'for decoders) / best time',
                               'copy': 'memmove of the same n floats: moves 8 bytes/element '
                                       '(copy_moved_gbps) = 2 x its GB/s of gradient',
                               'frac_copy': 'median over blocks of (best copy time / best path '
                                            'time) within a block of interleaved samples = '
                                            'throughput relative to copy',
                               'traffic_bytes_per_element': 'bytes read + written per element '
                                                            'by the passes of the implementation',
                               'vs_numpy, vs_mxnet_2bit': 'ratio of copy-normalised throughputs',
                           }),
              'results': rows, 'kvstore_check': kv_rows, 'threshold_sweep': sweep_rows,
              'targets': targets, 'profile': profile}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
        print('wrote', args.json)
    if args.plot:
        sys.path.insert(0, HERE)
        from plot_kernels import plot
        plot(result, args.plot)
        print('wrote', args.plot)
    return result


if __name__ == '__main__':
    main()
