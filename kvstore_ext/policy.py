"""policy='auto': per key, send it as it is (float32) or compressed, whichever the cost
model predicts faster at the job's link rate.

Why: on a fast link a codec's encode and decode take longer than the bytes it saves
(Agarwal et al., MLSys 2022; docs/COST_MODEL.md), on a slow link the bytes win. The
answer differs per tensor (a small conv layer pays the codec's fixed cost per call, a
large FC layer saves megabytes), so it is made per key, when the key is planned.

The rule (``compresses``): for the key's codec ``c`` and float32 ``r`` of the same
shape, at ``workers`` workers, ``servers`` servers and link rate ``B`` (``cost.cost``,
each tensor as if it travelled alone):

    compressed  iff  codec(c) + servers(c) + wire(c, B, a)  <  wire(r, B, a)

``codec``: the worker's encode and decode; ``servers``: the servers' decoding in
server mode (0 for homomorphic keys, whose servers only add); ``wire``: the busier of
the worker's and the servers' links, bytes each way, plus ``a`` a round. Both choices
pay one round; a codec that agrees by a round of its own (Hylo's conv layers with
``agreement='conv_round'``, which ``'auto'`` takes at 8 workers) pays ``a`` again.
``a``: the seconds of a round with no bytes, the intercept of the measured rate's fit
(below), agreed as the rate is; 0 with a given ``link_rate`` (no round is timed).
Why: at 8 workers on the emulated cluster a round took 5-20 ms (the workers' fits), more
than the wire time a conv layer saves at an unshaped link (docs/COST_MODEL.md). Assumed as
docs/COST_MODEL.md states: nothing overlaps (codec time adds to the wire time; a key's
communication does not hide behind compute), a codec whose speed is not known is kept
compressed (the scheme's own choice).

What the rule cannot price (a compressed key's waits in the engine, the float32 transfer
that hid behind the backward pass) the job's own step times see: the rule's plan, every
key float32 and every key compressed are each run for a few steps, and the fastest stays
(plan_trial.py, ``trial_steps``).

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
seconds) and agreed by one Sum round (``agree_rate``: the mean of the workers' rates,
and of their fits' round seconds ``a``),
through the scheme's re-plan path (``Scheme.settle``); until then a key goes float32.

The rule prices bytes at the link's rate (a round's seconds apart, in ``a``),
so the meter must measure the link, not the round trips nor the workers' share of it.
Two things stand between a round's seconds and the link:

* **The round's bytes are not the link's.** A worker pushes and pulls ``b`` bytes, but
  the server's link takes every worker's push, then sends every worker's pull: the
  cost model's one key alone (``cost.cost(...).alone_seconds`` at 1 byte/s). So each
  round is filed under those link bytes (``round_link_bytes``), and the fitted slope
  is the rate the model's links have: with each worker's bytes, 2 workers and 1 server
  read about half the link.
* **Small keys are round trips, and some rounds wait.** Total bytes over total seconds
  is an effective rate far below the link's (at fast links several times), which made
  compressing look good on paper. ``fit_rate`` fits seconds = a + bytes / B: the small
  rounds fix the latency a, the large ones the slope. Delays only add (a key's first
  round may wait for the other workers, a first large message for buffers), so of
  rounds of one size the fastest is used, and the line is Theil-Sen's (the median of
  the pairwise slopes, then the median intercept): one late round of the largest size
  (measured: 104 ms where its neighbours took 3) would tilt a least-squares line by
  its leverage, not a median. A line that cannot be trusted (one size only, a slope or
  a latency that is not positive) falls back to the bytes-weighted rate through the
  origin, sum(b^2) / sum(b * s): a lower bound of the link, led by the largest rounds.

The fit, its rounds and the plain bytes over seconds beside it are reported with the
decisions (policy_report.py: one log line on rank 0, ``kv.policy_decisions()``).
"""
import os
import time

import numpy as np

# The agreed rate is measured again this often (steps); a key is re-planned when the
# newly agreed rate differs by more than RATE_CHANGE times from the one its plan used.
REMEASURE_STEPS = 100
RATE_CHANGE = 2.0
# ... if the rounds it was measured on carried at least this share of the link bytes of
# the rounds the agreed rate came from. Under a compressed plan only the small float32
# keys are timed: latency-bound rounds whose rate is noise (measured on the emulated
# cluster at 1 Gbit/s: 4.2 Gbit/s from the resnet-like net's biases and BatchNorm
# parameters, which re-planned the keys and started the plans' trial again).
RATE_EVIDENCE = 0.25


def servers():
    """Servers of this job: the launcher gives every worker the same DMLC_NUM_SERVER."""
    return max(int(os.environ.get('DMLC_NUM_SERVER', '1')), 1)


def compresses(codec, workers, servers, rate_bits, chunk_size=1 << 20, speeds=None,
               round_s=0.0, float32_wire=None):
    """True if ``codec`` (compressing) is predicted faster than float32 for its tensor
    at ``rate_bits`` bits/s (module docstring). ``speeds``: the codec seconds the
    workers agreed on (codec_timing.py); None: the shipped table. ``round_s``: the
    seconds of a round with no bytes (the module docstring's ``a``). ``float32_wire``:
    the tensor's ``float32_wire_seconds`` if the caller has them already."""
    from . import cost
    if codec.passthrough:
        return False
    link = cost.Link(rate_bits / 8.0, round_s / 2.0)     # one way: half a round
    if speeds is None:
        speeds = cost.KernelSpeeds()        # the shipped table, the same on every host
    packed = cost.cost(codec, workers, servers, link, speeds, chunk_size)
    if packed.codec_seconds is None:
        return True
    if float32_wire is None:
        float32_wire = float32_wire_seconds(codec.shape, workers, servers, rate_bits,
                                            chunk_size, round_s)
    return (packed.codec_seconds + packed.server_seconds + packed.wire_seconds
            < float32_wire)


def float32_wire_seconds(shape, workers, servers, rate_bits, chunk_size=1 << 20,
                         round_s=0.0):
    """The seconds a float32 tensor of ``shape`` takes on the busiest link at
    ``rate_bits`` (the cost model's wire share): a step that sends it float32 takes at
    least the sum of these over its keys, however it overlaps with compute."""
    from . import cost
    from .codecs import FP32Codec
    link = cost.Link(rate_bits / 8.0, round_s / 2.0)
    return cost.cost(FP32Codec(shape), workers, servers, link, cost.KernelSpeeds(),
                     chunk_size).wire_seconds


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
    link bytes over total seconds of the same rounds (no line: kept to compare);
    ``points``: the [bytes, seconds] of the rounds, to check the fit against."""

    def __init__(self, rate_bits, latency_s, method, rounds, mean_bits, points=()):
        self.rate_bits, self.latency_s, self.method = rate_bits, latency_s, method
        self.rounds, self.mean_bits = rounds, mean_bits
        self.points = [[int(b), float(t)] for b, t in points]

    def as_dict(self):
        return {'rate_bits': self.rate_bits, 'latency_s': self.latency_s,
                'method': self.method, 'rounds': self.rounds, 'mean_bits': self.mean_bits,
                'points': self.points}


def theil_sen(x, y):
    """(slope, intercept) of the line through (x, y) that one far point cannot move: the
    median of the slopes between every two points, then the median of y - slope * x."""
    i, j = np.triu_indices(len(x), 1)
    slope = float(np.median((y[j] - y[i]) / (x[j] - x[i])))
    return slope, float(np.median(y - slope * x))


def fit_rate(points):
    """The link's rate from timed rounds ``points`` [(link bytes, seconds)] (module
    docstring): the fastest round of each size, a Theil-Sen line seconds = a + bytes / B
    through them; if the line is degenerate (fewer than two sizes, a slope or an
    intercept that is not positive), the bytes-weighted rate through the origin,
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
        slope, intercept = theil_sen(x, y)
        if slope > 0 and intercept >= 0:
            return RateFit(8.0 / slope, float(intercept), 'line', len(points), mean_bits,
                           points)
    weighted = 8.0 * float(np.sum(x * x) / np.sum(x * y))
    return RateFit(weighted, None, 'bytes-weighted', len(points), mean_bits, points)


def round_link_bytes(shape, workers, servers, chunk_size, pulls=None):
    """The bytes a round of a float32 tensor of ``shape`` puts through the busier of a
    server's links, in (every worker's push) then out (every puller's pull), as the cost
    model's key alone (``alone_seconds`` at 1 byte/s). ``pulls``: how many workers pull
    (a broadcast: rank 0 pushes, every worker pulls); default every worker pushes and
    pulls."""
    from . import cost
    from .codecs import FP32Codec
    unit = cost.Link(1.0)
    both = cost.cost(FP32Codec(shape), workers, servers, unit, cost.KernelSpeeds(),
                     chunk_size).alone_seconds
    if pulls is None:
        return both
    one = cost.cost(FP32Codec(shape), 1, servers, unit, cost.KernelSpeeds(),
                    chunk_size).alone_seconds        # one push in, one pull out
    return one / 2 * (1 + pulls)


class LinkMeter:
    """This worker's measured link rate: the (link bytes, seconds) of rounds it timed
    (``round_link_bytes``)."""

    def __init__(self):
        self.points = []
        self.last = None        # the RateFit of the last rate_bits() (reports)

    def add(self, nbytes, seconds):
        self.points.append((nbytes, seconds))

    def link_bytes(self):
        """The link bytes of the rounds timed so far."""
        return float(sum(b for b, _ in self.points))

    def rate_bits(self):
        """Bits/s measured so far (``fit_rate``; 0 if nothing was timed)."""
        self.last = fit_rate(self.points)
        return self.last.rate_bits

    def restart(self):
        self.points = []


def agree_rate(meter, workers, share):
    """One Sum round: (the mean of the workers' measured rates in bits/s, the mean of
    their fits' round seconds, the mean of the link bytes they timed), the same numbers
    on every worker. A worker that timed nothing contributes 0 and is not counted; a
    worker whose fit has no line (no intercept) is not counted in the round seconds."""
    from mxnet import ndarray
    mine = meter.rate_bits()
    latency = meter.last.latency_s if mine > 0 else None
    timed = latency is not None and latency > 0
    total = share(ndarray.array([mine / 1e6, 1.0 if mine > 0 else 0.0,
                                 1e3 * latency if timed else 0.0, 1.0 if timed else 0.0,
                                 meter.link_bytes() / 1e6 if mine > 0 else 0.0],
                                dtype=np.float32)).asnumpy()
    counted, lines = float(total[1]), float(total[3])
    rate = 1e6 * float(total[0]) / counted if counted > 0 else 0.0
    link_bytes = 1e6 * float(total[4]) / counted if counted > 0 else 0.0
    return rate, (1e-3 * float(total[2]) / lines if lines > 0 else 0.0), link_bytes


def adopts(agreed_rate, agreed_bytes, rate, link_bytes):
    """True if a newly agreed ``rate`` (from rounds of ``link_bytes``) replaces the
    agreed one (from rounds of ``agreed_bytes``): the first one, or one that moved by
    more than RATE_CHANGE times on at least RATE_EVIDENCE of the bytes."""
    if rate <= 0:
        return False
    return agreed_rate <= 0 or (changed(agreed_rate, rate)
                                and link_bytes >= RATE_EVIDENCE * agreed_bytes)


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
    value.wait_to_read()        # the clock times the round, not what computes the value
    start = time.perf_counter()
    out = store._transport.broadcast(key, value)
    out.wait_to_read()
    seconds = time.perf_counter() - start
    meter.add(round_link_bytes(value.shape, store.num_workers, servers(),
                               store._scheme.params['chunk_size'], pulls=store.num_workers)
              * np.dtype(value.dtype).itemsize / 4, seconds)
    return out


def pushpull_plain(store, state, values, outs, step):
    """``store._transport.pushpull_plain`` of a key sent as it is: (bytes pushed,
    pulled), timed until its sum is in ``outs`` when the scheme measures the link."""
    meter = _meter(store, step)
    if meter is None:
        return store._transport.pushpull_plain(state.key, state.chunks, values, outs)
    for v in values:            # the clock times the round, not the backward pass
        v.wait_to_read()
    start = time.perf_counter()
    pushed, pulled = store._transport.pushpull_plain(state.key, state.chunks, values, outs)
    for o in outs:
        o.wait_to_read()
    seconds = time.perf_counter() - start
    meter.add(round_link_bytes(values[0].shape, store.num_workers, servers(),
                               store._scheme.params['chunk_size'])
              * np.dtype(values[0].dtype).itemsize / 4, seconds)
    return pushed, pulled
