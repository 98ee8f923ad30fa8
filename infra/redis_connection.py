"""How every process finds Redis: ``REDIS_URL`` alone, or the primary that Redis Sentinel names.

Without Sentinel, ``REDIS_URL`` is the server (``redis://`` or ``rediss://`` for TLS). With
``REDIS_SENTINELS=host:port,host:port`` and ``REDIS_SENTINEL_MASTER=<name>`` the primary's address
is asked of the sentinels, and asked again when a connection to it fails or it answers as a
replica (after a failover); ``REDIS_URL`` then gives only what a connection to the primary carries,
its database number, username, password and TLS (its host and port are not used);
``REDIS_SENTINEL_PASSWORD`` is the sentinels' own password, when they have one.

Every connection the server opens comes from the two settings built here: ``RQ_QUEUES`` (the
queues, the worker, its scheduler, the probes, the periodic duties' election, django-rq's pages:
all through django-rq's ``get_connection``, which speaks Sentinel itself) and ``CACHES`` (the API's
throttle counters, through Django's Redis cache, given the pool class below).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is, as the environment says."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    sentinel_password: str = ""

    def connection_kwargs(self) -> dict[str, Any]:
        """What a connection to the primary carries, from ``url``: database, credentials, TLS."""
        parsed = parse_url(self.url)  # type: ignore[no-untyped-call]
        kwargs: dict[str, Any] = {"db": int(parsed.get("db") or 0)}
        for name in ("username", "password"):
            if parsed.get(name):
                kwargs[name] = parsed[name]
        if self.url.startswith("rediss://"):
            kwargs["ssl"] = True
        return kwargs

    def sentinel_kwargs(self) -> dict[str, Any]:
        return {"password": self.sentinel_password} if self.sentinel_password else {}


def sentinels_from(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (a port left out is Sentinel's 26379; IPv6 in brackets)."""
    found = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        host, port = entry, str(DEFAULT_SENTINEL_PORT)
        if entry.startswith("["):
            host, _, rest = entry[1:].partition("]")
            port = rest.removeprefix(":") or port
        elif entry.count(":") == 1:
            host, port = entry.split(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ImproperlyConfigured(
                f"REDIS_SENTINELS: {entry!r} is not host:port (e.g. sentinel-1:26379)."
            )
        found.append((host, int(port)))
    if not found:
        raise ImproperlyConfigured("REDIS_SENTINELS is set but names no sentinel (host:port,host:port).")
    return tuple(found)


def redis_target(
    url: str, *, sentinels: str = "", master: str = "", sentinel_password: str = ""
) -> RedisTarget:
    """The target the variables describe, or ``ImproperlyConfigured`` naming what is wrong."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured("REDIS_URL must start with redis://, rediss:// (TLS) or unix://.")
    if not sentinels.strip():
        if master.strip():
            raise ImproperlyConfigured(
                "REDIS_SENTINEL_MASTER is set but REDIS_SENTINELS is not: set both or neither."
            )
        return RedisTarget(url=url)
    if not master.strip():
        raise ImproperlyConfigured(
            "REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER is not: the name the sentinels monitor the primary by."
        )
    if url.startswith("unix://"):
        raise ImproperlyConfigured(
            "With REDIS_SENTINELS, REDIS_URL must be redis:// or rediss:// (not a socket)."
        )
    return RedisTarget(
        url=url,
        sentinels=sentinels_from(sentinels),
        master=master.strip(),
        sentinel_password=sentinel_password,
    )


def rq_queue(target: RedisTarget, **extra: Any) -> dict[str, Any]:
    """One ``RQ_QUEUES`` entry (django-rq's keys) for ``target``, with ``extra`` (its timeout)."""
    if not target.sentinels:
        return {"URL": target.url, **extra}
    kwargs = target.connection_kwargs()
    return {
        "SENTINELS": [list(address) for address in target.sentinels],
        "MASTER_NAME": target.master,
        "DB": kwargs.pop("db"),
        "PASSWORD": kwargs.pop("password", None),
        # In CONNECTION_KWARGS, not USERNAME: django-rq's pages rebuild a queue's connection from
        # its URL-like keys (filter_connection_params), which keep CONNECTION_KWARGS only.
        "CONNECTION_KWARGS": kwargs,
        "SENTINEL_KWARGS": target.sentinel_kwargs(),
        **extra,
    }


def cache(target: RedisTarget, **extra: Any) -> dict[str, Any]:
    """``CACHES["default"]`` (Django's Redis cache) for ``target``, with ``extra`` (prefix, timeout)."""
    config: dict[str, Any] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": target.url,
        **extra,
    }
    if target.sentinels:
        config["OPTIONS"] = {
            "pool_class": f"{__name__}.SentinelCachePool",
            "sentinels": target.sentinels,
            "service_name": target.master,
            "sentinel_kwargs": target.sentinel_kwargs(),
        }
    return config


class SentinelCachePool:
    """The pool class Django's Redis cache is given with Sentinel: it builds a pool with
    ``pool_class.from_url(LOCATION, **OPTIONS)``, which redis-py's Sentinel pool does not offer."""

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        sentinels: tuple[tuple[str, int], ...],
        service_name: str,
        sentinel_kwargs: dict[str, Any],
        **options: Any,
    ) -> SentinelConnectionPool:
        kwargs = {**RedisTarget(url=url).connection_kwargs(), **options}
        # redis-py's Sentinel is not annotated: typed here, at the one place it is built.
        manager = Sentinel(list(sentinels), sentinel_kwargs=sentinel_kwargs or None, **kwargs)  # type: ignore[no-untyped-call]
        client = manager.master_for(service_name)  # type: ignore[no-untyped-call]
        pool: SentinelConnectionPool = client.connection_pool
        return pool
