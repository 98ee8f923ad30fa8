"""What the suite needs to run in parallel (pytest-xdist, ``pytest -n N``): each worker process is
a test session of its own, with its own PostgreSQL test database (pytest-django adds the worker's
id: test_<name>_gw0, …) and its own Redis database (the next ones after REDIS_URL's, given to the
worker's environment before it starts, so its settings, its caches, RQ's queues and every process a
test starts read it as a serial run reads REDIS_URL). Files a test writes outside ``tmp_path`` carry
the worker's id, or are written under a lock."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Redis's default ``databases 16``: numbers 0-15.
REDIS_DATABASES = 16
# Set in a worker's environment together with its REDIS_URL: the worker checks it got both.
WORKER_REDIS_MARK = "XDIST_WORKER_REDIS_URL"


def worker_id() -> str | None:
    """``gw0``, ``gw1``, … in an xdist worker; None in a serial run (and in the controller)."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def redis_db_of(url: str) -> int:
    """The database number a Redis URL selects (``/N`` or ``?db=N``; 0 when it names none)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if "db" in query:
        return int(query["db"])
    path = parts.path.strip("/")
    return int(path) if parts.scheme != "unix" and path else 0


def with_redis_db(url: str, db: int) -> str:
    """``url`` on database ``db``, in the form it came in."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if "db" in query or parts.scheme == "unix":
        return url.split("?", 1)[0] + "?" + urlencode({**query, "db": str(db)})
    return urlunsplit(parts._replace(path=f"/{db}"))


def worker_redis_urls(base_url: str, workers: int) -> list[str]:
    """One Redis database per worker: the base URL's, then the next ones. Refuses (ValueError,
    saying what to do) when they would run past Redis's 16 databases rather than wrap around onto
    a database that something else (another clone, the playground) uses."""
    first = redis_db_of(base_url)
    last = first + workers - 1
    if last >= REDIS_DATABASES:
        raise ValueError(
            f"{workers} test workers need Redis databases {first}-{last}, but Redis has only "
            f"0-{REDIS_DATABASES - 1} (REDIS_URL={base_url}). Run fewer workers (-n) or point "
            f"REDIS_URL at a lower database."
        )
    return [with_redis_db(base_url, first + index) for index in range(workers)]


def per_worker(path: Path) -> Path:
    """``artifacts/e2e-worker.log`` → ``artifacts/e2e-worker-gw1.log`` in worker gw1; unchanged in
    a serial run."""
    worker = worker_id()
    return path.with_name(f"{path.stem}-{worker}{path.suffix}") if worker else path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` while reading, merging and writing ``path``: the
    workers of one run finish their sessions at about the same time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_name(path.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
