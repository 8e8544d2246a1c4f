"""policy='auto' made observable: the link rate its plans use and what it chose per key,
as one log line on rank 0 when it has decided, and as a dict for a run's summary.

Why: 'auto' decides per key from a rate the workers measure and agree on
(policy.py), and a job that compressed every key could not say whether the codecs
looked cheap or the agreed rate low: the rate was not recorded anywhere. The summary
(``kv.policy_decisions()``, written by the training scripts' ``--summary-json`` and by
bench/cluster_worker.py) carries the agreed rate, this worker's own fit of it (the
rounds, the line's latency, and the former estimator's bytes over seconds beside it)
and the choice of every key; the log line says the same in brief, so that a user sees
what 'auto' did without asking.

When the line is written: decisions are made key by key as each key reaches the step
the policy (re-)plans at (the first step with a given rate and the shipped table, else
step 1, then every re-measure); every worker pushes its keys in the same order, so the
first key of the next step finds them all made. The line is written there, on rank 0,
once, and again only if a later re-plan changed the rate or a choice.
"""
import logging

log = logging.getLogger('kvstore_ext')

SHOWN_KEYS = 20         # compressed keys named on the log line; the summary has all


def _auto(scheme):
    return getattr(scheme, 'params', {}).get('policy') == 'auto'


def decisions(store):
    """{'rate_bits' (what the plans use, 0: not agreed yet), 'rate_source' ('given',
    'measured' or 'not agreed'), 'round_s' (the agreed seconds of a round with no bytes
    the plans use, 0 with a given rate), 'link_rate_given', 'codec_times', 'rate_fit' (this
    worker's own policy.RateFit as a dict, None without a measured rate),
    'codec_timing_s' (the seconds this worker spent timing the codecs and agreeing on
    their times, once a job; None if it did not: codec_timing.py), 'trial' (the trial of
    the plans in the job: plan_trial.PlanTrial.as_dict, None before it began),
    'compressed': {key as str: bool} of the keys planned so far}; None unless the
    store's scheme runs policy='auto'."""
    scheme = store.scheme
    if not _auto(scheme):
        return None
    given = float(scheme.params['link_rate'])
    agreed = float(scheme.agreed_rate)
    fit = scheme.link_meter.last if scheme.link_meter is not None else None
    return {'rate_bits': given or agreed,
            'rate_source': 'given' if given else ('measured' if agreed > 0 else 'not agreed'),
            'round_s': float(scheme.agreed_round_s),
            'link_rate_given': given, 'codec_times': scheme.params['codec_times'],
            'rate_fit': fit.as_dict() if fit is not None else None,
            'codec_timing_s': scheme.codec_timing_s,
            'trial': scheme.trial.as_dict() if scheme.trial is not None else None,
            'compressed': {str(k): not s.codec.passthrough
                           for k, s in store._keys.items() if s.codec is not None}}


def line(found):
    """The log line of ``decisions``."""
    compressed = [k for k, v in found['compressed'].items() if v]
    names = ', '.join(compressed[:SHOWN_KEYS]) + (', ...' if compressed[SHOWN_KEYS:] else '')
    fit = found['rate_fit']
    how = found['rate_source']
    if fit is not None:
        how += ' (rank 0: %s over %d rounds%s; bytes/seconds %.0f Mbit/s)' % (
            fit['method'], fit['rounds'],
            '' if fit['latency_s'] is None else ', latency %.2f ms' % (1e3 * fit['latency_s']),
            fit['mean_bits'] / 1e6)
    timed = found['codec_timing_s']
    times = found['codec_times'] + ('' if timed is None else ' (timed in %.2f s)' % timed)
    trial = found.get('trial')
    tried = ''
    if trial is not None and not trial['decided']:
        tried = ('; plans on trial from step %d, %d steps each: %s'
                 % (trial['start'], trial['steps'], ', '.join(trial['plans'])))
    elif trial is not None and trial['seconds']:
        tried = ('; plans tried in the job (ms a step): %s; kept: %s' % (
            ', '.join('%s %.1f' % (p, 1e3 * s) for p, s in trial['seconds'].items()),
            trial['kept']))
    if trial is not None and trial.get('float32_skipped'):
        tried += ' (float32 not tried: its bytes alone would take over twice the step)'
    return ("policy='auto': link rate %.0f Mbit/s, %s, a round %.2f ms, codec times %s%s: "
            "%d of %d keys compressed%s"
            % (found['rate_bits'] / 1e6, how, 1e3 * found['round_s'], times, tried,
               len(compressed), len(found['compressed']), ': ' + names if compressed else ''))


def _decided_at(scheme, step):
    """True if the policy's choices are made at ``step`` (a key's step count)."""
    if step == 0:
        return not scheme.policy_replans_at(1)
    return scheme.policy_replans_at(step)


class PolicyLog:
    """One store's log line: when it was last considered and what it last said."""

    def __init__(self):
        self.noted_step = None      # the step the line was last considered at
        self.shown = None           # (rate, choices, trial) the line last said

    def note(self, store, step):
        """Called by the store after a key is planned for ``step``: on rank 0, the first
        key of the step after a decision step writes the line (module docstring)."""
        if not _auto(store.scheme) or step == 0 or store.rank != 0:
            return          # every round of every store passes here: the cheap test first
        if self.noted_step == step or not _decided_at(store.scheme, step - 1):
            return
        found = decisions(store)
        shown = (found['rate_bits'], found['compressed'], found['trial'])
        self.noted_step = step
        if found['rate_bits'] > 0 and self.shown != shown:
            log.info(line(found))
        self.shown = shown
