"""saga-mcp end to end: a real upstream MCP server (the SDK's, in a subprocess), the gateway as a
real process in front of it, a real ``mcp.Client`` talking to the gateway over stdio or
Streamable HTTP, the real Saga Admin (pytest-django's live server) and, for the undo, a real
worker calling the upstream's undo tools through MCP compensators."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from django.core.management import call_command
from mcp import Client, StdioServerParameters
from mcp_types import RequestParamsMeta

from ledger.models import Action, Run
from recovery.models import Approval, RecoveryItem
from tests.support.archived import archive_run_for_test
from tests.support.mcp_servers import (
    Upstream,
    gateway_command,
    gateway_env,
    http_gateway,
    http_upstream,
    stdio_upstream,
)
from tests.support.processes import ROOT, dump_worker_logs, free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

EXAMPLE_POLICIES = ROOT / "clients" / "python" / "examples" / "hr_workspace_policies.json"
TOKEN = "hr-upstream-token-for-tests"
UPSTREAM_TOOLS = [
    "create_user",
    "delete_user",
    "assign_license",
    "revoke_license",
    "send_email",
    "send_correction",
    "list_users",
    "get_user",
    "update_title",
]


def load_example_policies(tenant, tmp_path: Path, upstream_url: str) -> None:
    """The documented example policy file, its MCP compensators pointed at this test's upstream."""
    data = json.loads(EXAMPLE_POLICIES.read_text())
    for spec in data["compensators"].values():
        spec["mcp"] = upstream_url
    path = tmp_path / "hr_workspace_policies.json"
    path.write_text(json.dumps(data))
    call_command("load_policies", str(path), tenant=tenant.slug)


def stdio_gateway(saga_url: str, upstream: Upstream, key: str) -> StdioServerParameters:
    command = gateway_command(saga_url, " ".join(upstream.command()))
    return StdioServerParameters(
        command=command[0], args=command[1:], env=gateway_env(upstream.journal_path, key), cwd=str(ROOT)
    )


def api(live_server, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )


def run_of(result) -> str:
    return (result.meta or {})["saga/run"]


def text_of(result) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


# --- A session whose last call fails --------------------------------------------------------


async def onboarding_session(target: Any) -> list[Any]:
    """Three calls: a user, a license, then a license the upstream refuses (unknown SKU)."""
    async with Client(target, mode="legacy") as client:
        listed = await client.list_tools()
        results = [
            await client.call_tool("create_user", {"email": "ashu@company.com", "name": "Ashu Kumar"}),
            await client.call_tool(
                "assign_license", {"email": "ashu@company.com", "sku": "business-standard"}
            ),
            await client.call_tool("assign_license", {"email": "ashu@company.com", "sku": "enterprise-max"}),
        ]
    return [listed, *results]


def _the_mcp_run() -> Run | None:
    run = Run.objects.filter(agent="mcp").first()
    return run if run is not None and run.status != Run.Status.RUNNING else None


def assert_failed_session_recorded(results: list[Any], upstream_tools: list[str]) -> Run:
    listed, created, licensed, refused = results
    assert [tool.name for tool in listed.tools] == upstream_tools
    assert not created.is_error and not licensed.is_error
    assert refused.is_error and "Unknown SKU 'enterprise-max'" in text_of(refused)
    run = wait_for(_the_mcp_run, timeout=30, what="the session's run to end")
    assert run.status == Run.Status.FAILED
    assert created.meta["saga/run"] == refused.meta["saga/run"] == run.pk
    actions = list(run.actions.order_by("seq"))
    assert [(a.tool, a.status) for a in actions] == [
        ("hr.create_user", Action.Status.SUCCEEDED),
        ("hr.assign_license", Action.Status.SUCCEEDED),
        ("hr.assign_license", Action.Status.FAILED),
    ]
    assert actions[0].args == {"email": "ashu@company.com", "name": "Ashu Kumar"}
    assert actions[0].result["email"] == "ashu@company.com"  # the upstream's structuredContent
    assert "Unknown SKU" in actions[2].error
    # The policy named the compensations: MCP calls carry none of their own.
    assert [a.compensation_tool for a in actions[:2]] == ["hr.delete_user", "hr.revoke_license"]
    item = RecoveryItem.objects.get(run=run)
    assert item.failed_action_id == actions[2].pk
    return run


def test_a_failed_stdio_session_lands_in_the_queue_with_its_ledger_in_order(
    live_server, tenant, agent_key, tmp_path
):
    upstream = stdio_upstream(tmp_path)
    load_example_policies(tenant, tmp_path, "http://127.0.0.1:9/mcp")
    results = asyncio.run(onboarding_session(stdio_gateway(live_server.url, upstream, agent_key[1])))
    assert_failed_session_recorded(results, UPSTREAM_TOOLS)
    assert upstream.tools_called() == ["create_user", "assign_license", "assign_license"]


def test_a_failed_http_session_is_compensated_through_the_upstreams_undo_tools_in_lifo_order(
    live_server, tenant, agent_key, operator_key, tmp_path, start_worker
):
    # The upstream wants a bearer token: the gateway and the worker's compensators both send it,
    # each from its own environment.
    with http_upstream(tmp_path, HR_MCP_TOKEN=TOKEN) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(
            live_server.url,
            upstream.url,
            agent_key[1],
            tmp_path,
            "--upstream-header",
            "Authorization=HR_MCP_AUTH",
            env={"HR_MCP_AUTH": f"Bearer {TOKEN}"},
        ) as gateway_url:
            results = asyncio.run(onboarding_session(gateway_url))
        run = assert_failed_session_recorded(results, UPSTREAM_TOOLS)
        assert upstream.tools_called() == ["create_user", "assign_license", "assign_license"]

        worker = start_worker(HR_MCP_AUTH=f"Bearer {TOKEN}")
        operator = api(live_server, operator_key[1])
        [item] = operator.get("/recovery", params={"run": run.pk}).json()["items"]
        response = operator.post(f"/recovery/{item['id']}/compensate", json={"reason": "the hire withdrew"})
        assert response.status_code == 202, response.text
        unwind_id = response.json()["id"]

        def finished() -> dict | None:
            unwind = operator.get(f"/unwinds/{unwind_id}").json()
            return unwind if unwind["status"] in ("completed", "failed") else None

        try:
            unwind = wait_for(finished, timeout=60, what="the unwind to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
        assert unwind["status"] == "completed", unwind
        undo = [call for call in upstream.calls() if call["tool"] in ("revoke_license", "delete_user")]
        # LIFO: the license (done second) is revoked before the user (done first) is deleted.
        assert [(c["tool"], c["args"]) for c in undo] == [
            ("revoke_license", {"email": "ashu@company.com", "sku": "business-standard"}),
            ("delete_user", {"email": "ashu@company.com"}),
        ]
        # Each undo carries its step's stable idempotency key.
        assert all(c["idempotency_key"] for c in undo)
        run.refresh_from_db()
        assert run.status == Run.Status.COMPENSATED


# --- Approval, pause, outage -----------------------------------------------------------------


def test_a_gated_call_waits_for_an_approvers_decision_and_reaches_the_upstream_once_with_the_approved_args(
    live_server, tenant, agent_key, approver_key, tmp_path
):
    approver = api(live_server, approver_key[1])

    async def scenario(gateway_url: str) -> tuple[Any, list[str]]:
        reports: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reports.append(message or "")

        async def approve_when_asked() -> None:
            while True:
                pending = await asyncio.to_thread(
                    lambda: approver.get("/approvals", params={"status": "pending"}).json()["items"]
                )
                if pending:
                    [approval] = pending
                    # The approver fixes the subject: the upstream gets the approved args.
                    edited = {**approval["args"], "subject": "Welcome to Acme"}
                    answer = await asyncio.to_thread(
                        lambda: approver.post(
                            f"/approvals/{approval['id']}/approve",
                            json={
                                "reason": "welcome mail ok",
                                "args": edited,
                                "args_hash": approval["args_hash"],
                            },
                        )
                    )
                    assert answer.status_code == 200, answer.text
                    return
                await asyncio.sleep(0.2)

        async with Client(gateway_url, mode="legacy") as client:
            approving = asyncio.create_task(approve_when_asked())
            result = await client.call_tool(
                "send_email",
                {"to": "ashu@company.com", "subject": "Welcome", "body": "Hello Ashu"},
                progress_callback=on_progress,
            )
            await approving
        return result, reports

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path) as gateway_url:
            result, progress = asyncio.run(scenario(gateway_url))
        assert not result.is_error, text_of(result)
        assert result.structured_content["to"] == "ashu@company.com"
        [call] = upstream.calls()
        assert (call["tool"], call["args"]["subject"]) == ("send_email", "Welcome to Acme")
        assert any("approve hr.send_email" in message for message in progress), progress
        action = Action.objects.get(tool="hr.send_email")
        assert action.status == Action.Status.SUCCEEDED


def test_a_rejected_or_undecided_call_is_a_tool_error_and_never_reaches_the_upstream(
    live_server, tenant, agent_key, approver_key, tmp_path
):
    approver = api(live_server, approver_key[1])

    async def scenario(gateway_url: str) -> tuple[Any, Any]:
        async with Client(gateway_url, mode="legacy") as client:
            timed_out = await client.call_tool(
                "send_email", {"to": "a@company.com", "subject": "Hi", "body": "x"}
            )

            async def reject_when_asked() -> None:
                while True:
                    pending = await asyncio.to_thread(
                        lambda: approver.get("/approvals", params={"status": "pending"}).json()["items"]
                    )
                    fresh = [a for a in pending if a["args"].get("to") == "b@company.com"]
                    if fresh:
                        await asyncio.to_thread(
                            lambda: approver.post(
                                f"/approvals/{fresh[0]['id']}/reject", json={"reason": "not today"}
                            )
                        )
                        return
                    await asyncio.sleep(0.2)

            rejecting = asyncio.create_task(reject_when_asked())
            rejected = await client.call_tool(
                "send_email", {"to": "b@company.com", "subject": "Hi", "body": "x"}
            )
            await rejecting
        return timed_out, rejected

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(
            live_server.url, upstream.url, agent_key[1], tmp_path, "--approval-timeout", "1.5"
        ) as gateway_url:
            timed_out, rejected = asyncio.run(scenario(gateway_url))
        # The session ended with the gateway: the approval its timed-out call waited for is
        # withdrawn with the run, not left in an approver's inbox for a run that is over.
        assert not Approval.objects.filter(status="pending").exists()
        assert Approval.objects.filter(reason__startswith="withdrawn: the run").count() == 1
        assert timed_out.is_error and "within 1.5 s" in text_of(timed_out)
        assert rejected.is_error and "rejected" in text_of(rejected) and "not today" in text_of(rejected)
        assert upstream.tools_called() == []


def test_a_paused_tool_never_reaches_the_upstream(live_server, tenant, agent_key, operator_key, tmp_path):
    operator = api(live_server, operator_key[1])
    paused = operator.post("/pauses", json={"tool": "hr.create_user", "reason": "HR directory migration"})
    assert paused.status_code == 201, paused.text

    async def scenario(gateway_url: str) -> tuple[Any, Any]:
        async with Client(gateway_url, mode="legacy") as client:
            refused = await client.call_tool("create_user", {"email": "zoe@company.com", "name": "Zoe"})
            allowed = await client.call_tool("list_users", {})
        return refused, allowed

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path) as gateway_url:
            refused, allowed = asyncio.run(scenario(gateway_url))
        assert refused.is_error
        assert "Paused" in text_of(refused) and "HR directory migration" in text_of(refused)
        assert "not made" in text_of(refused)
        assert not allowed.is_error
        assert upstream.tools_called() == []
        assert not Action.objects.filter(tool="hr.create_user").exists()


def test_with_saga_admin_down_no_call_is_forwarded(tmp_path):
    with http_upstream(tmp_path) as upstream:
        dead = f"http://127.0.0.1:{free_port()}"

        async def scenario(gateway_url: str) -> Any:
            async with Client(gateway_url, mode="legacy") as client:
                return await client.call_tool("create_user", {"email": "zoe@company.com", "name": "Zoe"})

        with http_gateway(dead, upstream.url, "sk_test_key", tmp_path) as gateway_url:
            result = asyncio.run(scenario(gateway_url))
        assert result.is_error
        assert "Saga Admin could not be reached" in text_of(result) and "not made" in text_of(result)
        assert upstream.tools_called() == []


# --- The stateless 2026 protocol ----------------------------------------------------------------


def test_a_stateless_client_gets_a_run_per_call_unless_it_passes_the_run_back(
    live_server, tenant, agent_key, tmp_path
):
    async def scenario(gateway_url: str) -> list[Any]:
        async with Client(gateway_url) as client:
            assert client.protocol_version == "2026-07-28"
            first = await client.call_tool("create_user", {"email": "lee@company.com", "name": "Lee"})
            joined = await client.call_tool(
                "assign_license",
                {"email": "lee@company.com", "sku": "business-starter"},
                meta=cast(RequestParamsMeta, {"saga/run": run_of(first)}),
            )
            separate = await client.call_tool("list_users", {})
            forged = await client.call_tool(
                "list_users", {}, meta=cast(RequestParamsMeta, {"saga/run": "run_somebody_elses"})
            )
        return [first, joined, separate, forged]

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(
            live_server.url, upstream.url, agent_key[1], tmp_path, "--idle-timeout", "2"
        ) as gateway_url:
            first, joined, separate, forged = asyncio.run(scenario(gateway_url))
            assert joined.meta["saga/run"] == first.meta["saga/run"]
            assert separate.meta["saga/run"] != first.meta["saga/run"]
            assert forged.is_error and "not a run this gateway started" in text_of(forged)
            # Idle runs end: both complete (nothing failed).
            wait_for(
                lambda: Run.objects.filter(agent="mcp", status=Run.Status.SUCCEEDED).count() == 2,
                timeout=30,
                what="the idle stateless runs to complete",
            )
        shared = Run.objects.get(pk=first.meta["saga/run"])
        assert [a.tool for a in shared.actions.order_by("seq")] == ["hr.create_user", "hr.assign_license"]
        assert upstream.tools_called() == ["create_user", "assign_license"]


def test_a_call_on_a_run_archived_meanwhile_is_a_clear_tool_error(live_server, tenant, agent_key, tmp_path):
    """Pass: a stateless client passes back a run that retention has archived since: the call is a
    tool error saying so (where and when), not a crash, and never reaches the upstream."""
    archive = "s3://saga-archive/acme/mcp-run.manifest.json"

    async def first(gateway_url: str) -> Any:
        async with Client(gateway_url) as client:
            return await client.call_tool("create_user", {"email": "ria@company.com", "name": "Ria"})

    async def again(gateway_url: str, run_id: str) -> Any:
        async with Client(gateway_url) as client:
            return await client.call_tool(
                "assign_license",
                {"email": "ria@company.com", "sku": "business-starter"},
                meta=cast(RequestParamsMeta, {"saga/run": run_id}),
            )

    with http_upstream(tmp_path) as upstream:
        load_example_policies(tenant, tmp_path, upstream.url)
        with http_gateway(live_server.url, upstream.url, agent_key[1], tmp_path) as gateway_url:
            created = asyncio.run(first(gateway_url))
            assert not created.is_error, text_of(created)
            tombstone = archive_run_for_test(Run.objects.get(pk=run_of(created)), archive)
            refused = asyncio.run(again(gateway_url, run_of(created)))
        assert refused.is_error
        said = text_of(refused)
        assert said.startswith("This run was archived in Saga Admin")
        assert archive in said and tombstone.archived_at.isoformat() in said
        assert "the call was not made" in said and "Start a new session" in said
        assert upstream.tools_called() == ["create_user"]


# --- Starting up ---------------------------------------------------------------------------


def test_it_refuses_to_start_without_a_key_in_the_environment(tmp_path):
    done = subprocess.run(
        gateway_command("http://127.0.0.1:1", "http://127.0.0.1:1/mcp"),
        env=gateway_env(tmp_path / "j.jsonl", None),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"SAGA_API_KEY is not set" in done.stderr


def test_an_upstream_that_is_down_at_startup_is_a_clear_error(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    done = subprocess.run(
        gateway_command("http://127.0.0.1:1", dead, "--listen", f"127.0.0.1:{free_port()}"),
        env=gateway_env(tmp_path / "j.jsonl", "sk_test_key"),
        capture_output=True,
        timeout=90,
    )
    assert done.returncode == 1
    assert f"the upstream MCP server {dead} did not answer".encode() in done.stderr
    assert b"Traceback" not in done.stderr, done.stderr.decode()  # one sentence, not a stack


def test_the_example_policy_file_loads_as_documented(db, tenant):
    call_command("load_policies", str(EXAMPLE_POLICIES), tenant=tenant.slug)
    from ledger.models import Compensator, ToolPolicy

    assert ToolPolicy.objects.get(tenant=tenant, tool="hr.create_user").compensation_tool == "hr.delete_user"
    kinds = set(Compensator.objects.filter(tenant=tenant).values_list("kind", flat=True))
    assert kinds == {"mcp"}
    assert os.path.exists(EXAMPLE_POLICIES)
