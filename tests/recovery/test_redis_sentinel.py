"""Redis through Sentinel (``REDIS_SENTINELS``, ``REDIS_SENTINEL_MASTER``: infra/redis_connection.py).

The settings' side: what the variables build, and what they refuse. The processes' side, real: a
``redis-server`` and a ``redis-server --sentinel`` monitoring it, on ports of their own; the
Procfile's web and a ``saga_worker`` given only the sentinel's address (``REDIS_URL`` names a host
that does not exist, so nothing reaches Redis but through Sentinel). The web answers ``/readyz``
with Redis ok, takes an operator's compensate and queues the unwind; the worker carries it out,
a refused call retried through RQ's scheduler;
the queue, the worker's registration and the API's throttle counters are all in the primary the
sentinel named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from infra import redis_connection
from infra.redis_connection import redis_target
from recovery.models import Unwind
from tests.factories import HR_PATH, WS_PATH, load_onboarding_policies, onboarding_saga
from tests.support.processes import (
    RedisServer,
    Reply,
    Worker,
    database_url_for_subprocesses,
    dump_worker_logs,
    free_port,
    procfile_web,
    quiet_port,
    spawn_worker,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
MASTER = "saga-primary"
# No such host: a connection that did not ask the sentinel fails.
UNREACHABLE_URL = "redis://redis-only-through-sentinel.invalid:6379/3"


# --- What the variables build ---------------------------------------------------------------------


def test_without_sentinels_the_url_is_the_server():
    target = redis_target("rediss://:pw@redis.internal:6380/2")
    assert redis_connection.rq_queue(target, DEFAULT_TIMEOUT=9) == {
        "URL": "rediss://:pw@redis.internal:6380/2",
        "DEFAULT_TIMEOUT": 9,
    }
    assert "OPTIONS" not in redis_connection.cache(target)


def test_with_sentinels_the_url_gives_database_credentials_and_tls():
    target = redis_target(
        "rediss://saga:pw@ignored:1/4",
        sentinels="s1:26379, s2, [::1]:26380",
        master="mymaster",
        sentinel_password="spw",
    )
    assert target.sentinels == (("s1", 26379), ("s2", 26379), ("::1", 26380))
    queue = redis_connection.rq_queue(target, DEFAULT_TIMEOUT=9)
    assert queue == {
        "SENTINELS": [["s1", 26379], ["s2", 26379], ["::1", 26380]],
        "MASTER_NAME": "mymaster",
        "DB": 4,
        "PASSWORD": "pw",
        "CONNECTION_KWARGS": {"username": "saga", "ssl": True},
        "SENTINEL_KWARGS": {"password": "spw"},
        "DEFAULT_TIMEOUT": 9,
    }
    options = redis_connection.cache(target, KEY_PREFIX="saga")["OPTIONS"]
    assert options["pool_class"] == "infra.redis_connection.SentinelCachePool"
    assert (options["service_name"], options["sentinel_kwargs"]) == ("mymaster", {"password": "spw"})


@pytest.mark.parametrize(
    ("url", "sentinels", "master", "says"),
    [
        ("redis://x/0", "s1:26379", "", "REDIS_SENTINEL_MASTER is not"),
        ("redis://x/0", "", "mymaster", "REDIS_SENTINELS is not"),
        ("redis://x/0", "s1:port", "m", "'s1:port' is not host:port"),
        ("redis://x/0", "s1:70000", "m", "'s1:70000' is not host:port"),
        ("redis://x/0", " , ", "m", "names no sentinel"),
        ("unix:///run/redis.sock", "s1", "m", "must be redis:// or rediss://"),
        ("localhost:6379", "", "", "REDIS_URL must start with"),
    ],
)
def test_a_configuration_that_cannot_work_is_refused_naming_the_variable(url, sentinels, master, says):
    with pytest.raises(ImproperlyConfigured, match=says.replace("(", r"\(")):
        redis_target(url, sentinels=sentinels, master=master)


def test_nothing_starts_with_sentinels_but_no_master_name():
    env = {**os.environ, "REDIS_SENTINELS": "127.0.0.1:26379", "REDIS_SENTINEL_MASTER": ""}
    done = subprocess.run(
        [sys.executable, "-m", "saga_admin", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "Saga Admin will not start: REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER is not" in done.stderr


# --- Real processes through a real Sentinel ------------------------------------------------------


class SentinelServer:
    """``redis-server --sentinel`` monitoring ``primary`` as ``MASTER``, with a quorum of one."""

    def __init__(self, primary: RedisServer, folder: Path) -> None:
        self.port = quiet_port()
        config = folder / "sentinel.conf"  # Sentinel rewrites its configuration file as it learns
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 5000\n"
        )
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed (it runs as the sentinel too)"
        self.process = subprocess.Popen(
            [binary, str(config), "--sentinel"],
            stdout=(folder / "sentinel.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        client = redis.Redis(port=self.port, decode_responses=True)
        wait_for(
            lambda: self._names_the_primary(client, primary.port), timeout=10, what="the sentinel to start"
        )

    def _names_the_primary(self, client: redis.Redis, port: int) -> bool:
        assert self.process.poll() is None, "redis-server --sentinel exited"
        with suppress(redis.RedisError):
            named: Any = client.sentinel_get_master_addr_by_name(MASTER)  # (host, port); typed as a bool
            return tuple(named) == ("127.0.0.1", port)
        return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


class Replica:
    """A second ``redis-server``, a replica of ``primary``, which the sentinel may promote."""

    def __init__(self, primary: RedisServer, folder: Path) -> None:
        self.port = quiet_port()
        binary = shutil.which("redis-server")
        assert binary
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                # A replica writes the primary's snapshot to disk as it syncs (dump.rdb in its
                # working directory, the checkout's, unless told otherwise).
                "--dir",
                str(folder),
                "--replicaof",
                "127.0.0.1",
                str(primary.port),
            ],
            stdout=(folder / "replica.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[tuple[RedisServer, SentinelServer]]:
    primary = RedisServer()
    primary.start()
    watcher = None
    try:
        watcher = SentinelServer(primary, tmp_path)
        yield primary, watcher
    finally:
        if watcher is not None:
            watcher.stop()
        primary.stop()


def _through(watcher: SentinelServer) -> dict[str, str]:
    return {
        "REDIS_URL": UNREACHABLE_URL,
        "REDIS_SENTINELS": f"127.0.0.1:{watcher.port}",
        "REDIS_SENTINEL_MASTER": MASTER,
    }


@contextmanager
def _web_and_worker(watcher: SentinelServer, folder: Path) -> Iterator[tuple[str, Worker]]:
    """The Procfile's web and a worker, both given only the sentinel; yields the web's URL."""
    port = free_port()
    web_env = {
        **os.environ,
        **_through(watcher),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "DATABASE_URL": database_url_for_subprocesses(),
        "PORT": str(port),
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "LOG_LEVEL": "WARNING",
    }
    worker = spawn_worker(redis_url=UNREACHABLE_URL, log_path=folder / "worker.log", env=_through(watcher))
    try:
        with procfile_web(web_env, folder / "web.log"):
            yield f"http://127.0.0.1:{port}", worker
    finally:
        worker.stop()


def _compensate(base: str, item_id: str, key: str, worker: Worker) -> None:
    """An operator's compensate through the web, and the unwind carried out."""
    response = httpx.post(
        f"{base}/api/v1/recovery/{item_id}/compensate",
        json={"reason": "through sentinel"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    unwind_id = response.json()["id"]
    try:
        wait_for(
            lambda: Unwind.objects.get(pk=unwind_id).status == Unwind.Status.COMPLETED,
            timeout=45,
            what="the unwind to complete",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc


def _ready(base: str) -> None:
    ready = httpx.get(f"{base}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["redis"] == "ok"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_the_web_and_a_worker_carry_out_an_unwind_through_sentinel(
    tenant, agent, operator_key, webhooks, sentinel, tmp_path
):
    primary, watcher = sentinel
    load_onboarding_policies(webhooks=webhooks)
    # The licence's first cancellation is refused: its retry waits in RQ's scheduler (a delayed
    # job), which a worker's scheduler moves to the queue, through Sentinel too.
    webhooks.script[WS_PATH] = [Reply(503, {"error": "busy"})]
    saga = onboarding_saga(tenant, agent)
    with _web_and_worker(watcher, tmp_path) as (base, worker):
        _ready(base)
        _compensate(base, saga.item.pk, operator_key[1], worker)
    assert [c.path for c in webhooks.calls] == [WS_PATH, WS_PATH, HR_PATH]
    # Everything in the primary the sentinel named, database 3 of REDIS_URL: the worker's
    # registration, the jobs it ran, and the API's throttle counters (the cache).
    in_primary = redis.Redis(port=primary.port, db=3)
    assert in_primary.scard("rq:workers") >= 1
    assert any(in_primary.scan_iter("rq:job:*"))
    assert any(in_primary.scan_iter("saga:*"))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_after_a_failover_the_same_web_and_worker_carry_on_with_the_new_primary(
    tenant, agent, operator_key, webhooks, sentinel, tmp_path
):
    """The sentinel promotes the replica (``SENTINEL FAILOVER``); the web and the worker, not
    restarted, find the new primary: ``/readyz`` ok, and a second unwind is carried out there."""
    primary, watcher = sentinel
    replica = Replica(primary, tmp_path)
    try:
        control = redis.Redis(port=watcher.port, decode_responses=True)
        wait_for(lambda: control.sentinel_slaves(MASTER), timeout=30, what="the sentinel to find the replica")
        load_onboarding_policies(webhooks=webhooks)
        before = onboarding_saga(tenant, agent)
        after = onboarding_saga(tenant, agent, name="Bea Brown", email="bea@company.com")
        with _web_and_worker(watcher, tmp_path) as (base, worker):
            _compensate(base, before.item.pk, operator_key[1], worker)
            assert control.execute_command("SENTINEL", "FAILOVER", MASTER)
            wait_for(
                lambda: tuple(control.sentinel_get_master_addr_by_name(MASTER))[1] == replica.port,
                timeout=30,
                what="the replica to be promoted",
            )
            wait_for(lambda: _answers_ok(base), timeout=30, what="/readyz through the new primary")
            _compensate(base, after.item.pk, operator_key[1], worker)
            assert worker.process.poll() is None  # the same worker process throughout
        assert redis.Redis(port=replica.port, db=3).info("replication")["role"] == "master"
    finally:
        replica.stop()


def _answers_ok(base: str) -> bool:
    with suppress(httpx.HTTPError):
        response = httpx.get(f"{base}/readyz", timeout=5)
        return response.status_code == 200 and response.json()["redis"] == "ok"
    return False
