"""saga-mcp takes before- and after-images, so an update through it can be undone exactly: a real
inventory upstream (the SDK's server over Streamable HTTP, in a subprocess; structured results
and text-only JSON results), the gateway as a real process, a real ``mcp.Client`` and the real
Saga Admin. ``set_price``'s policy reads ``get_item`` before the call and after it; the
upstream's journal shows every call that reached it, so a refused call is one that never reached
``set_price``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from mcp import Client

from ledger.models import Action
from recovery.planner import step_args
from tests.client.test_mcp_gateway import api, text_of
from tests.support.mcp_servers import answers, http_gateway
from tests.support.processes import ROOT, free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

INVENTORY = ROOT / "tests" / "support" / "mcp_inventory_upstream.py"
ITEMS = {
    "A-1": {"name": "Widget", "price": 10.0},
    "B-2": {"name": "Gadget", "price": 20.0},
    "fragile": {"name": "Fragile", "price": 5.0},
}
BEFORE = {"tool": "inv.get_item", "args": {"id": "$args.id"}, "path": "item"}


@dataclass
class Inventory:
    url: str
    state: Path
    journal: Path
    mode: str
    process: subprocess.Popen[bytes] | None = None

    def calls(self) -> list[tuple[str, str]]:
        if not self.journal.exists():
            return []
        lines = [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]
        return [(call["tool"], call["args"]["id"]) for call in lines]

    def start(self) -> None:
        port = self.url.rsplit(":", 1)[1].split("/", 1)[0]
        with (self.state.parent / f"inventory-{port}.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(INVENTORY),
                    f"127.0.0.1:{port}",
                    str(self.state),
                    str(self.journal),
                    self.mode,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: answers(self.url), timeout=30, what="the inventory upstream")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()


@contextmanager
def inventory(tmp_path: Path, mode: str) -> Iterator[Inventory]:
    state = tmp_path / "items.json"
    state.write_text(json.dumps(ITEMS))
    upstream = Inventory(
        url=f"http://127.0.0.1:{free_port()}/mcp",
        state=state,
        journal=tmp_path / "inventory.jsonl",
        mode=mode,
    )
    try:
        upstream.start()
        yield upstream
    finally:
        upstream.stop()


def load_inventory_policies(
    tenant, tmp_path: Path, url: str, *, before: bool = True, approval: str = "auto"
) -> None:
    set_price: dict[str, Any] = {
        "tool": "inv.set_price",
        "risk": "medium",
        "approval": approval,
        "action_class": "internal_update",
        "compensation": "custom",
        "compensation_tool": "inv.set_price",
        "compensation_args": {"id": "$args.id", "price": "$before.price" if before else 0},
    }
    if before:
        set_price["before"] = BEFORE
    data = {
        "default_policy": {"risk": "high", "approval": "manual", "action_class": "external_irreversible"},
        "policies": [
            {"tool": "inv.get_item", "risk": "low", "approval": "auto", "action_class": "read_only"},
            set_price,
        ],
        "compensators": {"inv.set_price": {"mcp": url, "tool": "set_price"}},
        "readers": {"inv.get_item": {"mcp": url, "tool": "get_item"}},
    }
    path = tmp_path / f"inventory-policies-{'before' if before else 'plain'}.json"
    path.write_text(json.dumps(data))
    call_command("load_policies", str(path), tenant=tenant.slug)


def gateway_log(tmp_path: Path) -> str:
    return "\n".join(path.read_text() for path in tmp_path.glob("gateway-*.log"))


def action_of(result: Any) -> str:
    return str((result.meta or {})["saga/action"])


@pytest.mark.parametrize("mode", ["structured", "text"])
def test_the_gateway_records_the_images_and_refuses_a_call_without_one(
    live_server, tenant, agent_key, tmp_path, mode
):
    async def scenario(gateway_url: str) -> dict[str, Any]:
        async with Client(gateway_url, mode="legacy") as client:
            return {
                "set": await client.call_tool("set_price", {"id": "A-1", "price": 12.5}),
                "broken": await client.call_tool("set_price", {"id": "broken", "price": 1}),
                "ghost": await client.call_tool("set_price", {"id": "ghost", "price": 1}),
                "fragile": await client.call_tool("set_price", {"id": "fragile", "price": 6}),
            }

    with inventory(tmp_path, mode) as upstream:
        load_inventory_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path, namespace="inv") as url:
            results = asyncio.run(scenario(url))
        calls = upstream.calls()

    # The update: read (without the namespace prefix), the call, read again; once each.
    assert not results["set"].is_error, text_of(results["set"])
    assert calls[:3] == [("get_item", "A-1"), ("set_price", "A-1"), ("get_item", "A-1")]
    shown = api(live_server, agent_key[1]).get(f"/actions/{action_of(results['set'])}").json()
    assert shown["status"] == "succeeded"
    assert shown["before_snapshot"] == {"id": "A-1", "name": "Widget", "price": 10.0}
    assert shown["after_snapshot"] == {"id": "A-1", "name": "Widget", "price": 12.5}
    # The $result rule: a JSON object in the only text block is recorded as that object.
    assert shown["result"]["price"] == 12.5 and shown["result"]["id"] == "A-1"
    # The undo's args come from the before-image ($before.price).
    assert step_args(Action.objects.get(pk=shown["id"])) == {"id": "A-1", "price": 10.0}

    # A read that is a tool error, and one with no value at the path: refused, never forwarded,
    # nothing recorded (no action left running or failed for a call that was not made).
    broken, ghost = results["broken"], results["ghost"]
    assert broken.is_error and "inv.get_item" in text_of(broken) and "tool error" in text_of(broken)
    assert "the inventory database is unavailable" in text_of(broken)
    assert ghost.is_error and "has no 'item'" in text_of(ghost), text_of(ghost)
    assert ("set_price", "broken") not in calls and ("set_price", "ghost") not in calls
    assert ("get_item", "broken") in calls and ("get_item", "ghost") in calls
    assert not Action.objects.filter(args__id__in=["broken", "ghost"]).exists()

    # An after-read that fails after a successful call: the success is recorded (it happened),
    # without an after-image, and the gateway says so in its log.
    assert not results["fragile"].is_error, text_of(results["fragile"])
    fragile = Action.objects.get(tool="inv.set_price", args__id="fragile")
    assert fragile.status == "succeeded" and fragile.before_snapshot["price"] == 5.0
    assert fragile.after_snapshot is None
    assert "the after-read of set_price gave no image" in gateway_log(tmp_path)
    assert [tool for tool, _ in calls].count("set_price") == 2


def test_a_policy_that_gains_before_while_the_gateway_runs_is_followed_at_the_next_record(
    live_server, tenant, agent_key, tmp_path
):
    # A long refresh: only the record's answer (the policy the server froze on the action) can
    # tell the gateway its copy is stale.
    async def scenario(gateway_url: str, reload: Any) -> list[Any]:
        async with Client(gateway_url, mode="legacy") as client:
            plain = await client.call_tool("set_price", {"id": "A-1", "price": 11})
            await asyncio.to_thread(reload)
            stale = await client.call_tool("set_price", {"id": "A-1", "price": 12})
            again = await client.call_tool("set_price", {"id": "A-1", "price": 12})
        return [plain, stale, again]

    with inventory(tmp_path, "structured") as upstream:
        load_inventory_policies(tenant, tmp_path, upstream.url, before=False)
        with http_gateway(
            live_server.url, upstream.url, agent_key[1], tmp_path, "--policy-refresh", "600", namespace="inv"
        ) as url:
            plain, stale, again = asyncio.run(
                scenario(url, lambda: load_inventory_policies(tenant, tmp_path, upstream.url))
            )
        calls = upstream.calls()
    assert not plain.is_error and not again.is_error, (text_of(plain), text_of(again))
    assert stale.is_error and "call it again" in text_of(stale), text_of(stale)
    # The stale call never reached set_price; the one made again was read before and after.
    assert calls == [("set_price", "A-1"), ("get_item", "A-1"), ("set_price", "A-1"), ("get_item", "A-1")]
    statuses = list(Action.objects.order_by("seq").values_list("status", "before_snapshot"))
    assert statuses[0] == ("succeeded", None)
    assert statuses[1][0] == "failed"
    assert statuses[2] == ("succeeded", {"id": "A-1", "name": "Widget", "price": 11})


def test_the_policy_copy_is_revalidated_with_if_none_match_within_the_refresh(
    live_server, tenant, agent_key, tmp_path
):
    def log_count(event: str) -> int:
        return gateway_log(tmp_path).count(f"event={event}")

    async def call(gateway_url: str, tool: str, args: dict[str, Any]) -> Any:
        async with Client(gateway_url, mode="legacy") as client:
            return await client.call_tool(tool, args)

    with inventory(tmp_path, "text") as upstream:
        load_inventory_policies(tenant, tmp_path, upstream.url, before=False)
        with http_gateway(
            live_server.url,
            upstream.url,
            agent_key[1],
            tmp_path,
            "--policy-refresh",
            "0.5",
            env={"SAGA_MCP_LOG_LEVEL": "DEBUG"},
            namespace="inv",
        ) as url:
            read = lambda: asyncio.run(call(url, "get_item", {"id": "B-2"}))  # noqa: E731
            read()
            assert log_count("policies_loaded") == 1
            # Nothing changed: revalidations are answered 304 (no body), the copy kept.
            wait_for(lambda: read() and log_count("policies_not_modified") >= 1, timeout=30, what="a 304")
            assert log_count("policies_loaded") == 1
            load_inventory_policies(tenant, tmp_path, upstream.url)
            # Within the refresh, a read's revalidation brings the new policy.
            wait_for(lambda: read() and log_count("policies_loaded") == 2, timeout=30, what="the new policy")
            updated = asyncio.run(call(url, "set_price", {"id": "B-2", "price": 21}))
        calls = upstream.calls()
    assert not updated.is_error, text_of(updated)
    assert calls[-3:] == [("get_item", "B-2"), ("set_price", "B-2"), ("get_item", "B-2")]
    action = Action.objects.get(tool="inv.set_price")
    assert action.before_snapshot["price"] == 20.0 and action.after_snapshot["price"] == 21


def test_an_upstream_restarted_before_an_approved_forward_gets_one_call_with_its_images(
    live_server, tenant, agent_key, approver_key, tmp_path
):
    approver = api(live_server, approver_key[1])

    async def approve_after(restart: Any) -> None:
        while True:
            pending = await asyncio.to_thread(
                lambda: approver.get("/approvals", params={"status": "pending"}).json()["items"]
            )
            if pending:
                # The upstream restarts while the call waits for its approval: the gateway's
                # session is gone when it comes to read and forward.
                await asyncio.to_thread(restart)
                answer = await asyncio.to_thread(
                    lambda: approver.post(f"/approvals/{pending[0]['id']}/approve", json={"reason": "ok"})
                )
                assert answer.status_code == 200, answer.text
                return
            await asyncio.sleep(0.2)

    async def scenario(gateway_url: str, restart: Any) -> Any:
        async with Client(gateway_url, mode="legacy") as client:
            approving = asyncio.create_task(approve_after(restart))
            result = await client.call_tool("set_price", {"id": "A-1", "price": 9})
            await approving
        return result

    with inventory(tmp_path, "structured") as upstream:
        load_inventory_policies(tenant, tmp_path, upstream.url, approval="manual")
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path, namespace="inv") as url:
            result = asyncio.run(scenario(url, upstream.restart))
        calls = upstream.calls()
    assert not result.is_error, text_of(result)
    # One call for one approval; the read before it was made again on the new session.
    assert [c for c in calls if c[0] == "set_price"] == [("set_price", "A-1")]
    assert calls[0] == ("get_item", "A-1") and calls[-1] == ("get_item", "A-1")
    action = Action.objects.get(tool="inv.set_price")
    assert (action.status, action.attempts) == ("succeeded", 1)
    assert action.before_snapshot["price"] == 10.0 and action.after_snapshot["price"] == 9
    assert "event=upstream_session_lost" in gateway_log(tmp_path)


def test_a_before_read_on_a_session_the_upstream_lost_is_made_again_on_a_new_one(
    live_server, tenant, agent_key, tmp_path
):
    async def scenario(gateway_url: str, restart: Any) -> list[Any]:
        async with Client(gateway_url, mode="legacy") as client:
            first = await client.call_tool("set_price", {"id": "A-1", "price": 11})
            await asyncio.to_thread(restart)
            # The first request on the dead session is the before-read: "Session not found".
            second = await client.call_tool("set_price", {"id": "B-2", "price": 22})
        return [first, second]

    with inventory(tmp_path, "text") as upstream:
        load_inventory_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path, namespace="inv") as url:
            first, second = asyncio.run(scenario(url, upstream.restart))
        calls = upstream.calls()
    assert not first.is_error and not second.is_error, (text_of(first), text_of(second))
    assert calls[3:] == [("get_item", "B-2"), ("set_price", "B-2"), ("get_item", "B-2")]
    action = Action.objects.get(tool="inv.set_price", args__id="B-2")
    assert action.before_snapshot["price"] == 20.0 and action.after_snapshot["price"] == 22
    log = gateway_log(tmp_path)
    assert "event=upstream_session_lost" in log and "during=tools/call get_item" in log, log
