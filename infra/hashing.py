from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import orjson


def canonical_json(value: Any) -> str:
    """Key-sorted, whitespace-free JSON: equal payloads hash equally whatever the key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_hex(value: Any) -> str:
    """The hash of a string's or bytes' own bytes, else of the value's canonical JSON (spelled by
    ``canonical_json_bytes``: the same bytes as ``canonical_json``, in a tenth of the time, so a
    megabyte of args an approval binds is not spelled by the standard library)."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, bytes):
        data = value
    else:
        data = canonical_json_bytes(value)
    return hashlib.sha256(data).hexdigest()


# orjson spells a float between 1e-10 and 1e-4 differently from the standard library ("1e-5" or
# "0.00001" for "1e-05"); every other value of JSON's own types it spells alike. Output that may
# hold such a float (the pattern may also match text in a string: then the slow path, still exact)
# is made again by the standard library.
_ONE_DIGIT_NEGATIVE_EXPONENT = re.compile(rb"e-\d(?!\d)")
# Anything but JSON's own types (a datetime, a dataclass, a subclass of str or int…) goes to the
# default, which refuses it, so the standard library spells it as ``canonical_json`` always has.
_STRICT = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_STRICT |= orjson.OPT_PASSTHROUGH_SUBCLASS


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def canonical_json_bytes(value: Any) -> bytes:
    """``canonical_json(value).encode()``, byte for byte, for a value of JSON's own types (what a
    JSON parser returns: dicts with string keys, lists, strings, numbers, booleans, None), in a
    tenth of the time: stored hashes (``Action.payload_hash``) are compared with new ones, so the
    spelling may never change. orjson writes it unless it cannot (an integer beyond 64 bits,
    another type) or its spelling of a float may differ; then the standard library does."""
    try:
        text = orjson.dumps(value, default=_refuse, option=_STRICT)
    except orjson.JSONEncodeError:
        return canonical_json(value).encode()
    # Plain substring tests first: they run at memory speed, a regular expression does not.
    if b"0.0000" in text or (b"e-" in text and _ONE_DIGIT_NEGATIVE_EXPONENT.search(text)):
        return canonical_json(value).encode()
    return text
