"""Fixed-window rate limits shared by every HTTP entry point (the API's gate and per-key throttle,
Slack's signed endpoints): an atomic counter per name and window in Django's cache (Redis in
production), so every web process shares one count, and the client address a request is counted
against. It lives in the ledger, below the API and the dashboard, because both count with it and
neither may import the other.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass

import structlog
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.http import HttpRequest
from redis.exceptions import RedisError

from infra.conf import saga
from infra.durations import period_read

log = structlog.get_logger(__name__)


def client_network(request: HttpRequest) -> ipaddress.IPv4Address | ipaddress.IPv6Network | None:
    """Who a request is counted against: the one rule the API's per-address throttle and the
    login lockout share. ``REMOTE_ADDR``, unless ``SAGA_TRUSTED_PROXY_HOPS`` says that many
    proxies of ours stand in front: then the address the outermost of them saw, which is that many
    entries from the right of ``X-Forwarded-For`` (entries further left are whatever the client
    wrote, so they are never believed). An IPv6 client is counted by its /64, since one host
    commonly holds a whole /64 and could otherwise change address per request; an IPv4-mapped
    IPv6 address is its IPv4 address. None when there is no usable address."""
    raw = request.META.get("REMOTE_ADDR", "")
    hops = saga().trusted_proxy_hops
    if hops > 0:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [part for part in forwarded if part]
        if forwarded:
            raw = forwarded[-min(hops, len(forwarded))]
    try:
        address = ipaddress.ip_address(raw.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        return ipaddress.IPv6Network(f"{address}/64", strict=False)
    return address


def client_address(request: HttpRequest) -> str:
    """``client_network`` as a throttle key ("unknown" when there is no usable address)."""
    network = client_network(request)
    return str(network) if network is not None else "unknown"


_SIZES = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "kib": 1024,
    "mb": 1000**2,
    "mib": 1024**2,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_rate(rate: str) -> tuple[int, int]:
    """ "6000/m" → (6000, 60); "10/5s" → (10, 5); a byte rate may name its unit: "10MiB/m" →
    (10485760, 60). The period is a duration of whole seconds (``infra.durations.period_read``:
    "/m" is a minute, "/day" a day, no period a second)."""
    count, _, period = rate.partition("/")
    duration = period_read(period)
    seconds = duration.seconds if duration is not None else 0
    if not isinstance(seconds, int) or seconds < 1:
        raise ValueError(f"Unknown throttle period in {rate!r}")
    number = "".join(ch for ch in count.strip() if ch.isdigit())
    size = count.strip()[len(number) :].strip().lower()
    if not number or size not in _SIZES:
        raise ValueError(f"Unknown throttle count in {rate!r}")
    return int(number) * _SIZES[size], seconds


def _count_in_windows(counters: list[tuple[str, int, int]]) -> list[int]:
    """Add ``amount`` to each ``(cache key, ttl, amount)`` counter and return the new values. On
    Redis: ``SET NX EX`` + ``INCRBY`` per counter, all in one pipelined round trip (each atomic;
    a counter is a plain integer, which is also how Django's Redis cache stores ints, so
    ``cache.get`` reads it). Any other cache: ``add`` + ``incr``."""
    backend = caches["default"]  # the backend itself (``cache`` is a proxy to it)
    if isinstance(backend, RedisCache):
        # Django's Redis cache writes every key to its first server: one client, one pipeline.
        full_keys = [backend.make_and_validate_key(cache_key) for cache_key, _, _ in counters]
        client = backend._cache.get_client(full_keys[0], write=True)
        pipe = client.pipeline(transaction=False)
        for full_key, (_, ttl, amount) in zip(full_keys, counters, strict=True):
            pipe.set(full_key, 0, ex=ttl, nx=True)
            pipe.incrby(full_key, amount)
        return [int(value) for value in pipe.execute()[1::2]]
    out = []
    for cache_key, ttl, amount in counters:
        cache.add(cache_key, 0, timeout=ttl)
        out.append(int(cache.incr(cache_key, amount)))
    return out


@dataclass(frozen=True)
class Window:
    count: int  # what this window has counted, this request included
    limit: int
    retry_after: float  # seconds until the window ends

    @property
    def allowed(self) -> bool:
        return self.count <= self.limit


def fixed_windows(counts: list[tuple[str, str, int]]) -> list[Window] | None:
    """Count ``amount`` against each ``(name, rate, amount)`` in the current window of its rate
    ("60/m"; a byte rate may say "10MiB/m"), in one round trip. None when the cache cannot be
    reached: a rate limit must not take the API down, so the caller lets the request through
    (and it is logged)."""
    now = time.time()
    parsed = [(name, *parse_rate(rate), amount) for name, rate, amount in counts]
    windows = [int(now // period) for _, _, period, _ in parsed]
    try:
        values = _count_in_windows(
            [
                (f"saga:throttle:{name}:{period}:{window}", period + 5, amount)
                for (name, _, period, amount), window in zip(parsed, windows, strict=True)
            ]
        )
    except (RedisError, OSError):  # Redis unreachable or failing: fail open (see above)
        log.warning("throttle.cache_unavailable", exc_info=True)
        return None
    return [
        Window(count=value, limit=limit, retry_after=(window + 1) * period - now)
        for value, (_, limit, period, _), window in zip(values, parsed, windows, strict=True)
    ]


def fixed_window(name: str, rate: str) -> Window | None:
    """Count one request against ``name`` in the current window of ``rate``."""
    windows = fixed_windows([(name, rate, 1)])
    return windows[0] if windows is not None else None
