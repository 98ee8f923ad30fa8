"""saga-mcp and an upstream that restarts: the real demo upstream (the SDK's server over Streamable
HTTP, in a subprocess) stopped and started again on the same port mid-session, the gateway as a
real process, a real ``mcp.Client`` and the real Saga Admin. The upstream's journal counts the
calls that reached it: one approval, one call, whatever the upstream did meanwhile."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from mcp import Client

from ledger.models import Action
from recovery.models import Approval
from tests.client.test_mcp_gateway import api, load_example_policies, text_of
from tests.support.mcp_servers import answers, http_gateway, http_upstream, restart_http
from tests.support.processes import ROOT, free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CRASHING = ROOT / "tests" / "support" / "mcp_crashing_upstream.py"
EMAIL = {"to": "ashu@company.com", "subject": "Welcome", "body": "Hello Ashu"}


def approve_when_asked(approver: Any, to: str) -> Any:
    async def approve() -> dict[str, Any]:
        while True:
            pending = await asyncio.to_thread(
                lambda: approver.get("/approvals", params={"status": "pending"}).json()["items"]
            )
            mine = [a for a in pending if a["args"].get("to") == to]
            if mine:
                answer = await asyncio.to_thread(
                    lambda: approver.post(f"/approvals/{mine[0]['id']}/approve", json={"reason": "ok"})
                )
                assert answer.status_code == 200, answer.text
                approval: dict[str, Any] = answer.json()
                return approval
            await asyncio.sleep(0.2)

    return approve()


def gateway_log(tmp_path: Path) -> str:
    return "\n".join(path.read_text() for path in tmp_path.glob("gateway-*.log"))


def test_the_gateway_opens_a_new_session_when_the_upstream_restarts_and_calls_once_per_approval(
    live_server, tenant, agent_key, approver_key, tmp_path
):
    approver = api(live_server, approver_key[1])

    async def scenario(gateway_url: str, restart: Any) -> list[Any]:
        async with Client(gateway_url, mode="legacy") as client:
            first = await client.call_tool("create_user", {"email": "ann@company.com", "name": "Ann"})
            await asyncio.to_thread(restart)
            # The gateway's session died with the old process: answered "Session not found", the
            # call was not made there, so it is sent once more on a new session.
            after_restart = await client.call_tool("create_user", {"email": "bob@company.com", "name": "Bob"})
            await asyncio.to_thread(restart)
            # A gated call approved after the restart: the gateway makes sure the upstream can take
            # it before the approval is spent, then calls it once.
            approving = asyncio.create_task(approve_when_asked(approver, EMAIL["to"]))
            approved = await client.call_tool("send_email", EMAIL)
            await approving
        return [first, after_restart, approved]

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path) as gateway_url:
            results = asyncio.run(scenario(gateway_url, lambda: restart_http(upstream, tmp_path)))
        assert [text_of(r) for r in results if r.is_error] == []
        # Exactly one call per recorded call reached the upstream, across both restarts.
        assert upstream.tools_called() == ["create_user", "create_user", "send_email"]
        assert [c["args"].get("email") or c["args"].get("to") for c in upstream.calls()] == [
            "ann@company.com",
            "bob@company.com",
            "ashu@company.com",
        ]
    assert list(Action.objects.order_by("seq").values_list("tool", "status", "attempts")) == [
        ("hr.create_user", "succeeded", 1),
        ("hr.create_user", "succeeded", 1),
        ("hr.send_email", "succeeded", 1),
    ]
    log = gateway_log(tmp_path)
    assert log.count("WARNING") >= 2, log
    assert "event=upstream_session_lost" in log and "during=tools/call create_user" in log, log
    assert "event=upstream_reconnected" in log, log


def test_an_upstream_that_stays_down_gets_no_call_and_an_approval_is_not_spent_on_it(
    live_server, tenant, agent_key, approver_key, tmp_path
):
    approver = api(live_server, approver_key[1])

    async def scenario(gateway_url: str, stop: Any) -> list[Any]:
        async with Client(gateway_url, mode="legacy") as client:
            await client.call_tool("create_user", {"email": "ann@company.com", "name": "Ann"})
            await asyncio.to_thread(stop)
            refused = await client.call_tool("create_user", {"email": "bob@company.com", "name": "Bob"})
            approving = asyncio.create_task(approve_when_asked(approver, EMAIL["to"]))
            waiting = await client.call_tool("send_email", EMAIL)
            await approving
        return [refused, waiting]

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path) as gateway_url:
            refused, waiting = asyncio.run(scenario(gateway_url, upstream.stop))
        assert upstream.tools_called() == ["create_user"]
    # Connecting was refused: the call was not made, and is recorded failed (not unknown).
    assert refused.is_error and "could not be reached, so create_user was not made" in text_of(refused)
    bob = Action.objects.get(tool="hr.create_user", args__email="bob@company.com")
    assert (bob.status, bob.attempts) == ("failed", 1)
    assert "refused the connection" in bob.error
    # The approved call was never started: its approval still stands, unspent.
    assert waiting.is_error and "its approval still stands" in text_of(waiting), text_of(waiting)
    email = Action.objects.get(tool="hr.send_email")
    assert email.attempts == 0 and email.started_at is None
    assert Approval.objects.get(action=email).status == "approved"
    assert "event=upstream_session_lost" in gateway_log(tmp_path)


def test_a_call_whose_connection_broke_after_it_was_sent_is_unknown_and_never_sent_again(
    live_server, tenant, agent_key, tmp_path
):
    # ``charge`` journals the call, then its server dies before answering: it happened, and the
    # gateway cannot know that. Sending it again could charge twice.
    policies = tmp_path / "shop.json"
    policies.write_text(
        json.dumps(
            {
                "default_policy": {"risk": "low", "approval": "auto", "action_class": "internal_update"},
                "policies": [],
            }
        )
    )
    call_command("load_policies", str(policies), tenant=tenant.slug)
    port, journal = free_port(), tmp_path / "charges.jsonl"
    url = f"http://127.0.0.1:{port}/mcp"
    server = subprocess.Popen(
        [sys.executable, str(CRASHING), f"127.0.0.1:{port}", str(journal)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    async def scenario(gateway_url: str) -> Any:
        async with Client(gateway_url, mode="legacy") as client:
            return await client.call_tool("charge", {"customer": "c_1", "amount": 5})

    try:
        wait_for(lambda: answers(url), timeout=30, what="the crashing upstream")
        with http_gateway(live_server.url, url, agent_key[1], tmp_path, namespace="shop") as gateway_url:
            result = asyncio.run(scenario(gateway_url))
    finally:
        server.kill()
        server.wait(timeout=10)
    assert result.is_error and "It may or may not have happened" in text_of(result), text_of(result)
    assert len(journal.read_text().splitlines()) == 1  # one charge, never a second
    charge = Action.objects.get(tool="shop.charge")
    assert (charge.status, charge.attempts) == ("unknown", 1)
