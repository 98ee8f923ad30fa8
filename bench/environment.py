"""The environment of the processes the benchmark starts (the Procfile's web and worker lines, in
production mode) and of the orchestrator's own Django."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.procs import ROOT


def child_env(*, database_url: str, redis_url: str, port: int, settings_module: str) -> dict[str, str]:
    env = dict(os.environ)
    # setup_django() sets DB_CONN_MAX_AGE=0 for this orchestrator only; inherited, it would make
    # every gunicorn request open (and PostgreSQL fork a backend for) a fresh connection, which is
    # not how the product is deployed (its settings keep connections for 60 s).
    env.pop("DB_CONN_MAX_AGE", None)
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "PORT": str(port),
            "DJANGO_SETTINGS_MODULE": settings_module,
            # Production mode, as deployed: DEBUG off (no query log kept in memory), TLS ends at a
            # proxy in front, so no SSL redirect and cookies usable over plain HTTP on loopback.
            "DEBUG": "0",
            "SECRET_KEY": env.get("SECRET_KEY") or "bench-only-secret-key-not-for-production-0123456789",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "0",
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
            # The limiter stays on (its cost is measured) with a ceiling the benchmark cannot hit:
            # the question is what the ledger can take, not where the default limit sits.
            "SAGA_THROTTLE_RATE": "10000000/m",
            "SAGA_THROTTLE_BYTES": "1000GiB/m",
            "SAGA_UNAUTHENTICATED_RATE": "10000000/m",
            # seed_bench writes running runs with fresh heartbeats; a sweeper must not turn them
            # into agent_lost items (and burn CPU doing it) while other figures are measured.
            "SAGA_HEARTBEAT_TIMEOUT_S": "86400",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def setup_django(env: dict[str, str]) -> None:
    for key in (
        "DATABASE_URL",
        "REDIS_URL",
        "DEBUG",
        "SECRET_KEY",
        "ALLOWED_HOSTS",
        "SECURE_SSL_REDIRECT",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SAGA_THROTTLE_RATE",
        "SAGA_THROTTLE_BYTES",
        "SAGA_UNAUTHENTICATED_RATE",
        "SAGA_HEARTBEAT_TIMEOUT_S",
    ):
        os.environ[key] = env[key]
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    # The orchestrator itself is not a request handler: keep its connections short-lived so a
    # DROP DATABASE at the end is not blocked by them.
    os.environ["DB_CONN_MAX_AGE"] = "0"
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
