"""Shared personas and fixtures. Tests run against the machine's real PostgreSQL and Redis; the
engine, recovery and reliability tests also against a throwaway Redis and real worker processes.
Data builders are in tests/factories.py, everything else shared in tests/support/."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import parallel
from tests.support.pgbouncer import PgBouncer
from tests.support.processes import RedisServer, Worker, rq_pointed_at, spawn_worker

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """In the controller of a parallel run (``pytest -n N``), before any worker starts: each worker
    gets its own Redis database in its environment (execnet sets it before the worker imports
    anything), so its settings read it exactly as a serial run reads REDIS_URL — too late in
    pytest_configure, by which time pytest-django has loaded the settings."""
    from django.conf import settings

    try:
        urls = parallel.worker_redis_urls(settings.REDIS_URL, len(specs))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    for spec, url in zip(specs, urls, strict=True):
        spec.env["REDIS_URL"] = url
        spec.env[parallel.WORKER_REDIS_MARK] = url


def pytest_configure(config: pytest.Config) -> None:
    if parallel.worker_id():
        # A worker that shared a Redis database with another would flush and fill its queues.
        from django.conf import settings

        own = os.environ.get(parallel.WORKER_REDIS_MARK)
        if not own or own != settings.REDIS_URL or own != os.environ.get("REDIS_URL"):
            raise pytest.UsageError(
                f"xdist worker {parallel.worker_id()} has no Redis database of its own "
                f"(REDIS_URL={settings.REDIS_URL}); tests/conftest.py's pytest_xdist_setupnodes gives one"
            )

    # The live server's listen backlog is Django's 10; tests that race 24 connections at it (the
    # idempotency races) then lose one to "connection reset by peer" whenever the machine is busy.
    # Deep enough for every race in the suite; set before the session-wide live server starts.
    from django.core.servers.basehttp import WSGIServer

    WSGIServer.request_queue_size = 64

    # The audit table, its signed heads and the archived runs' tombstones refuse TRUNCATE
    # (statement triggers); the flush that ends a transactional test is the one TRUNCATE allowed,
    # and only for those triggers.
    import pgtrigger
    from django.test import TransactionTestCase

    teardown = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]

    def _fixture_teardown(self: TransactionTestCase) -> None:
        with pgtrigger.ignore(
            "ledger.Event:event_no_truncate",
            "ledger.SignedHead:signed_head_no_truncate",
            "ledger.ArchivedRun:archived_run_no_truncate",
        ):
            teardown(self)

    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[attr-defined]


# The lanes by folder (pyproject's markers; `make test-fast` runs none of them): every test under
# the folder gets the mark. A slow test elsewhere is marked where it is written.
LANES = {
    "e2e": "e2e",
    "reliability": "reliability",
    "bench": "slow",
}


def _lane_of(item: pytest.Item) -> str | None:
    tests = Path(__file__).resolve().parent
    try:
        folder = item.path.resolve().relative_to(tests).parts[0]
    except ValueError:  # clients/python/tests
        return None
    return LANES.get(folder)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test gets its folder's lane. And every test needs an id of its own: pytest-xdist
    hands tests out by id and runs one test of those sharing it, silently (schemathesis's
    generated tests under pytest 9.2 did)."""
    for item in items:
        lane = _lane_of(item)
        if lane:
            item.add_marker(lane)
    shared = sorted(nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1)
    if shared:
        raise pytest.UsageError(
            "tests that share a node id (a parallel run would skip them): " + ", ".join(shared)
        )


@pytest.fixture
def tenant(db):
    from ledger.models import Tenant

    return Tenant.objects.create(slug="acme", name="Acme Corp")


@pytest.fixture
def other_tenant(db):
    from ledger.models import Tenant

    return Tenant.objects.create(slug="globex", name="Globex (another tenant)")


@pytest.fixture
def agent_key(tenant):
    """The onboarding agent's key: (AgentKey, raw secret)."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create

    issued = agent_key_create(
        tenant=tenant, name="onboarding-agent", scopes=["agent"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def operator_key(tenant):
    """Acme's recovery automation: the operator scope only (reads every Acme run, decides recovery,
    approves nothing)."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create

    issued = agent_key_create(
        tenant=tenant, name="supervisor", scopes=["operator"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def approver_key(tenant):
    """Acme's approval automation: the approver scope only, owned by Trent, an approver at Acme
    (an approver key belongs to a person) who decides nothing through a login in these tests."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create

    issued = agent_key_create(
        tenant=tenant,
        name="approval-bot",
        scopes=["approver"],
        actor=Actor.system("tests"),
        owner=_user("trent", tenant, "approver"),
    )
    return issued.key, issued.secret


@pytest.fixture
def outsider_key(other_tenant):
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create

    issued = agent_key_create(
        tenant=other_tenant, name="globex-agent", scopes=["agent", "operator"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def agent(agent_key):
    from ledger.audit import Actor

    return Actor.for_key(agent_key[0])


def _user(username: str, tenant, role: str):
    from django.contrib.auth import get_user_model

    from ledger.models import Membership

    user = get_user_model().objects.create_user(username=username, password="correct-horse-battery")
    if tenant is not None:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


@pytest.fixture
def alice(tenant):
    """Alice is an operator at Acme."""
    return _user("alice", tenant, "operator")


@pytest.fixture
def bob(tenant):
    """Bob approves risky actions at Acme."""
    return _user("bob", tenant, "approver")


@pytest.fixture
def carol(tenant):
    """Carol can only look (viewer at Acme)."""
    return _user("carol", tenant, "viewer")


@pytest.fixture
def dave(tenant):
    """Dave is an Acme admin."""
    return _user("dave", tenant, "admin")


@pytest.fixture
def mallory(other_tenant):
    """Mallory is an operator at Globex, an outsider to Acme."""
    return _user("mallory", other_tenant, "operator")


# --- Policies ------------------------------------------------------------------------------------


@pytest.fixture
def onboarding_policies(db):
    """The onboarding scenario's tool policies (``tests.factories.load_onboarding_policies``)."""
    from tests.factories import load_onboarding_policies

    return load_onboarding_policies()


# --- A Redis of our own, and real worker processes -------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _redis_left_as_found() -> Iterator[None]:
    """The machine's Redis database this session enqueues into (REDIS_URL's; one per xdist worker)
    is left as the session found it: every key the session created there (RQ's jobs, results and
    queues, throttle windows, the scheduler's claims) is deleted at its end. Set up first, so it is
    torn down last, after the live servers and worker processes that write there."""
    import redis
    from django.conf import settings

    connection = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)
    try:
        found = set(connection.scan_iter(count=1000))
    except redis.RedisError:
        found = None  # no Redis at the start: the tests that need it say so themselves
    yield
    if found is None:
        return
    try:
        created = [key for key in connection.scan_iter(count=1000) if key not in found]
        for start in range(0, len(created), 500):
            connection.delete(*created[start : start + 500])
    except redis.RedisError:
        pass  # Redis went away meanwhile (an outage test's restart): nothing left to tidy here


@pytest.fixture(scope="session")
def redis_server(django_db_setup: Any) -> Iterator[RedisServer]:
    """A redis-server of the suite's own, never the machine's shared one, so a test may stop or
    flush it. From its first use to the end of the session, RQ's queues point at it."""
    server = RedisServer()
    server.start()
    try:
        with rq_pointed_at(server):
            yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: Any) -> Iterator[PgBouncer]:
    """A PgBouncer of the suite's own in transaction pooling mode, in front of this process's test
    database (its name known only now that pytest-django made it): ``pgbouncer.url()``."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    server = PgBouncer(
        host=db["HOST"],
        port=int(db["PORT"] or 5432),
        user=db["USER"],
        password=db["PASSWORD"],
        databases=[db["NAME"]],
    )
    try:
        server.start()  # a start that fails still leaves its folder (and any process) to stop()
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The throwaway Redis, empty, and started again if a test stopped it."""
    if redis_server.process is None:
        redis_server.start()
    redis_server.flush()
    yield redis_server
    if redis_server.process is None:
        redis_server.start()


@pytest.fixture
def workers(transactional_db: Any, redis_server: RedisServer) -> Iterator[list[Worker]]:
    """Every worker a test started (``start_worker`` appends), stopped at the end."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Environment every worker ``start_worker`` spawns gets on top of the engine's fast clocks; a
    directory's conftest may override it."""
    return {}


@pytest.fixture
def start_worker(
    workers: list[Worker], worker_env: dict[str, str], redis_server: RedisServer, tmp_path: Path
) -> Callable[..., Worker]:
    """``start_worker(**env)``: a real ``saga_worker`` process on this test's database and the
    throwaway Redis."""

    def start(**extra_env: str) -> Worker:
        worker = spawn_worker(
            redis_url=redis_server.url,
            log_path=tmp_path / f"worker-{len(workers)}.log",
            env={**worker_env, **extra_env},
        )
        workers.append(worker)
        return worker

    return start


# --- Calling the WSGI application directly ---------------------------------------------------


@pytest.fixture
def keep_test_connection() -> Iterator[None]:
    """schemathesis calls the WSGI app directly, whose request signals would close the test's
    database connection mid-transaction (django.test.Client detaches them the same way)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)
