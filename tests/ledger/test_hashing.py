"""``canonical_json_bytes`` is ``canonical_json`` spelled faster, never differently: payload hashes
stored before it existed must still match a retry's."""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from infra.hashing import canonical_json, canonical_json_bytes, sha256_hex
from ledger.services.actions.payload import action_payload_hash


def _random_floats(count: int) -> list[float]:
    """Doubles from every exponent (random bit patterns), plus the ranges where orjson and the
    standard library spell numbers differently (1e-10..1e-4) and their edges."""
    rng = random.Random(26)
    floats = [m * 10.0**e for e in range(-12, 25) for m in (1.0, 1.5, 2.220446049250313, 9.999999999999998)]
    while len(floats) < count:
        value = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if value == value and abs(value) != float("inf"):
            floats.append(value)
    return floats + [-0.0, 0.0, 5e-324, 1.7976931348623157e308]


VALUES: list[Any] = [
    None,
    True,
    "",
    "plain",
    'quotes " and \\ backslashes',
    "".join(chr(i) for i in range(0x80)) + "\u2028\u2029\x85\ud7ff\ue000\U0001f600 réunion ☃",
    "text that looks like numbers: 0.00001 1e-5 e-7",
    0,
    -(2**63),
    2**64 - 1,
    2**64,
    2**70,
    -(10**40),
    {"b": 1, "a": [1, 2, {"d": None, "c": "x"}], "é": {}, "E": [], "\U0001f600": 1, "z": 1.5e-7},
    [[], {}, [[[]]], {"": ""}],
    {"tool": "crm.update", "args": {"amount": 12.5, "note": "0.0000 is text"}},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_canonical_bytes_are_the_standard_librarys(value):
    assert canonical_json_bytes(value) == canonical_json(value).encode()


def test_every_float_is_spelled_as_the_standard_library_spells_it():
    floats = _random_floats(20_000)
    for value in floats:
        assert canonical_json_bytes(value) == canonical_json(value).encode(), value
    # And inside documents (where the fallback has to re-spell the whole document).
    document = {"xs": floats[:2000], "nested": [{"f": f} for f in floats[2000:4000]]}
    assert canonical_json_bytes(document) == canonical_json(document).encode()


@pytest.mark.parametrize("args", VALUES[-4:] + [{"n": 2**70, "tiny": 3e-6}], ids=range(5))
def test_the_payload_hash_is_the_one_stored_before(args):
    """The record's payload hash is spelled around the args' bytes; it must be the sha256 of the
    whole payload's canonical JSON, as ``action_payload_hash`` always computed it."""
    for compensation in (None, {"tool": "crm.restore", "args": {"v": 1e-9, "w": "ü"}}):
        payload = {"tool": "crm.update_x", "target_type": "contact", "target_id": "c-1", "args": args}
        expected = sha256_hex({**payload, "compensation": compensation})
        got = action_payload_hash(
            tool="crm.update_x", target_type="contact", target_id="c-1", args=args, compensation=compensation
        )
        assert got == expected
