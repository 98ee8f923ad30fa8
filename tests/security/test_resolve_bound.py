"""A DNS server that never answers cannot hold a request or a worker: the
outbound guard gives name resolution ``SAGA_OUTBOUND_RESOLVE_TIMEOUT_S`` (1 s by default), then
refuses the name as unresolvable.

Nothing here stands in for the guard or the resolver. A real web server (the Procfile's gunicorn)
and a real worker (``saga_worker``) run in a mount namespace of their own whose /etc/resolv.conf
names a UDP socket of this test that takes every query and answers none, with the C library's own
timeout set far above the bound (10 s): the system resolver really asks, really waits, and only the
guard's bound ends the wait. (``unshare`` and binding port 53 need root, which this machine's test
runs have; without them the test fails rather than passing without having proved anything.)
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from ledger.audit import Actor
from ledger.models import Event, Run
from recovery.actions import commands
from recovery.models import AgentCommand
from tests.support.processes import ROOT, database_url_for_subprocesses, free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "never-answers.saga-test.example"
BOUND_S = 1.0  # the setting's default, which these processes run with
# How much longer than the bound a busy machine may take to answer: still less than the old default
# bound (5 s), which these tests therefore refuse.
MARGIN_S = 3.0
LIBC_TIMEOUT_S = 10  # what the C library alone would wait per query
NOT_ALLOWED = (
    "resume_url is not allowed: outbound requests go only to public hosts or to hosts the operator allows."
)


@dataclass
class SilentDns:
    """A UDP socket on port 53 of a loopback address of its own that reads every query and answers
    none; ``resolv_conf`` points a C library at it."""

    address: str
    resolv_conf: Path
    queries: list[bytes] = field(default_factory=list)

    def namespaced(self, command: list[str]) -> list[str]:
        """``command`` in a mount namespace of its own where /etc/resolv.conf is ours."""
        unshare = shutil.which("unshare")
        assert unshare, "unshare (util-linux) is needed to give a process a resolver of its own"
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            str(self.resolv_conf),
            *command,
        ]

    def asked_for(self, name: str) -> bool:
        # A DNS query carries the name as length-prefixed labels.
        wire = b"".join(bytes([len(label)]) + label.encode() for label in name.split("."))
        return any(wire in query for query in self.queries)


@pytest.fixture
def silent_dns(tmp_path: Path) -> Iterator[SilentDns]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _attempt in range(20):
        address = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    else:
        raise AssertionError("no loopback address had port 53 free (binding it needs root)")
    resolv_conf = tmp_path / "resolv.conf"
    resolv_conf.write_text(f"nameserver {address}\noptions timeout:{LIBC_TIMEOUT_S} attempts:1\n")
    dns = SilentDns(address=address, resolv_conf=resolv_conf)
    stop = threading.Event()

    def swallow() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            with suppress(TimeoutError):
                dns.queries.append(sock.recvfrom(4096)[0])

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    yield dns
    stop.set()
    thread.join(timeout=5)
    sock.close()


def _env(redis_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": redis_url,
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
    }
    env.pop("SAGA_OUTBOUND_RESOLVE_TIMEOUT_S", None)  # the default bound is what is tested
    return env


def _start(command: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    # Its resolver threads may still be waiting on the silent server: no graceful shutdown.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def test_a_resolver_that_never_answers_holds_a_request_no_longer_than_the_bound(
    silent_dns, agent_key, redis_server, tmp_path
):
    """Pass: POST /runs with a resume_url whose name the silent server is asked for is answered
    422 "not allowed" after the 1 s bound (not the C library's 10 s), the server's resolver did ask
    our server, nothing is created, and the operator's audit event says the name did not resolve
    in time."""
    port = free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    web = _start(
        silent_dns.namespaced(
            [
                gunicorn,
                "saga_admin.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
                "--worker-class",
                "gthread",
                "--threads",
                "4",
            ]
        ),
        env=_env(redis_server.url),
        log=tmp_path / "web.log",
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(f"{base}/healthz"), timeout=60, what="gunicorn to serve")
        with httpx.Client(
            base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {agent_key[1]}"}
        ) as api:
            warm = api.post("/runs", json={"agent": "a", "request": "warm up"})  # a first request's imports
            assert warm.status_code == 201, warm.text
            started = time.monotonic()
            refused = api.post(
                "/runs",
                json={"agent": "a", "request": "r", "resume_url": f"http://{NAME}/commands"},
                timeout=30,
            )
            took = time.monotonic() - started
    finally:
        _stop(web)
    log = (tmp_path / "web.log").read_text(errors="replace")[-3000:]

    assert refused.status_code == 422, (refused.text, log)
    assert refused.json()["error"]["message"] == NOT_ALLOWED
    assert silent_dns.asked_for(NAME), "the server's resolver never asked the silent DNS server"
    assert BOUND_S * 0.9 <= took < BOUND_S + MARGIN_S, took
    assert Run.objects.count() == 1  # the warm-up's only
    [event] = Event.objects.filter(kind="run.refused", subject_id="resume_url")
    assert event.data["details"]["reason"] == "unresolvable"
    assert f"did not resolve within {BOUND_S:g} s" in event.reason


def test_a_resolver_that_never_answers_holds_a_worker_no_longer_than_the_bound(
    silent_dns, tenant, agent, alice, redis_server, own_redis, tmp_path
):
    """Pass: a command pushed to a resume_url whose DNS server has gone silent since the run was
    created is settled by a real worker within the bound plus a margin — recorded as not delivered
    (to be retried), the resolver having asked our server — and the worker takes the next job."""
    # Accepted when it was created (it resolved then); its DNS server stops answering afterwards.
    run = Run.objects.create(
        tenant=tenant, agent="a", request="r", owner="onboarding-agent", resume_url=f"http://{NAME}/commands"
    )
    worker = _start(
        silent_dns.namespaced([sys.executable, str(ROOT / "manage.py"), "saga_worker", "notifications"]),
        env=_env(redis_server.url),
        log=tmp_path / "worker.log",
    )
    try:
        wait_for(lambda: _worker_ready(redis_server.url), timeout=60, what="the worker to listen")
        timings = []
        for reason in ("first", "second"):
            started = time.monotonic()
            command = commands.command_issue(
                run=run, kind="resume", actor=Actor.for_user(alice), reason=reason
            )
            settled = wait_for(
                lambda c=command: AgentCommand.objects.filter(pk=c.pk).exclude(delivery_error="").first(),
                timeout=LIBC_TIMEOUT_S * 2,
                interval=0.05,
                what="the worker to settle the push",
            )
            timings.append(time.monotonic() - started)
            assert settled.delivery_attempts == 1 and settled.delivered_at is None
            assert settled.delivery_error == NOT_ALLOWED  # what the agent reads: nothing more
    finally:
        _stop(worker)

    assert silent_dns.asked_for(NAME), "the worker's resolver never asked the silent DNS server"
    # Each push waited for the bound, not for the C library: the worker was free for the next.
    assert all(BOUND_S * 0.9 <= t < BOUND_S + MARGIN_S for t in timings), timings


def _answers(url: str) -> bool:
    with suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


def _worker_ready(redis_url: str) -> bool:
    import redis
    from rq import Worker

    return bool(Worker.all(connection=redis.Redis.from_url(redis_url)))
