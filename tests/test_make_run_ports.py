"""`make run`'s demo MCP ports: the server answering on a port is checked to be the one this run
started (``scripts/devservers.py wait-own``: the listener's socket belongs to the session of the
process run.sh started), never a stranger that took the port first — another playground's
gateway, say, which would record this playground's seeded MCP session in its own ledger and call
its own HR server. And the two knobs that name those ports, refused before anything starts when
they cannot be used.

Real sockets and processes, no playground: seconds, not minutes (tests/test_make_run.py starts
whole playgrounds, one of them with both knobs set)."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.processes import ROOT, free_port, wait_for

RUN = [shutil.which("bash") or "/bin/bash", str(ROOT / "scripts" / "run.sh")]


def _devservers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devservers", ROOT / "scripts" / "devservers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


devservers = _devservers()


def _serve(port: int, *, reuse_port: bool = False) -> subprocess.Popen[bytes]:
    """An HTTP server on 127.0.0.1:PORT in its own session, as run.sh starts its servers."""
    code = (
        "import http.server, socket, sys\n"
        "class S(http.server.HTTPServer):\n"
        "    def server_bind(self):\n"
        f"        if {reuse_port}: self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
        "        super().server_bind()\n"
        f"S(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tempfile.gettempdir(),
    )


@pytest.fixture
def stranger() -> Iterator[socket.socket]:
    """A listener of some other program (here: this test process) on a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock


@pytest.fixture
def ours() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_our_own_server_is_ready_once_it_listens_and_answers(ours: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    ours.append(server := _serve(port))
    assert devservers.wait_own(f"http://127.0.0.1:{port}/mcp", server.pid, 30) == 0
    assert devservers.listener_state(port, server.pid) == "ours"


def test_a_foreign_listener_on_the_chosen_port_is_refused_not_taken_for_ours(
    stranger: socket.socket, ours: list[subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    # Our server lost the race for the port: it fails to bind (and would exit), while the
    # stranger answers every connection. Any answer is not enough: it is not ours.
    port = stranger.getsockname()[1]
    ours.append(server := _serve(port))
    assert devservers.wait_own(f"http://127.0.0.1:{port}/mcp", server.pid, 30) == devservers.PORT_TAKEN
    said = capsys.readouterr().out
    assert f"port {port} is taken by another program" in said and "not by the server this make run" in said


def test_a_foreign_listener_beside_ours_on_the_same_port_is_refused(
    ours: list[subprocess.Popen[bytes]],
) -> None:
    # SO_REUSEPORT lets two programs listen on one port and the kernel shares the connections
    # between them: half of this run's MCP calls would reach the other one.
    port = free_port()
    ours.append(other := _serve(port, reuse_port=True))
    wait_for(lambda: devservers.listening_inodes(port), timeout=30, what="the other listener")
    ours.append(server := _serve(port, reuse_port=True))
    wait_for(lambda: len(devservers.listening_inodes(port)) == 2, timeout=30, what="our listener")
    assert devservers.listener_state(port, server.pid) == "foreign"
    assert devservers.wait_own(f"http://127.0.0.1:{port}/mcp", server.pid, 10) == devservers.PORT_TAKEN
    assert other.poll() is None


def test_a_server_that_exits_before_it_listens_is_not_waited_for(ours: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    ours.append(gone := subprocess.Popen(["true"], start_new_session=True))
    gone.wait()
    assert devservers.listener_state(port, gone.pid) == "none"
    assert devservers.wait_own(f"http://127.0.0.1:{port}/mcp", gone.pid, 30) == 1


@pytest.mark.parametrize("knob", ["SAGA_RUN_MCP_PORT", "SAGA_RUN_GATEWAY_PORT"])
def test_a_port_knob_naming_a_port_in_use_is_refused_before_anything_starts(
    stranger: socket.socket, knob: str, tmp_path: Path
) -> None:
    data = Path(tempfile.mkdtemp(prefix="saga-run-ports-", dir="/tmp"))
    try:
        port = stranger.getsockname()[1]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "SAGA_RUN_DATA": str(data),
            "PORT": str(free_port()),
            knob: str(port),
        }
        run = subprocess.run(RUN, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        said = run.stdout + run.stderr
        assert run.returncode == 1, said
        assert f"{knob}={port} is in use by another program; nothing was started." in said, said
        assert "==> Starting" not in said and not (data / "pg").exists(), said
        assert not (data / "run.procs").exists() and not (data / "env").exists()
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"SAGA_RUN_MCP_PORT": "87x5"}, "SAGA_RUN_MCP_PORT=87x5 is not a port number"),
        ({"SAGA_RUN_GATEWAY_PORT": "70000"}, "SAGA_RUN_GATEWAY_PORT=70000 is not a port number"),
        ({"SAGA_RUN_MCP_PORT": "@web"}, "SAGA_RUN_MCP_PORT=@web is already the port of another server"),
        (
            {"SAGA_RUN_MCP_PORT": "@free", "SAGA_RUN_GATEWAY_PORT": "@free"},
            "SAGA_RUN_GATEWAY_PORT=@free is already the port of another server",
        ),
    ],
)
def test_a_port_knob_it_cannot_use_is_refused_before_anything_starts(
    knobs: dict[str, str], message: str, tmp_path: Path
) -> None:
    data = Path(tempfile.mkdtemp(prefix="saga-run-ports-", dir="/tmp"))
    try:
        web, free = str(free_port()), str(free_port())
        knobs = {name: value.replace("@web", web).replace("@free", free) for name, value in knobs.items()}
        message = message.replace("@web", web).replace("@free", free)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "SAGA_RUN_DATA": str(data),
            "PORT": web,
            **knobs,
        }
        run = subprocess.run(RUN, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        said = run.stdout + run.stderr
        assert run.returncode == 1 and message in said, said
        assert "==> Starting" not in said and not (data / "pg").exists(), said
    finally:
        shutil.rmtree(data, ignore_errors=True)
