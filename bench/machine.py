"""What the numbers were measured on: the report is meaningless without it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        for line in open("/proc/meminfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return 0.0


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _show(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute(f"SHOW {name}").fetchone()  # noqa: S608 - fixed names
    assert row is not None, "SHOW always returns one row"
    return row[0]


def describe(database_url: str, redis_url: str) -> dict[str, Any]:
    import psycopg
    from redis import Redis

    with psycopg.connect(database_url) as conn:
        pg_version = _show(conn, "server_version")
        pg_settings = {
            name: _show(conn, name)
            for name in ("synchronous_commit", "shared_buffers", "max_connections", "fsync")
        }
    redis_version = Redis.from_url(redis_url).info("server").get("redis_version", "?")
    try:
        git = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,  # noqa: S607
            check=False,
        ).stdout.strip()
    except OSError:
        git = "?"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "django": _version("Django"),
        "django_ninja": _version("django-ninja"),
        "postgresql": pg_version,
        "postgresql_settings": pg_settings,
        "redis": redis_version,
        "rq": _version("rq"),
        "django_rq": _version("django-rq"),
        "gunicorn": _version("gunicorn"),
        "granian": _version("granian"),
        "psycopg": _version("psycopg"),
        "git_commit": git,
        "load_before": loadavg(),
    }
