"""The API's JSON renderer: orjson, with the exact output of ninja's own encoder.

orjson serialises dicts, lists, strings and numbers natively (several times faster than the
standard library's encoder, which shows on every agent call); datetimes are passed through to
ninja's encoder so timestamps keep the format clients already parse (Django's: milliseconds, ``Z``
for UTC), as are Decimals, UUIDs and lazy strings. What orjson refuses falls back to the standard
encoder, so no value the ledger holds can make a response fail."""

from __future__ import annotations

import json
from typing import Any

import orjson
from django.http import HttpRequest
from ninja.renderers import BaseRenderer
from ninja.responses import NinjaJSONEncoder

_ENCODER = NinjaJSONEncoder()
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_NON_STR_KEYS


def _default(value: Any) -> Any:
    return _ENCODER.default(value)


def render_json(data: Any) -> bytes:
    """``data`` as the API's JSON: what every response body of the API goes through."""
    try:
        return orjson.dumps(data, default=_default, option=_OPTIONS)
    except orjson.JSONEncodeError:
        # What orjson does not take: an integer beyond 64 bits that an agent put in its args
        # (JSON allows any size, and the ledger keeps it exactly), a nesting deeper than 255.
        return json.dumps(data, cls=NinjaJSONEncoder).encode()


class ORJSONRenderer(BaseRenderer):
    media_type = "application/json"

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        return render_json(data)
