"""A cost model of a training step: bytes, wire time, codec time, step time.

Why: whether compression pays depends on the model's shapes, the workers and servers,
the link and how fast the codecs run on the machine at hand; often it does not
(Agarwal et al., "On the Utility of Gradient Compression in Distributed Training
Systems", MLSys 2022). A user needs a prediction before a run, and a policy that
decides per tensor (as Espresso does) needs the same prediction per tensor: ``cost``.

The bytes are not re-derived here. They come from the code the store runs: the codec
the scheme plans for a tensor (``Scheme.codec_for_key``), its rounds and their sizes
(``Codec.wire_words``), the chunks (``chunking.split``), the parameter-server
transport's padding of Gather payloads (``gather_wire_bytes``) and its placement of
keys on servers (``KeyNumbers``, with the same work per key). Times are a model on top:
the equations, their assumptions and every constant's source are in
docs/COST_MODEL.md. Nothing here sends anything.
"""
import bisect
import re

import numpy as np

from . import chunking, pipeline
from .codecs.base import innermost
from .codecs.momentum import MomentumCorrected
from .transport.ps import KeyNumbers, gather_key_work, gather_wire_bytes, sum_key_work

KERNELS_SOURCE = 'bench/results/kernels.json'
CODEC_TIMES_SOURCE = 'bench/results/codec_times.json'
TRANSPORT_SOURCE = 'bench/results/transport_cpu.json'

# Seconds of one call of each kernel's MXNet operator (the 'op' path: the kernel plus
# MXNet's dispatch, best of its repetitions) at the element counts measured, from
# KERNELS_SOURCE (made by bench/kernels.py on an Intel Xeon, one thread; docs/KERNELS.md).
# A copy, not a read of that file: the installed package, where policy='auto' decides (from
# this same table on every worker: policy.py), has no bench/. tests/test_cost_model.py::
# test_kernel_table_is_the_results_file holds the copy equal to the file.
KERNEL_TIMES = {
    'fp32_decode': [(10000, 3.915e-05), (100000, 5.439e-05), (1000000, 0.0004296),
                    (10000000, 0.02685), (100000000, 0.2654)],
    'fp32_decode_add': [(10000, 3.32e-05), (100000, 4.475e-05), (1000000, 0.0006836),
                        (10000000, 0.006447), (100000000, 0.05808)],
    'topk_encode F=4608 5%': [(9216, 4.638e-05), (96768, 0.0001088), (999936, 0.00124),
                              (9999360, 0.01693), (99998208, 0.1611)],
    'topk_decode F=4608 5%': [(9216, 3.797e-05), (96768, 5.337e-05), (999936, 0.0003204),
                              (9999360, 0.02602), (99998208, 0.1985)],
    'topk_decode_add F=4608 5%': [(9216, 2.586e-05), (96768, 3.073e-05),
                                  (999936, 3.444e-05), (9999360, 0.0004553),
                                  (99998208, 0.003417)],
    'filter_scores F=4608': [(9216, 2.796e-05), (96768, 5.199e-05), (999936, 0.0005101),
                             (9999360, 0.005341), (99998208, 0.04345)],
    'topk_gather F=4608 5%': [(9216, 3.952e-05), (96768, 0.0001063), (999936, 0.001157),
                              (9999360, 0.01473), (99998208, 0.1265)],
    'topk_scatter F=4608 5%': [(9216, 5.466e-05), (96768, 5.217e-05), (999936, 0.0003602),
                               (9999360, 0.02781), (99998208, 0.1952)],
    'ternary_encode adaptive': [(10000, 6.363e-05), (100000, 0.0001273),
                                (1000000, 0.001903), (10000000, 0.0193),
                                (100000000, 0.1525)],
    'ternary_encode fixed t': [(10000, 4.905e-05), (100000, 0.0001144),
                               (1000000, 0.001806), (10000000, 0.01817),
                               (100000000, 0.1444)],
    'ternary_decode': [(10000, 4.608e-05), (100000, 0.000135), (1000000, 0.0009096),
                       (10000000, 0.03055), (100000000, 0.2378)],
    'ternary_decode_add': [(10000, 6.749e-05), (100000, 0.0002121), (1000000, 0.001365),
                           (10000000, 0.01465), (100000000, 0.112)],
    'ternary_encode_sum n=4': [(10000, 5.267e-05), (100000, 0.0001136),
                               (1000000, 0.001675), (10000000, 0.0187),
                               (100000000, 0.2046)],
    'ternary_decode_sum n=4': [(10000, 5.255e-05), (100000, 0.0001033),
                               (1000000, 0.0009967), (10000000, 0.03286),
                               (100000000, 0.2637)],
}

# Per codec class (``codec_class``: the class with its wrappers' names and its
# ``speed_params``), [(elements, worker seconds a step, servers' seconds per worker's
# payload)] sorted by elements, from CODEC_TIMES_SOURCE (made by bench/codec_times.py:
# cost_calibrate on a ladder of synthetic matrix and conv shapes, every registered scheme
# and mode at its defaults; one worker, one process, this project's machine). The speeds
# of codecs that kernels_of does not cover, so that a scheme added later is priced
# without code here. A copy, as KERNEL_TIMES (``python bench/codec_times.py --copy``
# rewrites it); tests/test_codec_table.py::test_codec_table_is_the_results_file holds it
# equal to the file.
CODEC_TIMES = {
    'AdaCompCodec[bin=500]': [(100000, 0.000538, 0.0006363), (300000, 0.0005416, 0.00068),
                              (1000000, 0.001512, 0.0006859)],
    'AdaCompCodec[bin=50]': [(110592, 0.0006738, 0.000634), (294912, 0.001344, 0.0006299),
                             (589824, 0.003206, 0.0006982), (786432, 0.003418, 0.0009866),
                             (1048576, 0.004625, 0.001439)],
    'ElementTopKCodec': [(100000, 0.000409, 0.000411), (110592, 0.0003995, 0.0004156),
                         (294912, 0.0005372, 0.000487), (300000, 0.0004817, 0.0004746),
                         (589824, 0.001042, 0.0005579), (786432, 0.001355, 0.0005963),
                         (1000000, 0.001422, 0.0005677), (1048576, 0.001741, 0.0007998)],
    'Float16Codec': [(100000, 0.0005259, 0.0), (110592, 0.000521, 0.0),
                     (294912, 0.0004134, 0.0), (300000, 0.0004275, 0.0),
                     (589824, 0.0009391, 0.0), (786432, 0.0008634, 0.0),
                     (1000000, 0.0007176, 0.0), (1048576, 0.001507, 0.0)],
    'Float16PairsCodec': [(100000, 0.001873, 0.0005573), (110592, 0.001479, 0.0006164),
                          (294912, 0.001603, 0.0006933), (300000, 0.001634, 0.0006497),
                          (589824, 0.002117, 0.001124), (786432, 0.002439, 0.001387),
                          (1000000, 0.002693, 0.001558), (1048576, 0.003501, 0.001395)],
    'PowerSGDCodec[rank=4]': [(9216, 0.001135, 0.0), (10000, 0.001075, 0.0),
                              (100000, 0.0007451, 0.0), (110592, 0.0007972, 0.0),
                              (294912, 0.001126, 0.0), (300000, 0.00109, 0.0),
                              (1000000, 0.003176, 0.0), (1179648, 0.003729, 0.0),
                              (2359296, 0.007957, 0.0), (3000000, 0.009764, 0.0),
                              (9437184, 0.05957, 0.0), (10000000, 0.06482, 0.0)],
    'ThcCodec': [(100000, 0.001256, 0.0), (110592, 0.001342, 0.0),
                 (294912, 0.002425, 0.0), (300000, 0.002026, 0.0),
                 (589824, 0.004361, 0.0), (786432, 0.005841, 0.0),
                 (1000000, 0.006688, 0.0), (1048576, 0.007749, 0.0)],
}

# CPU seconds that moving float32 keys costs a worker and a server, per key and per byte
# pushed + pulled (ps-lite/ZeroMQ copies, the kernel's TCP stack, the server's additions,
# MXNet's engine and Python per key), from TRANSPORT_SOURCE (made by
# kvstore_ext/transport_calibrate.py: a 1-worker, 1-server loopback job, not the
# validation sweep). A copy, as KERNEL_TIMES; tests/test_cost_model.py::
# test_transport_constants_are_the_results_file holds it equal to the file.
TRANSPORT_CPU = {'worker_s_per_key': 5.183e-05, 'worker_s_per_byte': 4.878e-10,
                 'server_s_per_key': 4.739e-05, 'server_s_per_byte': 6.965e-10}


class TransportCPU:
    """The CPU a node spends moving keys (docs/COST_MODEL.md, "Transport CPU"):
    seconds per key (one message each way) and per byte pushed + pulled, for a worker
    and for a server. All zero: the term is left out."""

    FIELDS = ('worker_s_per_key', 'worker_s_per_byte', 'server_s_per_key',
              'server_s_per_byte')

    def __init__(self, constants=None, source=TRANSPORT_SOURCE):
        constants = TRANSPORT_CPU if constants is None else constants
        for name in self.FIELDS:
            value = constants.get(name, 0.0)
            if not value >= 0:
                raise ValueError('transport constant %s must be >= 0, got %r'
                                 % (name, value))
            setattr(self, name, float(value))
        self.source = source

    def worker_seconds(self, keys, bytes_moved):
        """A worker's CPU seconds to push and pull ``keys`` keys of ``bytes_moved``
        bytes in all (its pushes + its pulls)."""
        return self.worker_s_per_key * keys + self.worker_s_per_byte * bytes_moved

    def server_seconds(self, messages, bytes_moved):
        """A server's CPU seconds for ``messages`` (keys x workers) of ``bytes_moved``
        bytes (every worker's pushes in + pulls out)."""
        return self.server_s_per_key * messages + self.server_s_per_byte * bytes_moved


# ---- units -------------------------------------------------------------------------------

_RATE_UNITS = {'bit': 1, 'kbit': 1e3, 'mbit': 1e6, 'gbit': 1e9, 'tbit': 1e12}
_TIME_UNITS = {'s': 1.0, 'ms': 1e-3, 'us': 1e-6, 'ns': 1e-9}


def parse_rate(text):
    """Bytes per second of a link rate such as '10Gbit', '100Mbit' or '2.5gbit/s'."""
    match = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)(?:/s|ps)?\s*',
                         str(text).lower())
    if not match or match.group(2) not in _RATE_UNITS:
        raise ValueError('link rate %r: expected a number and a unit (bit, kbit, Mbit, '
                         'Gbit), e.g. 10Gbit or 100Mbit' % (text,))
    rate = float(match.group(1)) * _RATE_UNITS[match.group(2)] / 8
    if rate <= 0:
        raise ValueError('link rate %r: must be above 0' % (text,))
    return rate


def parse_duration(text):
    """Seconds of a duration such as '0.2ms', '50us' or '1s' ('0' alone is 0)."""
    text = str(text).strip().lower()
    if text in ('0', '0.0'):
        return 0.0
    match = re.fullmatch(r'([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]+)', text)
    if not match or match.group(2) not in _TIME_UNITS:
        raise ValueError('duration %r: expected a number and a unit (s, ms, us), e.g. '
                         '0.2ms' % (text,))
    return float(match.group(1)) * _TIME_UNITS[match.group(2)]


class Link:
    """Every node (worker or server) has one full-duplex link of ``rate`` bytes/s; a
    message takes ``latency`` seconds one way (a round trip: 2 x latency)."""

    def __init__(self, rate, latency=0.0):
        if not rate > 0:
            raise ValueError('link rate must be above 0 bytes/s, got %r' % (rate,))
        if not latency >= 0:
            raise ValueError('latency must be >= 0 s, got %r' % (latency,))
        self.rate, self.latency = float(rate), float(latency)


# ---- codec time ------------------------------------------------------------------------------

def _interpolate(points, n):
    """Seconds at ``n`` elements from measured (elements, seconds), linear between
    points; below the first, the first (a call's fixed cost); above the last,
    proportional to the last."""
    sizes = [p[0] for p in points]
    if n <= sizes[0]:
        return points[0][1]
    if n >= sizes[-1]:
        return points[-1][1] * n / sizes[-1]
    i = bisect.bisect_right(sizes, n)
    (a, ta), (b, tb) = points[i - 1], points[i]
    return ta + (tb - ta) * (n - a) / (b - a)


def kernels_of(codec):
    """(worker kernels, server kernels per worker slot, server kernels once) a step of
    ``codec`` runs, as KERNEL_TIMES cases, each on the chunk's elements; None if
    KERNELS_SOURCE measured none of its kernels. () for float32 sent as it is (MXNet's
    own pushpull: no codec). DGC's momentum correction adds a pass over the velocity,
    timed as an add of one array into another."""
    if codec.passthrough:
        return (), (), ()
    velocity = ('fp32_decode_add',) if isinstance(codec, MomentumCorrected) else ()
    cases = innermost(codec).kernel_cases()
    if cases is None:
        return None
    worker, per_slot, once = cases
    return velocity + worker, per_slot, once


def codec_class(codec):
    """What the shipped codec table (CODEC_TIMES) files a codec's speed under: its class
    with its wrappers' names (``signature`` without the shape), each with the values of
    its class's ``speed_params``, e.g. 'PowerSGDCodec[rank=4]'."""
    names = []
    while True:
        params = ','.join('%s=%s' % (p, getattr(codec, p))
                          for p in getattr(type(codec), 'speed_params', ()))
        names.append(type(codec).__name__ + ('[%s]' % params if params else ''))
        if codec is innermost(codec):
            return '/'.join(names)
        codec = codec.inner


class KernelSpeeds:
    """Codec seconds from kernel timings ({case: [(elements, seconds)]}), by the
    kernels a codec runs (``kernels_of``); a codec they do not cover from the codec
    class table ({codec_class: [(elements, worker s, server s per worker)]},
    CODEC_TIMES), interpolated on its elements. Like MeasuredSpeeds, it carries the
    transport CPU constants (``transport``, a TransportCPU) the model prices keys with."""

    def __init__(self, times=None, source=None, transport=None, codec_times=None):
        self.times = KERNEL_TIMES if times is None else times
        self.codec_times = CODEC_TIMES if codec_times is None else codec_times
        self.source = source if source is not None else '%s; other codecs: %s' % (
            KERNELS_SOURCE, CODEC_TIMES_SOURCE)
        self.transport = TransportCPU() if transport is None else transport

    def seconds(self, case, elements):
        return _interpolate(self.times[case], elements)

    def codec_seconds(self, codec, workers):
        """(worker seconds, server seconds) of one step of ``codec`` (one chunk), or None
        if not measured."""
        kernels = kernels_of(codec)
        if kernels is None:
            rows = self.codec_times.get(codec_class(codec))
            if not rows:
                return None
            n = codec.size
            worker = _interpolate([(e, w) for e, w, _ in rows], n)
            per_slot = _interpolate([(e, s) for e, _, s in rows], n)
            return worker, workers * per_slot
        mine, per_slot, once = kernels
        n = codec.size
        worker = sum(self.seconds(k, n) for k in mine)
        server = workers * sum(self.seconds(k, n) for k in per_slot) + \
            sum(self.seconds(k, n) for k in once)
        return worker, server


def signature(codec):
    """What a codec's measurement is filed under: its class (with its wrappers' names)
    and shape."""
    names = []
    while codec is not innermost(codec):
        names.append(type(codec).__name__)
        codec = codec.inner
    return '%s%s' % ('/'.join(names + [type(codec).__name__]), tuple(codec.shape))


class MeasuredSpeeds:
    """Codec seconds measured on this machine (cost_calibrate): per codec (``signature``)
    the worker's seconds a step and the servers' seconds to decode one worker's
    payload; other codecs from ``fallback``."""

    def __init__(self, measured, fallback=None, source='calibrated on this machine',
                 transport=None):
        self.measured, self.fallback, self.source = dict(measured), fallback, source
        if transport is None:
            transport = fallback.transport if fallback is not None else TransportCPU()
        self.transport = transport

    def codec_seconds(self, codec, workers):
        if codec.passthrough:
            return 0.0, 0.0
        found = self.measured.get(signature(codec))
        if found is None:
            return self.fallback.codec_seconds(codec, workers) if self.fallback else None
        worker, per_slot = found
        return worker, workers * per_slot


# ---- bytes and rounds ------------------------------------------------------------------------

def tensor_rounds(codec, workers, chunk_size, padded=True):
    """[(stage, chunk, kind, bytes pushed, bytes pulled, server work)] of one worker's
    steady-state step of a tensor planned as ``codec``, in the order the transport makes
    their keys (stage by stage, chunk by chunk: rounds.drive). ``padded``: Gather payloads
    padded to whole rows, as the parameter-server transport sends them; False: as the
    one-process transport counts them."""
    rows = []
    for index, chunk in enumerate(chunking.split(codec, chunk_size)):
        for stage, (_, kind, up, down) in enumerate(chunk.codec.wire_words(workers)):
            if kind == 'gather':
                work = gather_key_work(workers, up, chunk.codec.size)
                up, down = gather_wire_bytes(up, down) if padded else (4 * up, 4 * down)
            else:
                work = sum_key_work(workers, up)
                up, down = 4 * up, 4 * down
            rows.append((stage, index, kind, up, down, work))
    return sorted(rows, key=lambda r: (r[0], r[1]))


class TensorCost:
    """What one tensor costs a worker a step (``cost``); seconds as if it were alone."""

    def __init__(self, bytes_push, bytes_pull, codec_seconds, server_seconds,
                 wire_seconds, rounds, alone_seconds=None):
        self.bytes_push, self.bytes_pull = bytes_push, bytes_pull
        self.codec_seconds, self.server_seconds = codec_seconds, server_seconds
        self.wire_seconds, self.rounds = wire_seconds, rounds
        # the tensor's keys alone through the links' pipeline (pipeline.py): a key's
        # pulls leave its server after its pushes are in
        self.alone_seconds = wire_seconds if alone_seconds is None else alone_seconds

    def __iter__(self):
        """(bytes_push, bytes_pull, codec_seconds, wire_seconds): unpack as a tuple."""
        return iter((self.bytes_push, self.bytes_pull, self.codec_seconds,
                     self.wire_seconds))

    def __repr__(self):
        return ('TensorCost(push=%d B, pull=%d B, codec=%s s, server=%s s, wire=%.3g s, '
                'rounds=%d)' % (self.bytes_push, self.bytes_pull, self.codec_seconds,
                                self.server_seconds, self.wire_seconds, self.rounds))


def _codec_seconds(codec, workers, speeds, chunk_size):
    """(worker, server, [server seconds per chunk]) summed over the codec's chunks, or
    None if ``speeds`` has no measurement for a chunk."""
    worker = server = 0.0
    per_chunk = []
    for chunk in chunking.split(codec, chunk_size):
        found = speeds.codec_seconds(chunk.codec, workers)
        if found is None:
            return None
        worker, server = worker + found[0], server + found[1]
        per_chunk.append(found[1])
    return worker, server, per_chunk


def cost(codec, workers, servers, link, speeds=None, chunk_size=1 << 20, padded=True):
    """The cost of one tensor, planned as ``codec`` (which knows the tensor's shape),
    to one worker in a step of ``workers`` workers and ``servers`` servers on ``link``:
    a TensorCost, which unpacks as (bytes_push, bytes_pull, codec_seconds,
    wire_seconds). ``codec_seconds`` (worker encode + decode) and ``server_seconds``
    (the servers' decoding) are None where ``speeds`` (default: KernelSpeeds()) has no
    measurement. ``wire_seconds`` is the tensor's share of a step's links: the busier
    link's bytes (its chunks spread over the servers as the transport places them), what
    a key adds to a pipeline of many keys; ``alone_seconds`` its time if it travelled
    alone (in, then out: pipeline.py)."""
    return step_cost({'tensor': codec}, workers, servers, link, 0.0, speeds,
                     chunk_size=chunk_size, padded=padded).tensors['tensor']


# ---- a step ------------------------------------------------------------------------------------

class StepCost:
    """A step of one worker: bytes, seconds and the terms of docs/COST_MODEL.md."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    @property
    def measured(self):
        """False if some compressed tensor's codec speed is unknown: the step's time is
        then not predicted (``step_seconds`` None)."""
        return self.codec_seconds is not None


# MXNet's own dist_sync cuts an array of more elements than this (its
# MXNET_KVSTORE_BIGARRAY_BOUND, default 10^6) evenly over all servers and places a smaller
# one whole on one server (src/kvstore/kvstore_dist.h, EncodeDefaultKey).
MXNET_BIGARRAY_BOUND = 1000 * 1000


def step_cost(codecs, workers, servers, link, compute_seconds, speeds=None, overlap=0.0,
              chunk_size=1 << 20, padded=True, spread_above=None, host_cores=None):
    """Predict one step. ``codecs``: {tensor name: codec}, in the order the worker pushes
    them (keys are placed on servers, and travel, in that order). ``overlap``: the
    fraction of the compute time that the wire time may hide behind (0: none).
    ``chunk_size``: the scheme's. ``padded``: bytes as the parameter-server transport
    sends them; False: as the one-process transport counts them (tensor_rounds).
    ``spread_above``: a tensor of more elements is spread evenly over all servers, as
    MXNet's own ``dist_sync`` does (MXNET_BIGARRAY_BOUND); None: every chunk is a key
    placed as kvstore_ext's transport places it. ``host_cores``: every node shares this
    many cores (the emulated cluster, not a real one): the communication of a step takes
    at least the CPU seconds of every node over the cores. See docs/COST_MODEL.md."""
    if workers < 1 or servers < 1:
        raise ValueError('workers and servers must be >= 1, got %r and %r'
                         % (workers, servers))
    if not 0 <= overlap <= 1:
        raise ValueError('overlap must be within [0, 1], got %r' % (overlap,))
    if compute_seconds < 0:
        raise ValueError('compute time must be >= 0 s, got %r' % (compute_seconds,))
    if host_cores is not None and not host_cores > 0:
        raise ValueError('host_cores must be above 0, got %r' % (host_cores,))
    speeds = KernelSpeeds() if speeds is None else speeds
    transport = speeds.transport
    keys = KeyNumbers(servers)
    server_in, server_out = [0] * servers, [0] * servers
    server_busy = [0.0] * servers
    server_messages = [0] * servers
    transfers = []              # every key of the step, in push order (pipeline.py)
    push = pull = 0
    codec_total, blocking = 0.0, 0
    unmeasured = []
    tensors = {}
    for name, codec in codecs.items():
        rounds = tensor_rounds(codec, workers, chunk_size, padded)
        seconds = _codec_seconds(codec, workers, speeds, chunk_size)
        if seconds is None:
            unmeasured.append(name)
        spread = spread_above is not None and int(np.prod(codec.shape)) > spread_above
        mine_in, mine_out = [0] * servers, [0] * servers
        mine = []               # this tensor's transfers; a stage waits for the one before
        stage_of = {}
        for stage, chunk, kind, up, down, work in rounds:
            server = keys.server_of(keys.new(work)[0])
            mine_in[server] += workers * up
            mine_out[server] += workers * down
            if seconds is not None and stage == len(codec.wire_words(workers)) - 1:
                server_busy[server] += seconds[2][chunk]
            parts = [(s, up / servers, down / servers) for s in range(servers)] \
                if spread else [(server, up, down)]
            for s, u, v in parts:
                stage_of.setdefault(stage, []).append(len(mine))
                mine.append((stage, s, u, v))
        if spread:
            mine_in = [sum(mine_in) / servers] * servers
            mine_out = [sum(mine_out) / servers] * servers
        alone, first = [], len(transfers)     # the step's index of this tensor's first
        for stage, s, u, v in mine:
            waits = stage_of.get(stage - 1, ())
            alone.append(pipeline.Transfer(s, u, v, waits, group=(name, stage)))
            transfers.append(pipeline.Transfer(s, u, v, [first + i for i in waits],
                                               (name, stage)))
            server_messages[s] += workers
        t_push = sum(r[3] for r in rounds)
        t_pull = sum(r[4] for r in rounds)
        stages = len({r[0] for r in rounds})
        push, pull = push + t_push, pull + t_pull
        for s in range(servers):
            server_in[s] += mine_in[s]
            server_out[s] += mine_out[s]
        blocking += stages - 1
        if seconds is not None:
            codec_total += seconds[0]
        tensors[name] = TensorCost(
            t_push, t_pull, None if seconds is None else seconds[0],
            None if seconds is None else seconds[1],
            _wire(t_push, t_pull, mine_in, mine_out, stages, link), stages,
            pipeline.makespan(alone, workers, servers, link.rate)
            + 2 * link.latency * stages)
    rounds = 1 + blocking if codecs else 0
    links = pipeline.makespan(transfers, workers, servers, link.rate)
    wire = links + 2 * link.latency * rounds
    worker_link = max(push, pull) / link.rate
    server_link = max(server_in + server_out) / link.rate
    worker_cpu = transport.worker_seconds(len(transfers), push + pull)
    server_cpu = [transport.server_seconds(m, i + o)
                  for m, i, o in zip(server_messages, server_in, server_out)]
    transport_seconds = max([worker_cpu] + server_cpu)
    measured = not unmeasured
    codec_seconds = codec_total if measured else None
    server_seconds = max(server_busy) if measured else None
    hidden = min(wire, overlap * compute_seconds)
    host = None
    step = None
    if measured:
        communication = codec_seconds + server_seconds + transport_seconds + wire - hidden
        if host_cores is not None:
            # every node's CPU of the step's communication, on the host's cores
            host = (workers * (codec_seconds + worker_cpu) + sum(server_busy)
                    + sum(server_cpu)) / host_cores
            communication = max(communication, host)
        step = compute_seconds + communication
    return StepCost(bytes_push=push, bytes_pull=pull, worker_link_seconds=worker_link,
                    server_link_seconds=server_link, pipeline_seconds=links,
                    rounds=rounds, wire_seconds=wire, codec_seconds=codec_seconds,
                    server_seconds=server_seconds, transport_seconds=transport_seconds,
                    host_seconds=host, hidden_seconds=hidden,
                    compute_seconds=compute_seconds, step_seconds=step,
                    unmeasured=unmeasured, tensors=tensors, codecs=codecs)


def _wire(push, pull, server_in, server_out, rounds, link):
    """A tensor's share of a step's links: max(worker link, busiest server link) + a
    round trip per blocking round. In a step of many keys a key adds about this (its
    in overlaps its neighbours' out): what a per-key choice (policy.py) compares."""
    busiest = max(list(server_in) + list(server_out))
    return max(push, pull, busiest) / link.rate + 2 * link.latency * rounds


# ---- schemes and their modes ---------------------------------------------------------------------

def variants(schemes):
    """[(label, scheme name, parameters)]: every registered scheme with its defaults,
    and each other aggregation mode a scheme offers (its 'aggregation' parameter's
    choices; with server aggregation, each 'pull')."""
    out = []
    for name in sorted(schemes):
        params = schemes[name].PARAMS
        out.append(('dist_sync_' + name, name, {}))
        aggregation = params.get('aggregation')
        for mode in (aggregation.choices if aggregation else ()):
            if mode == aggregation.default:
                continue
            pulls = params['pull'].choices if 'pull' in params else (None,)
            for pull in pulls:
                given = {'aggregation': mode}
                if pull is not None and pull != params['pull'].default:
                    given['pull'] = pull
                label = 'dist_sync_%s:%s' % (name, ','.join(
                    '%s=%s' % kv for kv in given.items()))
                try:
                    schemes[name](**given)
                except (TypeError, ValueError):     # a combination the scheme refuses
                    continue
                if all(label != o[0] for o in out):
                    out.append((label, name, given))
    return out


def scheme_step(scheme, shapes, workers, servers, link, compute_seconds, speeds=None,
                overlap=0.0, mxnet_dist_sync=False, host_cores=None):
    """step_cost of ``scheme`` planned for ``shapes``, cut at the scheme's own
    chunk_size. ``mxnet_dist_sync``: the scheme stands for MXNet's own dist_sync
    (NoCompression), whose big arrays are spread over every server. ``host_cores``:
    step_cost's (the emulated cluster's shared cores)."""
    return step_cost(plan(scheme, shapes, workers), workers, servers, link, compute_seconds,
                     speeds, overlap, chunk_size=scheme.params.get('chunk_size', 1 << 20),
                     spread_above=MXNET_BIGARRAY_BOUND if mxnet_dist_sync else None,
                     host_cores=host_cores)


def plan(scheme, shapes, workers):
    """{name: codec} the scheme plans for ``shapes`` ({name: shape}, in push order) at
    ``workers`` workers, at a key's first step, as the store asks (codec_for_key).
    With the defaults' warm-ups (none) that is also the steady state."""
    # dAD's own codecs need the Dense layers' captured rows, which a list of shapes does
    # not have (their size depends on the batch): it is modelled as its fallback scheme
    scheme = getattr(scheme, 'fallback', scheme)
    scheme.num_workers = workers
    return {name: scheme.codec_for_key(name, tuple(shape), np.float32, step=0)
            for name, shape in shapes.items()}
