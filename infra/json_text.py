"""JSON text, fast and exact: the one place the ledger turns JSON text into values and back with
orjson, falling back to the standard library wherever orjson would differ.

orjson reads and writes a megabyte of small objects in a tenth of the standard library's time, but
reads an integer beyond 64 bits as a float and refuses to write one (or a dict with non-string
keys). Reading: a text with a run of 19 digits or more (the shortest integer that may not fit) is
read by the standard library, so every integer stays exact. Writing: whatever orjson refuses is
written by the standard library. ``JSONField`` is Django's, spelled and read this way: the ledger's
columns hold an agent's args, snapshots and results, up to a megabyte each, and Django's own
field spells and reads them with the standard library on every save and every read.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from django.db import models

_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_DIGITS = b"0" * 19


def may_hold_long_integer(raw: bytes) -> bool:
    """Whether JSON text ``raw`` has a run of 19 digits or more: an integer orjson would read as a
    float may be there (a long string of digits or a float's many decimals also match; they are
    then only read more slowly)."""
    return _NINETEEN_DIGITS in raw.translate(_DIGITS_AS_ZERO)


def loads(text: str | bytes) -> Any:
    """The value of valid JSON ``text``, every integer exact; ``json.JSONDecodeError`` (orjson's
    is a subclass) when it is not valid JSON."""
    raw = text.encode() if isinstance(text, str) else text
    if may_hold_long_integer(raw):
        return json.loads(raw)
    return orjson.loads(raw)


class Encoder(json.JSONEncoder):
    """``json.dumps(value, cls=Encoder)`` (how Django's JSONField spells a column's value) in
    orjson's spelling, or the standard library's where orjson refuses the value."""

    def encode(self, o: Any) -> str:
        try:
            return orjson.dumps(o).decode()
        except orjson.JSONEncodeError:
            return super().encode(o)


class Decoder(json.JSONDecoder):
    """``json.loads(text, cls=Decoder)`` (how Django's JSONField reads a column) through ``loads``."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        return loads(s)


class JSONField(models.JSONField):
    """Django's ``JSONField``, spelled and read with ``Encoder`` and ``Decoder`` unless told
    otherwise. The stored jsonb value is the same either way (PostgreSQL normalises the text)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("encoder", Encoder)
        kwargs.setdefault("decoder", Decoder)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("encoder") is Encoder:
            del kwargs["encoder"]
        if kwargs.get("decoder") is Decoder:
            del kwargs["decoder"]
        return name, path, args, kwargs
