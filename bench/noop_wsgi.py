"""L2: the cheapest WSGI app that does what an append endpoint must at minimum do — read the
request body and answer 201 with a small JSON body. Served by gunicorn with the Procfile's
web settings, it is the ceiling the HTTP stack (server + load generator) puts on any endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

_BODY = b'{"id": "act_00000000000000000000000000", "status": "planned"}'


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(_BODY)))])
    return [_BODY]
