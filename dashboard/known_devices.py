"""Known devices for the login lockout (OWASP's "device cookies").

The lockout counts a username's failures per client address (dashboard.login). Behind a proxy no
setting names (``SAGA_TRUSTED_PROXY_HOPS`` left at 0), every client has the proxy's address, so
five wrong passwords from anyone lock that username out for everyone. The address cannot be
recovered then, but a browser that has signed in as that username before can be recognised: a
successful password sign-in gives it a signed cookie naming the username and a random device id.

An attempt that carries a valid cookie for the username it tries is counted against that device
alone, not against its address: others' guesses do not lock it out, and its own wrong passwords
lock it after the same ``AXES_FAILURE_LIMIT`` (counted in Redis, for the same cool-off). The
per-username ceiling (``SAGA_LOGIN_USERNAME_FAILURE_LIMIT``) still applies to it. A browser without
the cookie is judged by its address as before. The cookie is HttpOnly, sent only to the login
page, Secure like the session cookie, and signed with SECRET_KEY: it cannot be made, only copied
from the browser that holds it. When Redis does not answer, a device counts as unknown (the
address rules apply): never a way past the lockout.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

COOKIE = "saga_known_device"
SALT = "dashboard.known_devices"
MAX_AGE_S = 30 * 86400  # a browser not used to sign in for a month is a stranger again


def issue(response: HttpResponse, username: str) -> None:
    """After a successful password sign-in: this browser is known for ``username``, with a new id
    (a device's earlier failures stay with its earlier id)."""
    value = signing.dumps({"u": username, "d": secrets.token_urlsafe(16)}, salt=SALT)
    response.set_cookie(
        COOKIE,
        value,
        max_age=MAX_AGE_S,
        path=reverse("login"),
        secure=settings.SESSION_COOKIE_SECURE,
        httponly=True,
        samesite="Lax",
    )


def device_for(request: HttpRequest, username: str | None) -> str | None:
    """The id of the known device this request comes from, for ``username``; None when it carries
    no valid cookie for that username."""
    raw = request.COOKIES.get(COOKIE)
    if not raw or not username:
        return None
    try:
        data: Any = signing.loads(raw, salt=SALT, max_age=MAX_AGE_S)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("u") != username or not isinstance(data.get("d"), str):
        return None
    return str(data["d"])


def _key(device: str) -> str:
    return f"saga:login-device:{device}"


def failures(device: str) -> int | None:
    """The device's failed sign-ins within the cool-off; None when Redis does not answer."""
    try:
        return int(cache.get(_key(device)) or 0)
    except (RedisError, OSError):
        log.warning("login.known_device_unavailable", exc_info=True)
        return None


def count_failure(device: str, cool_off: timedelta | None) -> None:
    """One more failure for the device; every failure starts its cool-off again, as axes does."""
    timeout = int(cool_off.total_seconds()) if cool_off is not None else MAX_AGE_S
    key = _key(device)
    try:
        cache.add(key, 0, timeout=timeout)
        cache.incr(key)
        cache.touch(key, timeout=timeout)
    except (RedisError, OSError, ValueError):
        log.warning("login.known_device_unavailable", exc_info=True)
