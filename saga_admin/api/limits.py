"""What the API refuses before any view runs, and how fast a key may call it.

``ApiBodyLimitsMiddleware`` guards every request body under ``/api/``: the size limit (413), the
content type (415), well-formed UTF-8 JSON (400), and values PostgreSQL would choke on later —
NUL characters, lone surrogates, NaN/Infinity — or nesting deeper than the configured depth
(422). Doing it here, once, means no view or service ever sees such a body, so nothing a client
sends can surface as a 500 from deep inside the database driver.

``KeyRateThrottle`` is ninja's throttle hook with a fixed-window counter in Django's cache
(Redis in production), keyed by API key, so every web process shares one count.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseNotFound, JsonResponse
from ninja.parser import Parser
from ninja.throttling import BaseThrottle
from redis.exceptions import RedisError

from ledger.conf import saga

log = structlog.get_logger("saga_admin.api.limits")

API_PREFIX = "/api/"
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# The parsed body is kept on the request so ninja's parser does not decode it a second time.
_PARSED_ATTR = "_saga_parsed_json"


class BodyRejected(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details or {}


def error_json(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> JsonResponse:
    return JsonResponse(
        {"error": {"code": code, "message": message, "details": details or {}}}, status=status
    )


def _reject_constant(name: str) -> Any:
    raise BodyRejected(400, "invalid_json", f"{name} is not valid JSON (and PostgreSQL cannot store it).")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyRejected(400, "invalid_json", f"The number {text[:40]} is out of range.")
    return value


def check_json_value(value: Any, *, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` and strings PostgreSQL cannot store (NUL, lone
    surrogates). Iterative, so a hostile body cannot exhaust the Python stack either."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        current, depth, where = stack.pop()
        if isinstance(current, dict | list):
            if depth > max_depth:
                raise BodyRejected(
                    422,
                    "invalid_request",
                    f"The JSON body is nested deeper than {max_depth} levels.",
                    {"max_depth": max_depth, "at": where},
                )
            items = current.items() if isinstance(current, dict) else enumerate(current)
            for key, child in items:
                if isinstance(key, str):
                    _check_string(key, f"{where}.{key[:40]}")
                stack.append(
                    (
                        child,
                        depth + 1,
                        f"{where}.{str(key)[:40]}" if isinstance(current, dict) else f"{where}[{key}]",
                    )
                )
        elif isinstance(current, str):
            _check_string(current, where)


def _check_string(text: str, where: str) -> None:
    if "\x00" in text:
        raise BodyRejected(
            422, "invalid_request", "Strings may not contain NUL (\\u0000) characters.", {"at": where}
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyRejected(
            422, "invalid_request", "Strings may not contain unpaired surrogates.", {"at": where}
        ) from None


def parse_json_body(raw: bytes, *, max_depth: int) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRejected(
            400, "invalid_json", "The request body is not valid UTF-8.", {"position": exc.start}
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (json.JSONDecodeError, RecursionError) as exc:
        details = {"line": exc.lineno, "column": exc.colno} if isinstance(exc, json.JSONDecodeError) else {}
        raise BodyRejected(400, "invalid_json", "The request body is not valid JSON.", details) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python will convert
        raise BodyRejected(400, "invalid_json", f"The request body is not valid JSON: {exc}.") from None
    check_json_value(value, max_depth=max_depth)
    return value


def _is_json_content_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _refuse_nul_in_url(request: HttpRequest) -> HttpResponse | None:
    """A NUL in the path or the query string (``%00``) would reach PostgreSQL as an id or a filter
    and fail there as a 500, on every page and endpoint. No id or filter value can contain one, so
    the whole site refuses it here: an object named that way cannot exist (404), a filter with it
    is invalid (422 for the API, 400 for pages)."""
    in_path = "\x00" in request.path
    in_query = not in_path and any(
        "\x00" in part for key, values in request.GET.lists() for part in (key, *values)
    )
    if not (in_path or in_query):
        return None
    if request.path.startswith(API_PREFIX):
        if in_path:
            return error_json(404, "not_found", "Not found.")
        return error_json(422, "invalid_request", "Query parameters may not contain NUL (%00) characters.")
    return HttpResponseNotFound("Not found.") if in_path else HttpResponseBadRequest("Bad request.")


class ApiBodyLimitsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = _refuse_nul_in_url(request)
        if refused is not None:
            return refused
        if request.path.startswith(API_PREFIX) and request.method in _BODY_METHODS:
            try:
                self._check(request)
            except BodyRejected as exc:
                return error_json(exc.status, exc.code, exc.message, exc.details)
        return self.get_response(request)

    def _check(self, request: HttpRequest) -> None:
        limit = saga().max_body_bytes
        too_big = BodyRejected(
            413, "payload_too_large", f"The request body is larger than {limit} bytes.", {"max_bytes": limit}
        )
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise BodyRejected(400, "bad_request", "Content-Length is not a number.") from None
        # Refuse on the declared length, before reading a byte of it.
        if declared > limit:
            raise too_big
        try:
            body = request.body
        except RequestDataTooBig:
            raise too_big from None
        if len(body) > limit:
            raise too_big
        if not body:
            return
        if not _is_json_content_type(request.content_type or ""):
            raise BodyRejected(
                415,
                "unsupported_media_type",
                "Request bodies must be JSON (Content-Type: application/json).",
                {"content_type": (request.content_type or "")[:100]},
            )
        setattr(request, _PARSED_ATTR, parse_json_body(body, max_depth=saga().max_json_depth))


def parsed_body(request: HttpRequest) -> Any:
    """The request's JSON body as the middleware parsed it (None when there was no body)."""
    return getattr(request, _PARSED_ATTR, None)


class CheckedJSONParser(Parser):
    """Hands ninja the body the middleware already parsed and checked. A request that reached
    the API without the middleware (a test calling the view directly) is checked here instead."""

    def parse_body(self, request: HttpRequest) -> Any:
        if hasattr(request, _PARSED_ATTR):
            return getattr(request, _PARSED_ATTR)
        return parse_json_body(request.body, max_depth=saga().max_json_depth)


# --- Throttling ---------------------------------------------------------------------------------

_PERIODS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """ "6000/m" → (6000, 60); "10/5s" → (10, 5)."""
    count, _, period = rate.partition("/")
    digits = "".join(ch for ch in period if ch.isdigit())
    unit = period[len(digits) :].strip().lower() or "s"
    if unit not in _PERIODS:
        raise ValueError(f"Unknown throttle period in {rate!r}")
    return int(count), (int(digits) if digits else 1) * _PERIODS[unit]


def _count_in_window(cache_key: str, *, ttl: int) -> int:
    """Add one to the window's counter and return it. On Redis: ``SET NX EX`` + ``INCR`` in one
    pipelined round trip (both atomic; the counter is a plain integer, which is also how Django's
    Redis cache stores ints, so ``cache.get`` reads it). Any other cache: ``add`` + ``incr``."""
    backend = caches["default"]  # the backend itself (``cache`` is a proxy to it)
    if isinstance(backend, RedisCache):
        full_key = backend.make_and_validate_key(cache_key)
        client = backend._cache.get_client(full_key, write=True)
        pipe = client.pipeline(transaction=False)
        pipe.set(full_key, 0, ex=ttl, nx=True)
        pipe.incr(full_key)
        return int(pipe.execute()[1])
    cache.add(cache_key, 0, timeout=ttl)
    return int(cache.incr(cache_key))


class KeyRateThrottle(BaseThrottle):
    """Fixed window per API key: an atomic counter in Redis (see ``_count_in_window``), so the
    count is right across processes without storing a history list per request (what ninja's
    SimpleRateThrottle does). The rate is read per request so a settings change applies at once.
    If the cache is down the request is allowed: a rate limit must not take the ledger down."""

    def __init__(self) -> None:
        # One instance serves every thread; ninja asks wait() right after a refusal, so the
        # window's end is remembered per thread.
        self._local = threading.local()

    def allow_request(self, request: HttpRequest) -> bool:
        key = getattr(request, "auth", None)
        if key is None:
            return True
        limit, period = parse_rate(saga().throttle_rate)
        now = time.time()
        window = int(now // period)
        self._local.retry_after = (window + 1) * period - now
        cache_key = f"saga:throttle:{key.pk}:{period}:{window}"
        try:
            count = _count_in_window(cache_key, ttl=period + 5)
        except (RedisError, OSError):  # Redis unreachable or failing: fail open (class docstring)
            log.warning("throttle.cache_unavailable", exc_info=True)
            return True
        return count <= limit

    def wait(self) -> float | None:
        return max(getattr(self._local, "retry_after", 1.0), 1.0)
