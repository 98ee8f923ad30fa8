"""One approval, one call: a ``tools/call`` the client sends again with the same JSON-RPC id —
while the first is still running upstream, or after it finished — reaches the upstream once and
is answered with the first call's result, content and all.

Everything is real: the upstream is an MCP server subprocess that counts the calls reaching it
(``tests/support/mcp_probe.py``) and holds each until the test releases it; ``saga-mcp`` runs as
a subprocess in front of it, spoken to with raw JSON-RPC (the SDK's client would never send an
id twice); Saga Admin is pytest-django's live server.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from django.core.signals import request_started

from ledger.audit import Actor
from ledger.models import Action
from recovery.actions.approvals import approval_approve
from recovery.models import Approval
from tests.support.mcp_servers import gateway_command, gateway_env
from tests.support.processes import ROOT, free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PROBE = ROOT / "tests" / "support" / "mcp_probe.py"
PROTOCOL = "2025-06-18"
CALL_7 = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "tools/call",
    "params": {"name": "hold", "arguments": {"tag": "a"}},
}


@pytest.fixture
def probe_files(tmp_path: Path) -> dict[str, Path]:
    return {"journal": tmp_path / "probe-journal.jsonl", "release": tmp_path / "probe-release"}


@pytest.fixture
def probe_policy(tenant, tmp_path: Path) -> None:
    """``probe.hold`` runs without approval: the point is what happens after the start."""
    path = tmp_path / "probe-policies.json"
    path.write_text(
        json.dumps(
            {
                "policies": [
                    {"tool": "probe.*", "risk": "low", "approval": "auto", "action_class": "read_only"}
                ]
            }
        )
    )
    call_command("load_policies", str(path), tenant=tenant.slug)


def probe_env(files: dict[str, Path], key: str) -> dict[str, str]:
    env = gateway_env(files["journal"], key)
    return {**env, "PROBE_JOURNAL": str(files["journal"]), "PROBE_RELEASE": str(files["release"])}


def upstream_calls(files: dict[str, Path]) -> list[dict[str, Any]]:
    journal = files["journal"]
    return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []


@contextmanager
def api_requests(method: str, path: str) -> Iterator[list[str]]:
    """The paths of the live server's requests with ``method`` and a path matching ``path`` while
    inside: how the test knows where the gateway's requests are (e.g. that the repeated request
    polls the first one's action: not yet answered, not forwarded)."""
    seen: list[str] = []

    def on_request(sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        if environ.get("REQUEST_METHOD") == method and re.fullmatch(path, environ.get("PATH_INFO", "")):
            seen.append(environ["PATH_INFO"])

    request_started.connect(on_request, weak=False)
    try:
        yield seen
    finally:
        request_started.disconnect(on_request)


def assert_one_call_and_the_same_result(results: list[dict[str, Any]], files: dict[str, Path]) -> None:
    assert len(upstream_calls(files)) == 1, upstream_calls(files)
    first = results[0]
    assert first["structuredContent"] == {"tag": "a", "call": 1}
    assert [block["text"] for block in first["content"]] == ["held a", "call number 1"]
    assert first["content"][1]["annotations"] == {"priority": 0.25}
    assert "probe/served-by" in first["_meta"] and first["_meta"]["saga/action"]
    for again in results[1:]:
        assert again == first  # the same result, content, structured content and _meta
    [action] = Action.objects.filter(tool="probe.hold")
    assert (action.status, action.attempts) == (Action.Status.SUCCEEDED, 1)
    # The ledger's result is still the structured content (what `$result.<path>` reads).
    assert isinstance(action.result, dict) and action.result["tag"] == "a"


# --- stdio --------------------------------------------------------------------------------------


class StdioPeer:
    """The gateway as a subprocess spoken to over its stdin/stdout, one JSON-RPC message a line."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("wb")
        self.process = subprocess.Popen(
            command, env=env, cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log
        )
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.messages.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def answer(self, request_id: int, timeout: float = 60) -> dict[str, Any]:
        while True:
            message = self.messages.get(timeout=timeout)
            if message.get("id") == request_id and ("result" in message or "error" in message):
                return message

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def stdio_session(saga_url: str, key: str, files: dict[str, Path], tmp_path: Path) -> StdioPeer:
    """The gateway over stdio in front of the probe, its session opened (``initialize``)."""
    command = gateway_command(saga_url, f"{sys.executable} {PROBE}", namespace="probe")
    peer = StdioPeer(command, probe_env(files, key), tmp_path / "gateway.log")
    peer.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "replayer", "version": "1"},
            },
        }
    )
    assert "result" in peer.answer(1), (tmp_path / "gateway.log").read_text()
    peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return peer


def test_a_call_sent_again_over_stdio_reaches_the_upstream_once_and_gets_the_first_result(
    live_server, agent_key, probe_policy, probe_files, tmp_path
):
    peer = stdio_session(live_server.url, agent_key[1], probe_files, tmp_path)
    try:
        with api_requests("GET", r"/api/v1/actions/[^/]+") as polls:
            peer.send(CALL_7)
            wait_for(
                lambda: upstream_calls(probe_files), timeout=30, what="the first call to reach the upstream"
            )
            peer.send(CALL_7)  # the same id while the first is still running upstream
            wait_for(
                lambda: polls or len(upstream_calls(probe_files)) > 1,
                timeout=30,
                what="the repeated request to wait on the first one's action (or to be forwarded)",
            )
            assert len(upstream_calls(probe_files)) == 1
            probe_files["release"].touch()
            answers = [peer.answer(7), peer.answer(7)]
        peer.send(CALL_7)  # and once more after it finished
        answers.append(peer.answer(7))
    finally:
        peer.close()
    results = [answer["result"] for answer in answers]
    assert all(not result.get("isError") for result in results), results
    assert_one_call_and_the_same_result(results, probe_files)


def test_two_requests_with_one_id_waiting_for_one_approval_make_one_call(
    live_server, tenant, agent_key, bob, probe_files, tmp_path
):
    """Both requests wait for the same approval and both see it approved: they race to start
    it. The start's key is per attempt, so the second one gets the first's start replayed and
    answers with its outcome instead of forwarding a second time."""
    path = tmp_path / "gated-policies.json"
    gated = {"tool": "probe.*", "risk": "high", "approval": "manual", "action_class": "external_irreversible"}
    path.write_text(json.dumps({"policies": [gated]}))
    call_command("load_policies", str(path), tenant=tenant.slug)
    probe_files["release"].touch()  # no hold: the race is at the start
    peer = stdio_session(live_server.url, agent_key[1], probe_files, tmp_path)
    try:
        with api_requests("POST", r"/api/v1/runs/[^/]+/actions") as records:
            peer.send(CALL_7)
            peer.send(CALL_7)
            wait_for(lambda: len(records) >= 2, timeout=30, what="both requests to record the call")
        approval = wait_for(
            lambda: Approval.objects.filter(action__tool="probe.hold").first(), what="the approval request"
        )
        approval_approve(approval=approval, actor=Actor.for_user(bob), reason="once")
        answers = [peer.answer(7), peer.answer(7)]
    finally:
        peer.close()
    results = [answer["result"] for answer in answers]
    assert all(not result.get("isError") for result in results), results
    assert_one_call_and_the_same_result(results, probe_files)


# --- Streamable HTTP ----------------------------------------------------------------------------


@contextmanager
def http_probe_gateway(saga_url: str, key: str, files: dict[str, Path], tmp_path: Path) -> Iterator[str]:
    """The probe upstream over Streamable HTTP, and ``saga-mcp --listen`` in front of it."""
    upstream_port, port = free_port(), free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    # The gateway says (at INFO) when a repeated request waits for the first one with its id.
    env = {**probe_env(files, key), "SAGA_MCP_LOG_LEVEL": "INFO"}
    with (tmp_path / "upstream.log").open("wb") as upstream_log, (tmp_path / "gateway.log").open("wb") as log:
        upstream = subprocess.Popen(
            [sys.executable, str(PROBE), "--http", f"127.0.0.1:{upstream_port}"],
            env=env,
            stdout=upstream_log,
            stderr=subprocess.STDOUT,
        )
        gateway = None
        try:
            wait_for(lambda: _answers(upstream_url), timeout=30, what="the probe upstream")
            gateway = subprocess.Popen(
                gateway_command(saga_url, upstream_url, "--listen", f"127.0.0.1:{port}", namespace="probe"),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            url = f"http://127.0.0.1:{port}/mcp"
            wait_for(lambda: _answers(url) or gateway.poll() is not None, timeout=30, what="the gateway")
            assert gateway.poll() is None, (tmp_path / "gateway.log").read_text()
            yield url
        finally:
            for process in (gateway, upstream):
                if process is not None:
                    process.terminate()
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1.0)
    except httpx.TransportError:
        return False
    return True


def post_message(
    client: httpx.Client, url: str, message: dict[str, Any], session: str = ""
) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL}
    if session:
        headers["Mcp-Session-Id"] = session
    return client.post(url, json=message, headers=headers)


def jsonrpc_answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC response in a POST's answer (a JSON body or an SSE stream)."""
    assert response.status_code == 200, response.text
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if "result" in message or "error" in message:
                return message
    raise AssertionError(f"no JSON-RPC response in {response.text!r}")


def test_a_call_sent_again_over_streamable_http_reaches_the_upstream_once_and_gets_the_first_result(
    live_server, agent_key, probe_policy, probe_files, tmp_path
):
    with (
        http_probe_gateway(live_server.url, agent_key[1], probe_files, tmp_path) as url,
        httpx.Client(timeout=60) as client,
    ):
        opened = post_message(
            client,
            url,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "replayer", "version": "1"},
                },
            },
        )
        session = opened.headers["mcp-session-id"]
        assert "result" in jsonrpc_answer(opened)
        assert (
            post_message(
                client, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session
            ).status_code
            == 202
        )

        answers: list[dict[str, Any]] = []

        def call() -> None:
            answers.append(jsonrpc_answer(post_message(client, url, CALL_7, session)))

        first = threading.Thread(target=call)
        first.start()
        wait_for(lambda: upstream_calls(probe_files), timeout=30, what="the first call to reach the upstream")
        again = threading.Thread(target=call)  # the same id while the first is still running
        again.start()
        wait_for(
            lambda: (
                "request id 7 of session" in (tmp_path / "gateway.log").read_text()
                or len(upstream_calls(probe_files)) > 1
            ),
            timeout=30,
            what="the repeated request to wait for the first one",
        )
        assert len(upstream_calls(probe_files)) == 1
        probe_files["release"].touch()
        first.join(timeout=60)
        again.join(timeout=60)
        call()  # and once more after it finished
    assert len(answers) == 3
    results = [answer["result"] for answer in answers]
    assert all(not result.get("isError") for result in results), results
    assert_one_call_and_the_same_result(results, probe_files)
