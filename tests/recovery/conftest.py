"""Fixtures for the recovery engine: a throwaway Redis (so tests may stop it), a signed-webhook
test server, real `saga_worker` processes, and the onboarding saga from the design story."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from saga_admin.client.signing import verify_signature

ROOT = Path(__file__).resolve().parents[2]

# The engine's clocks, shortened so crash recovery is observable in seconds.
FAST_ENGINE = {
    "SAGA_STEP_LEASE_S": "2",
    "SAGA_SWEEP_INTERVAL_S": "1",
    "SAGA_WEBHOOK_TIMEOUT_S": "1.5",
    "SAGA_RETRY_BACKOFF_BASE_S": "0.2",
    "SAGA_RETRY_BACKOFF_MAX_S": "1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


# --- A Redis of our own ----------------------------------------------------------------------


class RedisServer:
    """redis-server on a free port, without persistence: stopping it loses every job, like a
    crashed Redis. Never the machine's shared instance."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for the recovery tests"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        import redis

        client = redis.Redis.from_url(self.url)
        wait_for(lambda: self._ping(client), timeout=10, what="redis-server to start")

    @staticmethod
    def _ping(client: Any) -> bool:
        import redis

        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture(scope="session")
def redis_server(django_db_setup: Any) -> Iterator[RedisServer]:
    from django.conf import settings

    server = RedisServer()
    server.start()
    saved = {name: dict(config) for name, config in settings.RQ_QUEUES.items()}
    for config in settings.RQ_QUEUES.values():
        config["URL"] = server.url
    try:
        yield server
    finally:
        for name, config in saved.items():
            settings.RQ_QUEUES[name].update(config)
        server.stop()


@pytest.fixture(autouse=True)
def _own_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """Every recovery test talks to the throwaway Redis, started again if a test stopped it."""
    if redis_server.process is None:
        redis_server.start()
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    yield redis_server
    if redis_server.process is None:
        redis_server.start()


# --- A compensating service that checks signatures -------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    block: threading.Event | None = None  # hold the request open until set (a slow tool)


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes
    signature_ok: bool
    at: float


@dataclass
class WebhookServer:
    secrets: dict[str, str]
    calls: list[Call] = field(default_factory=list)
    script: dict[str, list[Reply]] = field(default_factory=dict)
    arrived: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def calls_to(self, path: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.path == path]

    def next_reply(self, path: str) -> Reply:
        with self.lock:
            queue = self.script.get(path) or []
            return queue.pop(0) if queue else Reply(200, {"state": {"compensated": path}})


def _handler_for(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            secret = server.secrets.get(self.path, "")
            ok = verify_signature(secret, dict(self.headers.items()), raw)
            call = Call(self.path, dict(self.headers.items()), json.loads(raw or b"{}"), raw, ok, time.time())
            with server.lock:
                server.calls.append(call)
            server.arrived.set()
            if not ok:
                self._reply(401, {"error": "bad signature"})
                return
            reply = server.next_reply(self.path)
            if reply.block is not None:
                reply.block.wait(timeout=30)
            self._reply(reply.status, reply.body)

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the worker that called us was killed: nobody is listening

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    return Handler


HR_PATH = "/hr/delete_user"
WS_PATH = "/workspace/cancel_license"


@pytest.fixture
def webhooks() -> Iterator[WebhookServer]:
    server = WebhookServer(secrets={HR_PATH: "hr-secret", WS_PATH: "ws-secret"})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(server))
    httpd.daemon_threads = True
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    httpd.shutdown()
    httpd.server_close()


# --- Real worker processes -------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (rq's work horses call setpgrp, so a process-group kill misses
    them; a crashed machine would not)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class Worker:
    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    def kill_hard(self) -> None:
        """SIGKILL the worker's whole process group and its work horses: a crashed host."""
        victims = _descendants(self.process.pid)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            victims = _descendants(self.process.pid)
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
            for pid in [self.process.pid, *victims]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.process.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def start_worker(transactional_db: Any, redis_server: RedisServer, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    from django.conf import settings

    db = settings.DATABASES["default"]
    database_url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    started: list[Worker] = []

    def start(**extra_env: str) -> Worker:
        env = {**os.environ, **FAST_ENGINE, "DATABASE_URL": database_url, "REDIS_URL": redis_server.url,
               "DB_CONN_MAX_AGE": "0", "LOG_LEVEL": "WARNING", **extra_env}
        log_path = tmp_path / f"worker-{len(started)}.log"
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "saga_worker", "default", "compensations", "notifications"],
            cwd=ROOT, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        worker = Worker(process, log_path)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def dump_worker_logs(workers: list[Worker]) -> str:
    return "\n".join(f"--- worker {i} ---\n{w.log()[-4000:]}" for i, w in enumerate(workers))


# --- The onboarding saga -----------------------------------------------------------------------


@dataclass
class Saga:
    run: Any
    create_user: Any
    provision_license: Any
    send_welcome: Any
    item: Any = None


def load_onboarding_policies(*, license_risk: str = "medium", license_approval: str = "auto",
                             webhooks: WebhookServer | None = None, auto_compensate: str | None = None) -> None:
    from ledger.models import Compensator, PolicySet, ToolPolicy

    ToolPolicy.objects.create(tool="hr.create_user", risk="medium", approval="auto", action_class="internal_update",
                              compensation="custom")
    ToolPolicy.objects.create(tool="workspace.provision_license", risk=license_risk, approval=license_approval,
                              action_class="external_reversible", compensation="custom")
    ToolPolicy.objects.create(tool="email.send_welcome", risk="low", approval="auto",
                              action_class="external_irreversible", compensation="none")
    # Compensating tools have explicit, automatic policies (their risk is the forward action's).
    for tool in ("hr.delete_user", "workspace.cancel_license"):
        ToolPolicy.objects.create(tool=tool, risk="low", approval="auto", action_class="internal_update",
                                  compensation="none")
    if webhooks is not None:
        Compensator.objects.create(tool="hr.delete_user", kind="webhook", url=webhooks.url(HR_PATH),
                                   secret="hr-secret")
        Compensator.objects.create(tool="workspace.cancel_license", kind="webhook", url=webhooks.url(WS_PATH),
                                   secret="ws-secret")
    PolicySet.objects.create(tenant=None, default_policy={}, unwind={"on_compensation_failure": "alert_and_continue",
                                                                     "max_attempts": 5},
                             auto_compensate={"max_risk": auto_compensate})


def _perform(run: Any, agent: Any, *, tool: str, key: str, args: dict[str, Any], target: str,
             compensation: dict[str, Any] | None, after: Any = None, fail: str = "") -> Any:
    from ledger import services as ledger
    from recovery import services

    recorded = services.action_record_gated(run=run, actor=agent, tool=tool, idempotency_key=key, target_type="user",
                                            target_id=target, args=args, compensation=compensation,
                                            before_snapshot=None)
    action = recorded.action
    ledger.action_start(action=action, actor=agent)
    if fail:
        return services.action_fail_and_queue(action=action, actor=agent, error=fail, retryable=True, layer="tool")
    return ledger.action_succeed(action=action, actor=agent, result={"ok": True}, after_snapshot=after)


def onboarding_saga(tenant: Any, agent: Any, *, fail_run: bool = True) -> Saga:
    """hr.create_user and workspace.provision_license succeed, email.send_welcome fails (step 3)."""
    from ledger import services as ledger
    from recovery import services

    email = "ashu@company.com"
    run = ledger.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    create_user = _perform(run, agent, tool="hr.create_user", key=f"{run.pk}-1", args={"name": "Ashu Kumar"},
                           target=email, compensation={"tool": "hr.delete_user", "args": {"email": email}},
                           after={"user": email, "active": True})
    provision = _perform(run, agent, tool="workspace.provision_license", key=f"{run.pk}-2",
                         args={"sku": "business-standard"}, target=email,
                         compensation={"tool": "workspace.cancel_license", "args": {"email": email}},
                         after={"license": "business-standard"})
    welcome = _perform(run, agent, tool="email.send_welcome", key=f"{run.pk}-3", args={"to": "ashu@home.example"},
                       target=email, compensation=None, fail="email gateway rate-limited (429)")
    saga = Saga(run=run, create_user=create_user, provision_license=provision, send_welcome=welcome)
    if fail_run:
        outcome = services.run_fail_and_queue(run=run, actor=agent, error="email gateway rate-limited",
                                              failed_action=welcome)
        saga.item = outcome.item
        saga.run.refresh_from_db()
    return saga
