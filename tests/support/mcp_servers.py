"""Real MCP servers for the gateway, MCP compensator and MCP demo tests: the demo HR + workspace
upstream (``clients/python/examples/hr_workspace_mcp.py``, the SDK's own server) in a subprocess,
over Streamable HTTP or as the command line a gateway starts over stdio, with its journal of the
calls that reached it; and the ``saga-mcp`` gateway as a real process in front of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import ROOT, free_port, wait_for

UPSTREAM = ROOT / "clients" / "python" / "examples" / "hr_workspace_mcp.py"


@dataclass
class Upstream:
    journal_path: Path
    url: str = ""
    process: subprocess.Popen[bytes] | None = None

    def calls(self) -> list[dict[str, Any]]:
        """Every call that reached a tool, oldest first."""
        if not self.journal_path.exists():
            return []
        return [json.loads(line) for line in self.journal_path.read_text().splitlines() if line.strip()]

    def tools_called(self) -> list[str]:
        return [call["tool"] for call in self.calls()]

    def command(self) -> list[str]:
        """The command line that starts this upstream over stdio (what a gateway is given)."""
        return [sys.executable, str(UPSTREAM)]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def upstream_env(journal_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("SAGA_", "DJANGO_"))}
    return {**env, "HR_MCP_JOURNAL": str(journal_path), "PYTHONUNBUFFERED": "1", **extra}


def answers(url: str) -> bool:
    try:
        # A GET without a session is refused by the MCP endpoint, but it answers: the server is up.
        httpx.get(url, timeout=1.0)
    except httpx.TransportError:
        return False
    return True


@contextmanager
def http_upstream(tmp_path: Path, **env: str) -> Iterator[Upstream]:
    """The demo upstream serving Streamable HTTP on a free port (``restart_http`` stops it and
    starts it again on the same port, its journal kept: an upstream that restarted)."""
    port = free_port()
    upstream = Upstream(journal_path=tmp_path / f"journal-{port}.jsonl", url=f"http://127.0.0.1:{port}/mcp")
    try:
        _start_http(upstream, tmp_path, port, env)
        yield upstream
    finally:
        upstream.stop()


def _start_http(upstream: Upstream, tmp_path: Path, port: int, env: dict[str, str]) -> None:
    with (tmp_path / f"upstream-{port}.log").open("ab") as log:
        upstream.process = subprocess.Popen(
            [*upstream.command(), "--http", f"127.0.0.1:{port}"],
            env=upstream_env(upstream.journal_path, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_for(lambda: answers(upstream.url), timeout=30, what=f"the upstream MCP server at {upstream.url}")


def restart_http(upstream: Upstream, tmp_path: Path, **env: str) -> None:
    """Stop ``upstream`` (an ``http_upstream``) and start it again on the same port: a new
    process that knows none of the old one's sessions."""
    upstream.stop()
    port = int(upstream.url.rsplit(":", 1)[1].split("/", 1)[0])
    _start_http(upstream, tmp_path, port, env)


def stdio_upstream(tmp_path: Path) -> Upstream:
    """The demo upstream as a command line, for a gateway to start over stdio."""
    return Upstream(journal_path=tmp_path / f"journal-stdio-{time.monotonic_ns()}.jsonl")


# --- The saga-mcp gateway ----------------------------------------------------------------------


def gateway_command(saga_url: str, upstream: str, *extra: str, namespace: str = "hr") -> list[str]:
    return [
        sys.executable,
        "-m",
        "saga_client.mcp",
        "--saga-url",
        saga_url,
        "--upstream",
        upstream,
        "--namespace",
        namespace,
        "--poll-interval",
        "0.2",
        "--heartbeat-interval",
        "1",
        *extra,
    ]


def gateway_env(journal: Path, key: str | None) -> dict[str, str]:
    env = upstream_env(journal)
    if key is not None:
        env["SAGA_API_KEY"] = key
    return env


@contextmanager
def http_gateway(
    saga_url: str,
    upstream: str,
    key: str,
    tmp_path: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    namespace: str = "hr",
    host: str = "127.0.0.1",
) -> Iterator[str]:
    """``saga-mcp --listen`` on ``host`` and a free port in front of ``upstream``; yields its MCP
    URL."""
    port = free_port()
    log_path = tmp_path / f"gateway-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            gateway_command(saga_url, upstream, "--listen", f"{host}:{port}", *extra, namespace=namespace),
            env={**gateway_env(tmp_path / "journal-unused.jsonl", key), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://{host}:{port}/mcp"
        try:
            wait_for(
                lambda: answers(url) or process.poll() is not None, timeout=30, what="the gateway to listen"
            )
            assert process.poll() is None, log_path.read_text()
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
