from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import structlog
from django.http import HttpRequest, HttpResponse

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-Id when it is well-formed), binds it to
    the log context and returns it in the response, so a 500 seen by a client can be found."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-Id", "")
        request_id = incoming if _SAFE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        response = self.get_response(request)
        response["X-Request-Id"] = request_id
        return response
