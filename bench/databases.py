"""The benchmark's own databases: a fresh PostgreSQL database made and dropped by URL, and a
Redis database claimed for a smoke run."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def fresh_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def claim_redis_db(base_url: str) -> tuple[str, Any]:
    """Smoke runs (inside `make test`, maybe several at once on one machine) claim a free Redis
    database among 8-15 with a key that expires, instead of sharing one."""
    from redis import Redis

    parts = urlsplit(base_url)
    for db in range(8, 16):
        url = urlunsplit(parts._replace(path=f"/{db}"))
        redis = Redis.from_url(url)
        if redis.set("saga-bench:claim", str(os.getpid()), nx=True, ex=1800):
            return url, redis
    raise RuntimeError("no free Redis database among 8-15 for the benchmark")
