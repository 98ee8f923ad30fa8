"""Real processes for the engine, recovery and reliability tests: a throwaway Redis (so a test may
stop or flush it), a compensating service that checks signatures and counts effects per
Idempotency-Key, and real ``saga_worker`` processes that can be SIGKILLed like a crashed host."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from saga_client.signing import verify_signature

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


def quiet_port() -> int:
    """A free port below the kernel's ephemeral range: no ``bind(0)`` and no outgoing connection
    will take it, so a server may stop and start again on it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low <= 21000:
        return free_port()  # an unusual kernel setting: no room below the range
    for _ in range(200):
        port = random.randrange(20000, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in 20000-{low - 1}")


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 20.0,
    interval: float = 0.1,
    what: str = "",
    progress: Callable[[], Any] | None = None,
) -> Any:
    """``predicate``'s first truthy value, polled every ``interval``; AssertionError after
    ``timeout``. With ``progress`` (a reading of the work under way: a count of audit events, the
    size of a worker's log), ``timeout`` is how long nothing may happen rather than how long the
    work may take: each change of the reading starts it again, so a loaded machine that is slow
    but moving does not fail the test, and a stuck one still does (the test's own time limit
    bounds the whole wait)."""
    deadline = time.monotonic() + timeout
    seen = progress() if progress is not None else None
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if progress is not None:
            reading = progress()
            if reading != seen:
                seen, deadline = reading, now + timeout
        if now >= deadline:
            break
        time.sleep(interval)
    if progress is not None:
        raise AssertionError(f"nothing happened for {timeout}s while waiting for {what or predicate}")
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def work_under_way(*logs: Path) -> Callable[[], tuple[int, ...]]:
    """The progress reading of a wait on worker processes (``wait_for(progress=…)``): how many
    audit events exist, and how long each of the workers' logs is (a worker that starts, retries
    or backs off writes there before it writes an event)."""
    from ledger.models import Event

    def reading() -> tuple[int, ...]:
        return (Event.objects.count(), *(log.stat().st_size if log.exists() else 0 for log in logs))

    return reading


# --- A Redis of our own ----------------------------------------------------------------------


class RedisServer:
    """redis-server on a free port, without persistence: stopping it loses every job, like a
    crashed Redis. Never the machine's shared instance.

    A test may stop it and start it again on the same port, so the port is one the kernel never
    hands out by itself (below the ephemeral range, which every outgoing connection and every
    ``bind(0)`` of a parallel run's other workers draw from): nothing else takes it meanwhile."""

    def __init__(self) -> None:
        self.port = quiet_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.started_once = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for the engine tests"
        for _attempt in range(5):
            process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            import redis

            client = redis.Redis.from_url(self.url)
            # Ours answers, not one that another worker started on the same port a moment earlier
            # (then ours exits: the port is taken).
            wait_for(partial(self._settled, client, process), timeout=10, what="redis-server to start")
            if process.poll() is None:
                self.process = process
                self.started_once = True
                return
            assert not self.started_once, f"port {self.port} was taken while this Redis was stopped"
            self.port = quiet_port()
        raise AssertionError("redis-server did not start on any of 5 free ports")

    @classmethod
    def _settled(cls, client: Any, process: subprocess.Popen[bytes]) -> bool:
        """Exited, or up and answering as itself."""
        import redis

        if process.poll() is not None:
            return True
        try:
            return cls._ping(client) and client.info("server").get("process_id") == process.pid
        except redis.RedisError:
            return False

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

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushdb()


@contextmanager
def rq_pointed_at(server: RedisServer) -> Iterator[RedisServer]:
    """Point this process's RQ queues at ``server`` (and back afterwards)."""
    from django.conf import settings

    saved = {name: dict(config) for name, config in settings.RQ_QUEUES.items()}
    for config in settings.RQ_QUEUES.values():
        config["URL"] = server.url
    try:
        yield server
    finally:
        for name, config in saved.items():
            settings.RQ_QUEUES[name].update(config)


# --- A compensating service that checks signatures -------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    block: threading.Event | None = None  # hold the request open until set (a slow tool)
    delay_s: float = 0.0


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes
    signature_ok: bool
    at: float

    @property
    def key(self) -> str:
        return self.headers.get("Idempotency-Key", "")


@dataclass
class WebhookServer:
    """Records every call; replies from ``script`` (per path) or with 200.

    Like a well-behaved tool it applies its effect once per Idempotency-Key (a repeat is answered
    without doing anything again), so ``effects`` counts effects per forward action: a sender that
    changed the key on a retry would show up as two effects for one action. ``overlaps`` counts
    calls that arrived while another call with the same key was still being served."""

    secrets: dict[str, str]
    calls: list[Call] = field(default_factory=list)
    script: dict[str, list[Reply]] = field(default_factory=dict)
    default_delay_s: float = 0.0
    arrived: threading.Event = field(default_factory=threading.Event)
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    applied_keys: set[str] = field(default_factory=set)
    effects: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)
    overlaps: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def calls_to(self, path: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.path == path]

    def next_reply(self, path: str) -> Reply:
        with self.lock:
            queue = self.script.get(path) or []
            if queue:
                return queue.pop(0)
        return Reply(200, {"state": {"compensated": path}}, delay_s=self.default_delay_s)

    def enter(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)
            if call.key and self.in_flight[call.key]:
                self.overlaps += 1
            self.in_flight[call.key] += 1
            if call.signature_ok and call.key not in self.applied_keys:
                self.applied_keys.add(call.key)
                self.effects[str(call.body.get("action_id", call.path))] += 1
        self.arrived.set()

    def leave(self, call: Call) -> None:
        with self.lock:
            self.in_flight[call.key] -= 1


def _handler_for(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            secret = server.secrets.get(self.path, "")
            ok = bool(secret) and verify_signature(secret, dict(self.headers.items()), raw)
            call = Call(self.path, dict(self.headers.items()), json.loads(raw or b"{}"), raw, ok, time.time())
            server.enter(call)
            try:
                if not ok:
                    self._reply(401, {"error": "bad signature"})
                    return
                reply = server.next_reply(self.path)
                if reply.block is not None:
                    reply.block.wait(timeout=30)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self._reply(reply.status, reply.body)
            finally:
                server.leave(call)

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


@contextmanager
def http_serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serve ``handler`` on a free port of 127.0.0.1 in a thread (one thread per request); yields
    the port, shuts the server down afterwards. What every test receiver stands on."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def serve_webhooks(secrets: dict[str, str], **options: Any) -> Iterator[WebhookServer]:
    server = WebhookServer(secrets=secrets, **options)
    with http_serving(_handler_for(server)) as port:
        server.port = port
        yield server


# --- Real worker processes -------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (rq's work horses call setpgrp, so a process-group kill misses
    them; a crashed machine would not)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process went away while we looked
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
        victims = descendants(self.process.pid)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in victims:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            victims = descendants(self.process.pid)
            os.killpg(self.process.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)
            for pid in [self.process.pid, *victims]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def database_url_for_subprocesses(name: str | None = None) -> str:
    """The database this test process uses (pytest-django's test_… copy), for subprocesses; given
    ``name``, the database of that name on the same server, reached the same way (DATABASE_URL's
    user, password, host or socket directory, and port)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(str(db['PASSWORD']), safe='')}" if db.get("PASSWORD") else ""
    host = quote(db["HOST"] or "127.0.0.1", safe="")
    return f"postgres://{user}{password}@{host}:{db['PORT'] or 5432}/{name or db['NAME']}"


def spawn_worker(*, redis_url: str, log_path: Path, env: dict[str, str] | None = None) -> Worker:
    """A ``saga_worker`` on every queue, on this test's database and the given Redis."""
    full_env = {
        **os.environ,
        **FAST_ENGINE,
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": redis_url,
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "saga_worker", "compensations", "notifications", "default"],
        cwd=ROOT,
        env=full_env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Worker(process, log_path)


def dump_worker_logs(workers: list[Worker]) -> str:
    return "\n".join(f"--- worker {i} ---\n{w.log()[-4000:]}" for i, w in enumerate(workers))


def procfile_line(name: str) -> str:
    """The command of the Procfile's ``name:`` line, as a deployment runs it."""
    for entry in (ROOT / "Procfile").read_text().splitlines():
        if entry.startswith(f"{name}:"):
            return entry.split(":", 1)[1].strip()
    raise AssertionError(f"no {name}: line in the Procfile")


@contextmanager
def procfile_web(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The Procfile's web line started with exactly ``env`` (which sets PORT and WEB_BIND_HOST),
    its output in ``log``; yields once it answers /livez, and stops it (its whole process group)
    on the way out."""
    process = subprocess.Popen(
        ["bash", "-c", f"exec {procfile_line('web')}"],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://{env['WEB_BIND_HOST']}:{env['PORT']}"

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the web process exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            return httpx.get(f"{base}/livez", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=90, what="the Procfile's web line to answer /livez")
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


# --- A PostgreSQL of our own -----------------------------------------------------------------


class PostgresServer:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl of the machine's PostgreSQL) in a fresh
    directory of the system's temporary one (pytest's own is closed to other users), on a quiet
    port of 127.0.0.1, trust auth for ``postgres``: a test may stop it, as a crashed database
    server, and start it again on the same port. Never the machine's shared instance.
    As root it runs as the ``postgres`` system user (PostgreSQL refuses to run as root)."""

    def __init__(self) -> None:
        import tempfile

        self.bin = self._bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="saga-pg-"))
        self.datadir = self.root / "pgdata"
        self.port = quiet_port()
        self.user = "postgres" if os.geteuid() == 0 else None

    @staticmethod
    def _bin_dir() -> Path:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if found:
            return found[-1].parent
        pg_ctl = shutil.which("pg_ctl")
        assert pg_ctl, "pg_ctl (PostgreSQL's server binaries) is needed for the database outage tests"
        return Path(pg_ctl).parent

    def _run(self, *args: str) -> None:
        command = [str(self.bin / args[0]), *args[1:]]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/", check=False)
        assert done.returncode == 0, (
            f"{' '.join(args[:1])} failed: {done.stdout[-1500:]}{done.stderr[-1500:]}"
        )

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def init(self) -> None:
        self.datadir.mkdir(parents=True)
        if self.user:
            shutil.chown(self.datadir, self.user)
            shutil.chown(self.root, self.user)
        self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.datadir} -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.datadir), "-o", options, "-l", str(self.datadir / "log"), "-w", "start"
        )

    def stop(self) -> None:
        """Immediate: every connection is cut, nothing is shut down politely (a crash)."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        return (self.datadir / "postmaster.pid").exists()

    def remove(self) -> None:
        """Stopped, and its files gone."""
        if self.running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
