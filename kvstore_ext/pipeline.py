"""The links' time of a step as a pipeline of keys: a small flow-shop computation.

Why: a server cannot send a key's sum before every worker's push of that key has
arrived, so for one key its link carries the pushes in, then the pulls out, one after
the other. With many keys this hardly matters (the next key's pushes come in while
this key's sum goes out, and the busier direction sets the time: the cost model's
former ``max(I_s, O_s) / B``), but with one dominant key (VGG's first Dense layer is
88% of its gradient) in and out follow each other: ``(I_s + O_s) / B``. Measured on
the emulated cluster, the step followed the second for such a model and the first for
a model of many keys of similar size (docs/COST_MODEL.md, "Validation"). Computing the
pipeline key by key covers both, and everything between, without a parameter.

The model (every worker identical, so one worker stands for all; every node has its
own full-duplex link of ``rate`` bytes/s; no latency here: cost.py adds round trips).
Four kinds of link direction, each a serial machine that carries one transfer after
the other in the order the keys are pushed:

* the worker's uplink: key ``k``'s push of ``u_k`` bytes takes ``u_k / B``;
* server ``s``'s downlink: the ``W`` workers' pushes of ``k``, ``W u_k / B``;
* server ``s``'s uplink: the ``W`` workers' pulls of ``k``, ``W v_k / B``, which
  start only once every push of ``k`` is in (its sum exists only then);
* the worker's downlink: the pull of ``v_k`` bytes, ``v_k / B``.

A transfer crosses two links at once (TCP streams, not store-and-forward): it starts
on the second link no earlier than on the first, and it is done when both have carried
it. The worker pushes a group of keys (the chunks of a tensor's round: rounds.drive
pushes them all before it pulls any, and for float32 chunks MXNet's engine runs the
next chunk's push while a pull waits for its push's reply; the slices of one of MXNet's
big arrays), then asks for their pulls: a request travels behind the group's pushes on
the worker's connection, so a server starts sending a key of the group only once it has
every push of the group that goes to it. Measured: VGG's first Dense layer cut into two chunks on
one server took in + out of the whole layer, not of one chunk. A key of a later round
of a tensor (an agreement round, PowerSGD's Q) is pushed only after the earlier round's
pull is done: the worker needs its result to encode.

Limits (tests/test_cost_model.py): one key gives ``(I_s + O_s) / B`` at one server;
many small keys give ``max(P, Q, I_s, O_s) / B``; never less than the latter.
"""


class Transfer:
    """One key of a step: ``server`` it lives on, ``push`` and ``pull`` bytes of one
    worker, the indices of earlier transfers whose pulls it waits for, and its
    ``group``: the keys the worker pushes together before it pulls any (the chunks of
    one tensor's round: rounds.drive; the slices of one of MXNet's big arrays); None:
    a group of its own."""

    __slots__ = ('server', 'push', 'pull', 'waits_for', 'group')

    def __init__(self, server, push, pull, waits_for=(), group=None):
        self.server, self.push, self.pull = int(server), float(push), float(pull)
        self.waits_for, self.group = tuple(waits_for), group


def _groups(transfers):
    """[[index, ...]] of consecutive transfers of one group, in order."""
    out = []
    for i, t in enumerate(transfers):
        if out and t.group is not None and transfers[out[-1][0]].group == t.group:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def makespan(transfers, workers, servers, rate):
    """Seconds from the first push until the last pull is done, for ``transfers`` in
    the order the worker pushes them (module docstring)."""
    up = down = 0.0                             # the worker's link, each direction
    server_in, server_out = [0.0] * servers, [0.0] * servers
    done = [0.0] * len(transfers)               # each transfer's pull done
    for group in _groups(transfers):
        pushed, arrived = {}, {}
        for i in group:                         # every push of the group first
            t = transfers[i]
            release = max([done[j] for j in t.waits_for], default=0.0)
            start = max(up, release)
            up = start + t.push / rate
            server_in[t.server] = max(server_in[t.server], start) + \
                workers * t.push / rate
            pushed[i] = up
            arrived[i] = max(up, server_in[t.server])   # every worker's push is in
        # then the pulls: a pull request follows the group's pushes on the worker's
        # connection, so it reaches a server once that server has the group's pushes
        asked = {}
        for i in group:
            s = transfers[i].server
            asked[s] = max(asked.get(s, up), arrived[i])
        for i in group:
            t = transfers[i]
            out_start = max(server_out[t.server], arrived[i], asked[t.server])
            server_out[t.server] = out_start + workers * t.pull / rate
            down = max(down, out_start) + t.pull / rate
            done[i] = max(down, server_out[t.server])
    return max(done, default=0.0)
