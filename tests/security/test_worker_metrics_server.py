"""The worker's own ``/metrics`` port (``SAGA_WORKER_METRICS_PORT``) is reachable
from other hosts, so whoever can connect to it tries to tie the worker up: many connections that
never send a request, and one that sends its head a byte at a time. The real ``saga_worker``
process serves it; its thread count is read from ``/proc``."""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.processes import Worker, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.django_db(transaction=True)]

TOKEN = secrets.token_urlsafe(24)
IDLE = 150  # more connections than the worker has threads, far fewer than MAX_CONNECTIONS
# The bound docs/SECURITY.md promises (infra.metrics_endpoint.REQUEST_TIMEOUT_S).
REQUEST_TIMEOUT_S = 10.0


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


@contextmanager
def _idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as stack:
        opened = []
        for _ in range(count):
            connection = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            opened.append(connection)
        yield opened


def _closed_by_server(connection: socket.socket) -> bool:
    """The server closed this connection (end of file or a reset), without waiting past 0.2 s."""
    connection.settimeout(0.2)
    try:
        return connection.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


@pytest.fixture
def worker_metrics(start_worker: Callable[..., Worker], tmp_path: Path) -> Iterator[tuple[Worker, str]]:
    own_dir = tmp_path / "worker-metrics"
    own_dir.mkdir()
    port = free_port()
    worker = start_worker(
        PROMETHEUS_MULTIPROC_DIR=str(own_dir), SAGA_WORKER_METRICS_PORT=str(port), SAGA_METRICS_TOKEN=TOKEN
    )
    url = f"http://127.0.0.1:{port}/metrics"

    def listening() -> bool:
        try:
            return httpx.get(url, timeout=5).status_code == 401
        except httpx.TransportError:
            return False

    wait_for(listening, timeout=60, what="the worker's /metrics to listen")
    yield worker, url


def _scrape(url: str) -> httpx.Response:
    return httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)


def test_idle_connections_cost_no_thread_and_a_scrape_still_answers(worker_metrics):
    """Attack: open 150 connections to the worker's /metrics and send nothing. Before, each one
    held a thread of the worker's (no socket timeout) until it went away; now the thread count
    does not move, and a scrape with the token answers at once while they are all open."""
    worker, url = worker_metrics
    port = int(url.split(":")[2].split("/")[0])
    assert _scrape(url).status_code == 200  # the scrape thread exists from here on
    before = _threads(worker.process.pid)
    with _idle_connections(port, IDLE):
        # Let the server accept them all (a thread per connection, before, starts on accept).
        time.sleep(1)
        during = _threads(worker.process.pid)
        started = time.monotonic()
        scraped = _scrape(url)
        took = time.monotonic() - started
        refused = httpx.get(url, timeout=5)
    assert during - before < 5, f"{during - before} threads more with {IDLE} idle connections"
    assert scraped.status_code == 200 and "# HELP" in scraped.text
    assert took < 5
    assert refused.status_code == 401


def test_a_connection_that_sends_no_whole_request_is_closed_after_the_timeout(worker_metrics):
    """Attack: connect and send nothing, or a request head one byte a second (slowloris). Before,
    both were kept open for as long as the client liked; now each is closed within
    10 s of connecting, unanswered."""
    _worker, url = worker_metrics
    port = int(url.split(":")[2].split("/")[0])
    with _idle_connections(port, 2) as (idle, slow):
        opened = time.monotonic()
        head = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nX-Slow: ".encode()
        slow.sendall(head)
        slow_closed = False
        deadline = opened + REQUEST_TIMEOUT_S + 5
        while time.monotonic() < deadline and not slow_closed:
            try:
                slow.sendall(b"a")
            except (BrokenPipeError, ConnectionError):
                slow_closed = True
                break
            slow_closed = _closed_by_server(slow)
            time.sleep(0.8)
        assert slow_closed, "a request head trickled in a byte a second kept its connection open"
        wait_for(lambda: _closed_by_server(idle), timeout=5, what="the idle connection to be closed")
        assert time.monotonic() - opened >= REQUEST_TIMEOUT_S - 1


@contextmanager
def _a_forked_child() -> Iterator[int]:
    """A child forked from this process as RQ forks its scheduler (``ForkProcess``) and horses,
    living until the block ends; yields its process id."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    release = context.Event()
    child = context.Process(target=release.wait, args=(60,), daemon=True)
    child.start()
    try:
        yield child.pid or 0
    finally:
        release.set()
        child.join(timeout=10)


def test_a_connection_is_closed_at_its_timeout_while_a_fork_of_the_worker_holds_a_copy():
    """Attack, as it happened in CI: the slow connection was open when the worker forked (RQ starts
    its scheduler process on taking the scheduler lock, at a maintenance pass), so the child held a
    copy of the socket and the close at the timeout never reached the client, for as long as the
    child lived. Now the connection ends with a shutdown, which reaches the client anyway."""
    from infra import metrics_endpoint

    server = metrics_endpoint.serve(host="127.0.0.1", port=0, token=TOKEN, request_timeout_s=1.0)
    try:
        port = server.server_address[1]
        with _idle_connections(port, 1) as (slow,):
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            wait_for(lambda: server.open_connections == 1, timeout=5, what="the connection to be accepted")
            with _a_forked_child():
                opened = time.monotonic()
                wait_for(lambda: _closed_by_server(slow), timeout=10, what="the slow connection to be closed")
                assert time.monotonic() - opened < 5
    finally:
        server.shutdown()
        server.server_close()


def test_a_fork_of_the_worker_does_not_keep_the_metrics_port():
    """A child forked while the endpoint listens closes its copy of the listening socket: once the
    worker closes it, the port is free (a restarted worker can listen on it again) even while the
    child lives, and nobody's connection waits unanswered in a backlog nobody accepts."""
    from infra import metrics_endpoint

    server = metrics_endpoint.serve(host="127.0.0.1", port=0, token=TOKEN)
    port = server.server_address[1]
    with _a_forked_child():
        assert _scrape(f"http://127.0.0.1:{port}/metrics").status_code == 200  # the parent still serves
        server.shutdown()
        server.server_close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        again = metrics_endpoint.serve(host="127.0.0.1", port=port, token=TOKEN)
        again.shutdown()
        again.server_close()
