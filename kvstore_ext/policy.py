"""policy='auto': per key, send it as it is (float32) or compressed, whichever the cost
model predicts faster at the job's link rate.

Why: on a fast link a codec's encode and decode take longer than the bytes it saves
(Agarwal et al., MLSys 2022; docs/COST_MODEL.md), on a slow link the bytes win. The
answer differs per tensor (a small conv layer pays the codec's fixed cost per call, a
large FC layer saves megabytes), so it is made per key, when the key is planned.

The rule (``compresses``): for the key's codec ``c`` and float32 ``r`` of the same
shape, at ``workers`` workers, ``servers`` servers and link rate ``B`` (``cost.cost``,
each tensor as if it travelled alone, no latency):

    compressed  iff  codec(c) + servers(c) + wire(c, B)  <  wire(r, B)

``codec``: the worker's encode and decode; ``servers``: the servers' decoding in
server mode (0 for homomorphic keys, whose servers only add); ``wire``: the busier of
the worker's and the servers' links, bytes each way. Assumed as docs/COST_MODEL.md
states: nothing overlaps (codec time adds to the wire time; a key's communication
does not hide behind compute), no latency (both choices pay a round trip; an agreement
round's extra one is left out), a codec whose speed is not known is kept compressed
(the scheme's own choice).

Every worker must decide the same, or the workers would push different codecs under
one key (a hang or garbage). The inputs are: the shape, the scheme's parameters (held
equal by fingerprint.py), the workers, the servers (``DMLC_NUM_SERVER``, the same on
every worker by the launcher), the codecs' seconds and the rate.

The codecs' seconds (``codec_times``): 'measured' (the default): at step 1 each worker
times the codecs it was asked about at step 0, on their shapes, and one Sum round gives
every worker the slowest worker's seconds (codec_timing.py), whose keys are then
re-planned; the shipped table (``cost.KERNEL_TIMES``: another CPU, one thread, alone)
under-prices them where workers and servers share the cores, which made 'auto' compress
at fast links where float32 was faster. They are timed once: if the load changes later
(another job on the cores), the decisions keep the step-1 seconds, and a re-measured
rate re-plans with them. 'shipped': the table, the same on every host, no round.

The rate: a given ``link_rate`` is a parameter, so equal everywhere; with a given rate,
step 0 decides by the shipped table and step 1 by the measured seconds. With
``link_rate=0`` the rate is measured on each worker (``LinkMeter``: the init/broadcast
rounds every worker runs and the first step's float32 keys, each round's bytes and
seconds) and agreed by one Sum round (``agree_rate``: the mean of the workers' rates),
through the scheme's re-plan path (``Scheme.settle``); until then a key goes float32.

The rule prices bytes at the link's rate (latency left out, as both choices pay it),
so the meter must measure the link, not the round trips. A model's keys are mostly
small (biases, norms, small convs): each of their rounds is a round trip and a few
bytes, so total bytes over total seconds was an effective rate far below the link's
(at fast links several times), and compressing looked good on paper. ``fit_rate``
fits seconds = a + bytes / B over the rounds (least squares): the small rounds fix the
latency a, the large ones the slope, and B is the link's rate. Delays only add (a
key's first round may wait for the backward pass or the other workers), so of rounds of
one size the fastest is used. A line that cannot be trusted (one size only, a slope or
a latency that is not positive: noise, or no round large enough to see the link) falls
back to the bytes-weighted rate through the origin, sum(b^2) / sum(b * s), which the
largest rounds lead: still a lower bound of the link, not dominated by the small keys.
The fit, and the former bytes over seconds beside it, are reported with the decisions
(policy_report.py: one log line on rank 0, ``kv.policy_decisions()``).
"""
import os
import time

import numpy as np

# The agreed rate is measured again this often (steps); a key is re-planned when the
# newly agreed rate differs by more than RATE_CHANGE times from the one its plan used.
REMEASURE_STEPS = 100
RATE_CHANGE = 2.0


def servers():
    """Servers of this job: the launcher gives every worker the same DMLC_NUM_SERVER."""
    return max(int(os.environ.get('DMLC_NUM_SERVER', '1')), 1)


def compresses(codec, workers, servers, rate_bits, chunk_size=1 << 20, speeds=None):
    """True if ``codec`` (compressing) is predicted faster than float32 for its tensor
    at ``rate_bits`` bits/s (module docstring). ``speeds``: the codec seconds the
    workers agreed on (codec_timing.py); None: the shipped table."""
    from . import cost
    from .codecs import FP32Codec
    if codec.passthrough:
        return False
    link = cost.Link(rate_bits / 8.0)
    if speeds is None:
        speeds = cost.KernelSpeeds()        # the shipped table, the same on every host
    packed = cost.cost(codec, workers, servers, link, speeds, chunk_size)
    if packed.codec_seconds is None:
        return True
    raw = cost.cost(FP32Codec(codec.shape), workers, servers, link, speeds, chunk_size)
    return (packed.codec_seconds + packed.server_seconds + packed.wire_seconds
            < raw.wire_seconds)


def crossover(codec, workers, servers, chunk_size=1 << 20):
    """The link rate (bits/s) below which ``codec`` is predicted faster than float32
    (inf if always, 0 if never): raw wire = codec + compressed wire, solved for B."""
    from . import cost
    from .codecs import FP32Codec
    link = cost.Link(1.0)                   # 1 byte/s: wire seconds = busiest bytes
    packed = cost.cost(codec, workers, servers, link, cost.KernelSpeeds(), chunk_size)
    if packed.codec_seconds is None:
        return float('inf')
    raw = cost.cost(FP32Codec(codec.shape), workers, servers, link, None, chunk_size)
    saved = raw.wire_seconds - packed.wire_seconds     # bytes saved on the busiest link
    spent = packed.codec_seconds + packed.server_seconds
    if saved <= 0:
        return 0.0
    return float('inf') if spent <= 0 else 8.0 * saved / spent


class RateFit:
    """What ``fit_rate`` found: ``rate_bits`` (bits/s, 0 if nothing was timed), the
    line's ``latency_s`` (its intercept; None when no line was fitted), ``method``
    ('line', 'bytes-weighted' or 'none'), the ``rounds`` timed and ``mean_bits``: total
    bytes over total seconds of the same rounds (the former estimator, kept to compare)."""

    def __init__(self, rate_bits, latency_s, method, rounds, mean_bits):
        self.rate_bits, self.latency_s, self.method = rate_bits, latency_s, method
        self.rounds, self.mean_bits = rounds, mean_bits

    def as_dict(self):
        return {'rate_bits': self.rate_bits, 'latency_s': self.latency_s,
                'method': self.method, 'rounds': self.rounds, 'mean_bits': self.mean_bits}


def fit_rate(points):
    """The link's rate from timed rounds ``points`` [(bytes, seconds)] (module docstring,
    "The rate"): the fastest round of each size, a least-squares line seconds = a +
    bytes / B through them; if the line is degenerate (fewer than two sizes, a slope or
    an intercept that is not positive), the bytes-weighted rate through the origin,
    sum(bytes^2) / sum(bytes * seconds)."""
    points = [(float(b), float(s)) for b, s in points if b > 0 and s > 0]
    if not points:
        return RateFit(0.0, None, 'none', 0, 0.0)
    mean_bits = 8.0 * sum(b for b, _ in points) / sum(s for _, s in points)
    fastest = {}
    for b, s in points:         # delays only add: a size's fastest round is its closest
        fastest[b] = min(s, fastest.get(b, s))
    x = np.array(sorted(fastest), dtype=np.float64)
    y = np.array([fastest[b] for b in x], dtype=np.float64)
    if len(x) >= 2:
        slope, intercept = np.polyfit(x, y, 1)
        if slope > 0 and intercept >= 0:
            return RateFit(8.0 / slope, float(intercept), 'line', len(points), mean_bits)
    weighted = 8.0 * float(np.sum(x * x) / np.sum(x * y))
    return RateFit(weighted, None, 'bytes-weighted', len(points), mean_bits)


class LinkMeter:
    """This worker's measured link rate: the (bytes, seconds) of rounds it timed."""

    def __init__(self):
        self.points = []
        self.last = None        # the RateFit of the last rate_bits() (reports)

    def add(self, nbytes, seconds):
        self.points.append((nbytes, seconds))

    def rate_bits(self):
        """Bits/s measured so far (``fit_rate``; 0 if nothing was timed)."""
        self.last = fit_rate(self.points)
        return self.last.rate_bits

    def restart(self):
        self.points = []


def agree_rate(meter, workers, share):
    """One Sum round: the mean of the workers' measured rates (bits/s), the same number
    on every worker. A worker that timed nothing contributes 0 and is not counted."""
    from mxnet import ndarray
    mine = meter.rate_bits()
    total = share(ndarray.array([mine / 1e6, 1.0 if mine > 0 else 0.0],
                                dtype=np.float32)).asnumpy()
    counted = float(total[1])
    return 1e6 * float(total[0]) / counted if counted > 0 else 0.0


def changed(old, new):
    """True if the agreed rate moved by more than RATE_CHANGE times."""
    if old <= 0 or new <= 0:
        return old != new
    return max(old / new, new / old) > RATE_CHANGE


# ---- the store's rounds, timed while the scheme measures the link ----------------------

def _meter(store, step):
    scheme = store._scheme
    return scheme.link_meter if scheme.measures_link(step) else None


def broadcast(store, key, value):
    """``store._transport.broadcast`` (init, broadcast): rank 0's value, timed until it
    is here when the scheme measures the link (2 x its bytes: pushed by rank 0, pulled
    by every worker)."""
    meter = _meter(store, 0)
    if meter is None:
        return store._transport.broadcast(key, value)
    start = time.perf_counter()
    out = store._transport.broadcast(key, value)
    out.wait_to_read()
    meter.add(2 * value.size * np.dtype(value.dtype).itemsize, time.perf_counter() - start)
    return out


def pushpull_plain(store, state, values, outs, step):
    """``store._transport.pushpull_plain`` of a key sent as it is: (bytes pushed,
    pulled), timed until its sum is in ``outs`` when the scheme measures the link."""
    meter = _meter(store, step)
    if meter is None:
        return store._transport.pushpull_plain(state.key, state.chunks, values, outs)
    start = time.perf_counter()
    pushed, pulled = store._transport.pushpull_plain(state.key, state.chunks, values, outs)
    for o in outs:
        o.wait_to_read()
    meter.add(pushed + pulled, time.perf_counter() - start)
    return pushed, pulled
