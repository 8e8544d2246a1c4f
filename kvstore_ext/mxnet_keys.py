"""MXNet's own compression keys, as scripts written for MXNet's built-in compression
pass them: ``example/image-classification/common/fit.py`` (``--gc-type``) calls
``kv.set_gradient_compression({'type': args.gc_type, 'threshold': args.gc_threshold})``
whatever the type, with ``--gc-threshold`` 0.5 unless the user changed it.

``threshold`` there is MXNet 2-bit's fixed quantisation threshold, an absolute value.
Its meaning per scheme:

* a scheme with a ``threshold`` parameter (``2bit``: the same rule as MXNet's) takes it;
* every other scheme ignores it, with one warning. Why not map it onto Hylo's
  ``fc_threshold``: Hylo's FC threshold adapts to the gradients each step (``fc_scale *
  mean|acc|``); a fixed one is what trained badly with MXNet's own 2-bit (an MNIST CNN
  at 35% with threshold 0.01 against 95% for dist_sync), and fit.py sends 0.5 even when
  the user never chose it, so the value says nothing about the user's intent. A user
  who wants a fixed FC threshold sets ``fc_threshold`` itself.
"""
import logging

log = logging.getLogger('kvstore_ext')


def accept(scheme_class, params, kvstore_type):
    """``params`` without the MXNet keys ``scheme_class`` has no use for (warning once
    for each call that had some)."""
    if 'threshold' not in params or 'threshold' in scheme_class.PARAMS:
        return params
    params = dict(params)
    value = params.pop('threshold')
    log.warning("%s: ignoring compression parameter threshold=%r (MXNet 2-bit's fixed "
                "threshold, which fit.py's --gc-threshold always sends): scheme %r chooses "
                "its own thresholds%s", kvstore_type, value, scheme_class.name,
                " (for a fixed FC threshold set 'fc_threshold')"
                if 'fc_threshold' in scheme_class.PARAMS else '')
    return params
