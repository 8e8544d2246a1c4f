"""The codec list (kvstore_ext/codec_list.py) and the servers' NumPy decoding
(kvstore_ext/py_decode.py): a second class claiming an id or a name is refused at its
definition, naming both; a NumPy-decoded codec's slots are decoded status for status
as the spec's decode_slots (python/kvx_ref/codecs.py) decodes them."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'python'))
from kvx_ref import codecs as ref  # noqa: E402
from kvx_ref import wire as ref_wire  # noqa: E402

from kvstore_ext import codec_list, py_decode  # noqa: E402
from kvstore_ext.codecs import GatherCodec  # noqa: E402
from kvstore_ext.wire import HEADER_WORDS  # noqa: E402

HALVES = 102          # a test codec: payload = header + n values, decoded as value / 2


def _halves_decode(payload, n):
    status, _, _ = ref_wire.check_header(np.asarray(payload, np.float32), HALVES, n)
    if not status and payload.size != HEADER_WORDS + n:
        status = ref_wire.BAD_SIZE
    if status:
        return np.zeros(n, np.float32), status
    return payload[HEADER_WORDS:] * np.float32(0.5), 0


@pytest.fixture(autouse=True, scope='module')
def halves_codec():
    """The test codec, in the codec list and in the spec's decode_slots while this file
    runs, and only then: both are global (the table check of test_cpp_ops.py holds the
    spec's decoders to the library's; the servers import the module of every
    NumPy-decoded codec of the list)."""
    class HalvesCodec(GatherCodec):     # defining it enters it in the codec list
        name = 'test_halves'
        codec_id = HALVES
        server_decode = staticmethod(_halves_decode)

        @staticmethod
        def payload_words_of(n, a, b):
            return HEADER_WORDS + n
    ref.register_decoder(HALVES, _halves_decode)
    yield HalvesCodec
    del ref._DECODERS[float(HALVES)]
    del codec_list.CODECS[float(HALVES)]


def test_an_id_or_a_name_claimed_twice_is_refused(halves_codec):
    with pytest.raises(ValueError, match='codec id 2 is .*FilterTopKCodec'):
        type('Other', (GatherCodec,), {'name': 'other', 'codec_id': 2})
    with pytest.raises(ValueError, match="codec name 'topk' has id 2"):
        type('Other', (GatherCodec,), {'name': 'topk', 'codec_id': 103})
    with pytest.raises(ValueError, match='positive integer'):
        type('Other', (GatherCodec,), {'name': 'other', 'codec_id': 1.5})
    assert codec_list.find(103) is None and codec_list.find(2).name == 'topk'
    assert codec_list.find(HALVES) is halves_codec


def _payload(n, values, codec=HALVES):
    return np.concatenate([ref_wire.make_header(codec, n, 0, 0, n),
                           np.asarray(values, np.float32)])


def _slots(payloads, width):
    out = np.full((len(payloads), width), 7.0, np.float32)     # padding is not zero
    for row, payload in enumerate(payloads):
        out[row, :payload.size] = payload
    return out


@pytest.mark.parametrize('case', ['good', 'void', 'other n', 'other codec', 'unknown codec',
                                  'bad body', 'short', 'bad magic'])
def test_numpy_decoding_agrees_with_the_spec(case):
    rng = np.random.default_rng(5)
    n = 6
    payloads = [_payload(n, rng.standard_normal(n)) for _ in range(3)]
    if case == 'void':
        payloads[1] = np.full_like(payloads[1], 0.0)
        payloads[1][0] = np.nan
    elif case == 'other n':
        payloads[2] = _payload(n - 1, rng.standard_normal(n - 1))
    elif case == 'other codec':
        payloads[2] = ref.fp32_encode(rng.standard_normal(n).astype(np.float32))[0]
    elif case == 'unknown codec':
        payloads[0] = _payload(n, rng.standard_normal(n), codec=104)
    elif case == 'bad body':
        payloads[1][7] = 99
    elif case == 'short':
        payloads[2] = payloads[2][:5]
    elif case == 'bad magic':
        payloads[0][0] = 1.0
    slots = _slots(payloads, HEADER_WORDS + n + 3)
    assert py_decode.wanted(slots)
    total, statuses = py_decode.decode_slots(slots, n + 2)
    want_total, want_statuses = ref.decode_slots(slots, n + 2)
    assert list(statuses) == list(want_statuses)
    assert np.array_equal(total, want_total, equal_nan=True)
    assert (case == 'good') == (not any(statuses))
