"""What the API refuses before any view runs, and how fast a caller may call it.

``ApiGateMiddleware`` stands in front of every request under ``/api/``, in this order:

1. A NUL in the URL (the whole site): 404 in the path, 422/400 in the query string.
2. The public paths (the API root, the OpenAPI document, the docs page): ``GET``/``HEAD`` only.
3. **Authentication, before a byte of the body is read.** ``request_key`` looks the bearer key up
   from the headers alone (the one place a key is authenticated: ninja's ``KeyAuth`` reuses its
   answer). No valid key → 401, or 429 once the client's address has had more refusals than
   ``SAGA_UNAUTHENTICATED_RATE`` in the current window. Either way the body stays unread, so a
   megabyte without a key costs what a bare ``GET`` does.
4. For an authenticated request, the key's limits (429: requests, and body bytes by declared
   length), then the body: the size limit (413, on the declared length before the limits count
   it; again on what is read), the content type (415),
   well-formed UTF-8 JSON (400), and values PostgreSQL would choke on later — NUL characters, lone
   surrogates, NaN/Infinity — or nesting deeper than the configured depth (422). Doing it here,
   once, means no view or service ever sees such a body, so nothing a client sends can surface as
   a 500 from deep inside the database driver.
5. On the way out, the framework's own refusals that do not come from the API's handlers — a
   method the path does not serve (405) — are put in the one error shape.

The per-key limits are counted here too, from the headers, after authentication and before the
body is read: requests (``SAGA_THROTTLE_RATE``) and body bytes by declared length
(``SAGA_THROTTLE_BYTES``), as fixed-window counters in Django's cache (Redis in production), so
every web process shares one count; both move in one round trip. The per-address count of refused
requests is the same kind of counter (``infra.throttle.fixed_windows``), keyed by address; URL-bearing requests
(``refuse_over_url_rate``, called by the operations that take a URL) another, keyed by API key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseNotFound, JsonResponse
from django.urls import Resolver404, resolve
from ninja.parser import Parser

from infra import json_text
from infra.conf import saga
from infra.error_bodies import error_body
from infra.throttle import Window, client_address, fixed_window, fixed_windows
from ledger.models import AgentKey
from ledger.services.keys import agent_key_authenticate

log = structlog.get_logger(__name__)

API_PREFIX = "/api/"


def is_api_request(request: HttpRequest) -> bool:
    """Whether ``request`` is for the API: its path within this application (``path_info``), not
    the full ``path``. Mounted under a prefix (``SCRIPT_NAME=/saga``), the full path is
    ``/saga/api/...`` while the URL resolver still routes ``path_info`` to the API; deciding on
    ``path`` would let every such request past the gate's refusals to the views."""
    return request.path_info.startswith(API_PREFIX)


_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# The parsed body is kept on the request so ninja's parser does not decode it a second time.
_PARSED_ATTR = "_saga_parsed_json"
# The authenticated key (or None) is kept on the request so ninja's KeyAuth does not look it up again.
_KEY_ATTR = "_saga_api_key"
# Served without a key (ninja's URL names in the API's namespace): the root, the OpenAPI document
# and the interactive docs. They read no body, so they answer GET and HEAD only.
API_NAMESPACE = "api-v1"
_PUBLIC_URL_NAMES = {"api-root", "openapi-json", "openapi-view"}
_PUBLIC_METHODS = ("GET", "HEAD")
# A bearer token we would even look up: the key format is ``sk_<hex>_<urlsafe>``. Anything else
# (too long, NUL bytes, non-ASCII) is a 401 without touching the database.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")
UNAUTHORIZED_MESSAGE = "A valid API key is required: Authorization: Bearer <key>."
WWW_AUTHENTICATE = 'Bearer realm="saga-admin"'


class BodyRejected(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details or {}


def error_json(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> JsonResponse:
    response = JsonResponse(error_body(code, message, details), status=status)
    # The gate answers before CommonMiddleware would add it; without it a client could only know
    # the answer is complete when the connection closes, and the server may keep it open while it
    # discards the unread body.
    response["Content-Length"] = str(len(response.content))
    return response


def _reject_constant(name: str) -> Any:
    raise BodyRejected(400, "invalid_json", f"{name} is not valid JSON (and PostgreSQL cannot store it).")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BodyRejected(400, "invalid_json", f"The number {text[:40]} is out of range.")
    return value


def check_json_value(value: Any, *, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` and strings PostgreSQL cannot store (NUL, lone
    surrogates), naming where. Iterative, so a hostile body cannot exhaust the Python stack either.
    A walk over every value costs far more than parsing them did (a megabyte of small objects:
    ~200 ms), so ``parse_json_body`` calls it only for a body its byte-level checks refuse: this
    finds the place to name."""
    # Each entry: the value, its depth, and its parent's entry with the key that leads to it, so a
    # path is spelled out only for the value refused, not for every value passed.
    stack: list[tuple[Any, int, Any, Any]] = [(value, 1, None, None)]
    while stack:
        entry = stack.pop()
        current, depth = entry[0], entry[1]
        if isinstance(current, dict | list):
            if depth > max_depth:
                raise _too_deep(max_depth, at=_path(entry))
            items = current.items() if isinstance(current, dict) else enumerate(current)
            for key, child in items:
                if isinstance(key, str):
                    _check_string(key, entry, key)
                stack.append((child, depth + 1, entry, key))
        elif isinstance(current, str):
            _check_string(current, entry)


def _too_deep(max_depth: int, *, at: str | None) -> BodyRejected:
    """The refusal of a body nested past the limit, with where (``at``) when the walk found it (a
    body too deep for the parser itself is refused before any walk)."""
    details: dict[str, Any] = {"max_depth": max_depth}
    if at is not None:
        details["at"] = at
    return BodyRejected(
        422, "invalid_request", f"The JSON body is nested deeper than {max_depth} levels.", details
    )


def _path(entry: Any, key: Any = None) -> str:
    """``$.a.b[2]``: the JSON path of a walk entry (and of ``key`` in it, when given)."""
    parts: list[str] = []
    if key is not None:
        parts.append(f".{str(key)[:40]}")
    while entry[2] is not None:
        parent, step = entry[2], entry[3]
        parts.append(f".{str(step)[:40]}" if isinstance(parent[0], dict) else f"[{step}]")
        entry = parent
    return "$" + "".join(reversed(parts))


def _check_string(text: str, entry: Any, key: Any = None) -> None:
    if "\x00" in text:
        raise BodyRejected(
            422,
            "invalid_request",
            "Strings may not contain NUL (\\u0000) characters.",
            {"at": _path(entry, key)},
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyRejected(
            422, "invalid_request", "Strings may not contain unpaired surrogates.", {"at": _path(entry, key)}
        ) from None


# The byte-level checks that stand in for walking every parsed value (see parse_json_body). They
# read the body as the JSON text it was just proven to be, where a backslash occurs only inside a
# string: an escaped NUL is ``\u0000`` after an even run of escaped backslashes (``\\``)...
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# ...an integer orjson would turn into a float has at least 19 digits (``json_text``: orjson keeps
# up to 64 bits; the ledger keeps any integer Python reads, exactly), and the nesting is seen in
# the brackets that remain once the strings are gone, with both kinds made one.
_ONE_BRACKET_KIND = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET_OR_QUOTE = bytes(sorted(set(range(256)) - set(b'{}[]"')))


def _nested_deeper_than(raw: bytes, max_depth: int) -> bool:
    """Whether valid JSON ``raw`` nests containers deeper than ``max_depth``, from its bytes.
    Escaped backslashes and quotes go first (so every quote left delimits a string), then all but
    brackets and quotes, then the strings. Each round then removes the innermost containers
    (``bytes.replace`` never matches across what it just removed, so ``[[]]`` loses one level a
    round): a body is within the limit when ``max_depth`` rounds leave nothing."""
    if raw.count(b"{") + raw.count(b"[") <= max_depth:
        return False
    skeleton = (
        raw.replace(b"\\\\", b"")
        .replace(b'\\"', b"")
        .translate(_ONE_BRACKET_KIND, _NOT_BRACKET_OR_QUOTE)
        .replace(b'""', b"")
    )
    if b'"' in skeleton:
        skeleton = b"".join(skeleton.split(b'"')[::2])
    for _ in range(max_depth):
        skeleton = skeleton.replace(b"[]", b"")
        if not skeleton:
            return False
    return True


def _parse_exactly(raw: bytes, *, max_depth: int) -> Any:
    """The standard library's parser: every integer exactly, and the precise refusal (400). A body
    nested past what the parser recurses through is past the nesting limit too, and named so."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRejected(
            400, "invalid_json", "The request body is not valid UTF-8.", {"position": exc.start}
        ) from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise _too_deep(max_depth, at=None) from None
    except json.JSONDecodeError as exc:
        details = {"line": exc.lineno, "column": exc.colno}
        raise BodyRejected(400, "invalid_json", "The request body is not valid JSON.", details) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python will convert
        raise BodyRejected(400, "invalid_json", f"The request body is not valid JSON: {exc}.") from None


def parse_json_body(raw: bytes, *, max_depth: int) -> Any:
    """The body's JSON value, or ``BodyRejected``. Once per request (the gate keeps the value for
    ninja), and in time proportional to the bytes with a small constant: orjson parses (it refuses
    invalid UTF-8, lone surrogates, NaN, Infinity and out-of-range numbers itself), and the NUL and
    depth checks read the bytes instead of walking every value. Only a body that needs it takes the
    slower exact path: one orjson refuses (the standard parser then says why, or the walk names the
    lone surrogate), one with a number of 19 digits or more (parsed again exactly), and one a
    byte-level check refuses (the walk names where)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = _parse_exactly(raw, max_depth=max_depth)
        check_json_value(value, max_depth=max_depth)
        return value
    if json_text.may_hold_long_integer(raw):
        value = _parse_exactly(raw, max_depth=max_depth)
    if (b"\\u0000" in raw and _NUL_ESCAPE.search(raw)) or _nested_deeper_than(raw, max_depth):
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
    try:
        in_query = not in_path and any(
            "\x00" in part for key, values in request.GET.lists() for part in (key, *values)
        )
    except TooManyFieldsSent:
        # More query parameters than DATA_UPLOAD_MAX_NUMBER_FIELDS: no endpoint takes that many.
        if is_api_request(request):
            return error_json(
                422,
                "invalid_request",
                f"Too many query parameters (at most {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}).",
            )
        return HttpResponseBadRequest("Bad request.")
    if not (in_path or in_query):
        return None
    if is_api_request(request):
        if in_path:
            return error_json(404, "not_found", "Not found.")
        return error_json(422, "invalid_request", "Query parameters may not contain NUL (%00) characters.")
    return HttpResponseNotFound("Not found.") if in_path else HttpResponseBadRequest("Bad request.")


# --- Authentication -----------------------------------------------------------------------------


def bearer_token(request: HttpRequest) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (ninja's HttpBearer parsing)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def request_key(request: HttpRequest) -> AgentKey | None:
    """The request's active API key, or None: the one place the API authenticates a key, once per
    request. The gate calls it before the body is read; ninja's ``KeyAuth`` gets the same answer
    (and a request that reached a view without the gate, a test calling it directly, is
    authenticated here then)."""
    if hasattr(request, _KEY_ATTR):
        known: AgentKey | None = getattr(request, _KEY_ATTR)
        return known
    token = bearer_token(request)
    key = agent_key_authenticate(raw_key=token) if token and _TOKEN_RE.match(token) else None
    setattr(request, _KEY_ATTR, key)
    return key


# Seconds a client is told to wait while the database does not answer: a restart or a failover
# takes seconds, and every retry of an API write with its Idempotency-Key is applied once.
DATABASE_RETRY_AFTER_S = 5


def database_down(exc: BaseException | None) -> bool:
    """The database did not answer (down, restarting, unreachable, its connection cut): a 503 to
    retry, not a 500. psycopg raises OperationalError for these, InterfaceError on a closed
    connection."""
    return isinstance(exc, (OperationalError, InterfaceError))


def database_unavailable() -> JsonResponse:
    """503 ``database_unavailable`` in the error shape, with ``Retry-After``."""
    response = error_json(
        503,
        "database_unavailable",
        "The database is not answering right now; retry after the Retry-After delay.",
        {"retry_after_s": DATABASE_RETRY_AFTER_S},
    )
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


def internal_error(request: HttpRequest, exc: BaseException | None = None) -> JsonResponse:
    """The 500 in the error shape: the request id to quote, never a traceback (that is logged).
    An ``exc`` that says the database is down answers 503 ``database_unavailable`` instead."""
    if database_down(exc):
        return database_unavailable()
    request_id = getattr(request, "request_id", "")
    return error_json(
        500,
        "internal_error",
        f"Something went wrong on our side; quote request id {request_id}.",
        {"request_id": request_id},
    )


def unauthorized_response() -> JsonResponse:
    response = error_json(401, "unauthorized", UNAUTHORIZED_MESSAGE)
    response["WWW-Authenticate"] = WWW_AUTHENTICATE
    return response


def _refuse_unauthenticated(request: HttpRequest) -> HttpResponse:
    """401, or 429 once this address has been refused more often than the unauthenticated rate
    allows in the current window. Only refusals are counted: a valid key is never slowed by what
    others behind the same address send."""
    address = client_address(request)
    window = fixed_window(f"unauthenticated:{address}", saga().unauthenticated_rate)
    if window is None or window.allowed:
        return unauthorized_response()
    if window.count == window.limit + 1:  # once per window and address, not once per request
        log.warning("api.unauthenticated_throttled", address=address, limit=saga().unauthenticated_rate)
    response = error_json(
        429,
        "rate_limited",
        "Too many requests without a valid API key from this address; retry after the Retry-After delay.",
    )
    response["Retry-After"] = str(max(1, math.ceil(window.retry_after)))
    # Logged once above when the address crosses the limit, not once per request by Django: a flood
    # must not turn into a flood of log lines.
    setattr(response, "_has_been_logged", True)  # noqa: B010 - Django's own flag
    return response


# --- The gate ----------------------------------------------------------------------------------


def _public_path(request: HttpRequest) -> bool:
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return False
    return match.url_name in _PUBLIC_URL_NAMES and API_NAMESPACE in match.namespaces


def _method_not_allowed(request: HttpRequest, allowed: list[str]) -> JsonResponse:
    response = error_json(
        405,
        "method_not_allowed",
        f"{str(request.method)[:20]} is not allowed here; allowed: {', '.join(allowed)}.",
        {"allowed": allowed},
    )
    response["Allow"] = ", ".join(allowed)
    return response


def _in_error_shape(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Ninja answers a method an existing path does not serve with a plain-text 405 before any
    handler of ours runs; every answer under /api/ is in the one error shape, so it is rewritten
    here, keeping its ``Allow``."""
    if response.status_code != 405 or response.get("Content-Type", "").startswith("application/json"):
        return response
    allowed = sorted({m.strip().upper() for m in response.get("Allow", "").split(",") if m.strip()})
    return _method_not_allowed(request, allowed)


class ApiGateMiddleware:
    """See the module docstring: NUL in the URL, public paths, authentication before the body,
    the body checks, the error shape on the way out."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refused = _refuse_nul_in_url(request)
        if refused is not None:
            return refused
        if not is_api_request(request):
            return self.get_response(request)
        if _public_path(request):
            if request.method not in _PUBLIC_METHODS:
                return _method_not_allowed(request, list(_PUBLIC_METHODS))
            return self.get_response(request)
        refused = self._refuse(request)
        if refused is not None:
            return refused
        return _in_error_shape(request, self.get_response(request))

    def _refuse(self, request: HttpRequest) -> HttpResponse | None:
        try:
            key = request_key(request)
        except Exception as exc:
            # Outside the API's exception handlers (the database down, say): the same JSON 500
            # an operation would give, rather than the site's HTML page.
            log.exception("api.unexpected_error", path=request.path, method=request.method)
            if settings.DEBUG and getattr(settings, "SAGA_RAISE_API_ERRORS", False):
                raise
            return internal_error(request, exc)
        if key is None:
            # Nothing of the body has been read or parsed here: the server discards it (the
            # Procfile's gunicorn gthread worker reads and drops the rest before the connection's
            # next request; its sync worker closed the connection, reading at most 64 KiB).
            return _refuse_unauthenticated(request)
        try:
            declared = _declared_length(request) if request.method in _BODY_METHODS else 0
        except BodyRejected as exc:
            return error_json(exc.status, exc.code, exc.message, exc.details)
        # The key's limits, counted from the headers: a key over its requests or its bytes is
        # refused before its body is read, let alone parsed.
        refused = _refuse_over_key_limits(key, body_bytes=declared)
        if refused is not None:
            return refused
        if request.method in _BODY_METHODS:
            try:
                self._check(request)
            except BodyRejected as exc:
                return error_json(exc.status, exc.code, exc.message, exc.details)
        return None

    def _check(self, request: HttpRequest) -> None:
        limit = saga().max_body_bytes
        too_big = BodyRejected(
            413, "payload_too_large", f"The request body is larger than {limit} bytes.", {"max_bytes": limit}
        )
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


def _declared_length(request: HttpRequest) -> int:
    """The body's declared length (what Django will read at most), refused when it is not a number
    (400) or over the size limit (413): before a byte of the body is read."""
    try:
        declared = max(int(request.META.get("CONTENT_LENGTH") or 0), 0)
    except ValueError:
        raise BodyRejected(400, "bad_request", "Content-Length is not a number.") from None
    limit = saga().max_body_bytes
    if declared > limit:
        raise BodyRejected(
            413, "payload_too_large", f"The request body is larger than {limit} bytes.", {"max_bytes": limit}
        )
    return declared


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


def _rate_limited(message: str, window: Window, details: dict[str, Any] | None = None) -> JsonResponse:
    response = error_json(429, "rate_limited", message, details)
    response["Retry-After"] = str(max(1, math.ceil(window.retry_after)))
    return response


def _refuse_over_key_limits(key: AgentKey, *, body_bytes: int) -> HttpResponse | None:
    """429 when the key is over its rate of requests (``SAGA_THROTTLE_RATE``) or of body bytes
    (``SAGA_THROTTLE_BYTES``; the declared length is counted, so a refused body is never read).
    Both counters move in one round trip; a request without a body counts no bytes."""
    conf = saga()
    counts = [(str(key.pk), conf.throttle_rate, 1)]
    if body_bytes:
        counts.append((f"bytes:{key.pk}", conf.throttle_bytes, body_bytes))
    windows = fixed_windows(counts)
    if windows is None:
        return None
    if not windows[0].allowed:
        return _rate_limited(
            "Too many requests for this API key; retry after the Retry-After delay.", windows[0]
        )
    if len(windows) > 1 and not windows[1].allowed:
        return _rate_limited(
            f"This API key has sent more than {windows[1].limit} bytes of request bodies in this "
            "window; retry after the Retry-After delay.",
            windows[1],
            {"limit_bytes": windows[1].limit},
        )
    return None


def refuse_over_url_rate(request: HttpRequest) -> HttpResponse | None:
    """429 when the request's key is over its rate of URL-bearing requests (``SAGA_URL_RATE``):
    requests carrying a URL the server will check — resolving its host — and later call (a run's
    ``resume_url``). Counted per key, before the URL is looked at, so no key can make the outbound
    guard resolve names at its own pace."""
    key = request_key(request)
    if key is None:
        return None
    window = fixed_window(f"urls:{key.pk}", saga().url_rate)
    if window is None or window.allowed:
        return None
    return _rate_limited(
        "Too many requests carrying a URL for this API key; retry after the Retry-After delay.",
        window,
        {"limit": window.limit},
    )
