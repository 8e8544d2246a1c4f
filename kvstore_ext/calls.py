"""The list forms of MXNet's kvstore calls, answered as MXNet answers them or refused.

* Lists of keys, values and outs must have equal lengths: MXNet's own stores assert
  it; a ``zip`` would silently skip the extra keys.
* A key repeated in one ``pushpull`` list: MXNet's ``local`` and ``dist_sync`` both
  group a call's pairs by key (``GroupKVPairsPush``/``Pull`` in kvstore_local.h) and
  run one round per key on the sum of all its values, and every out of the key gets
  that sum. We do the same: a key's values (and outs) from every position are merged
  into one round, as a key's device copies are. It is exact (the round sums them
  as it sums devices) and costs nothing for lists without repeats. Running a round per
  occurrence instead would give each out a different partial sum and push the key
  twice in one step.
"""


def as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def check_lengths(call, keys, **lists):
    """Raise ValueError unless every list in ``lists`` has one entry per key."""
    for what, values in lists.items():
        if values is not None and len(as_list(values)) != len(keys):
            raise ValueError('%s: %d keys but %d %s: give one per key'
                             % (call, len(keys), len(as_list(values)), what))


def pairs(call, keys, values, what):
    """(key, value) pairs of a list of keys (``init``, ``push``, ``pull``), refused
    unless there is one value per key."""
    check_lengths(call, keys, **{what: values})
    return zip(keys, as_list(values))


def pushpull_rounds(keys, values, outs, check_key):
    """[(key, values, outs)], one per distinct key in first-seen order: a repeated
    key's values and outs merged (MXNet's grouping). ``outs`` None: in place."""
    check_lengths('pushpull', keys, values=values, outs=outs)
    rounds = {}
    for i, key in enumerate(keys):
        check_key(key)
        value = values[i]
        out = value if outs is None else outs[i]
        vs, os_ = rounds.setdefault(key, ([], []))
        vs.extend(as_list(value))
        os_.extend(as_list(out))
    return [(key, vs, os_) for key, (vs, os_) in rounds.items()]
