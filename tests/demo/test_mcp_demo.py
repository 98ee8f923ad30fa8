"""The MCP demo of `make run`: the demo MCP server and a real `saga-mcp` gateway in front of it (as
processes), seed_demo's setup pointing the people.* MCP compensators at that server, the demo's MCP
agent (a real `mcp.Client`) playing its session through the gateway into the recovery queue, and
alice's Compensate carried out by a real worker, which calls the server's undo tools newest first."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from demo import mcp_agent
from tests.support.mcp_servers import http_gateway, http_upstream
from tests.support.processes import dump_worker_logs, wait_for, work_under_way

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def _seed_demo(*args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command("seed_demo", *args, stdout=out, **options)
    return out.getvalue()


@pytest.mark.slow
def test_the_seeded_mcp_session_fails_into_the_queue_and_compensating_it_undoes_it_through_mcp_in_lifo_order(
    live_server: Any, tmp_path: Path, start_worker: Any
) -> None:
    from django.contrib.auth import get_user_model

    from ledger.audit import Actor
    from ledger.models import Action, Compensator, Run
    from recovery.actions.compensations import unwind_start
    from recovery.models import RecoveryItem

    with http_upstream(tmp_path) as upstream:
        # What make run does: the setup with the server's URL, then the gateway's key by name.
        _seed_demo(url=live_server.url, setup_only=True, mcp_url=upstream.url)
        assert set(Compensator.objects.filter(tool__startswith="people.").values_list("url", "mcp_tool")) == {
            (upstream.url, "delete_user"),
            (upstream.url, "revoke_license"),
            (upstream.url, "send_correction"),
            (upstream.url, "update_title"),
        }
        key = _seed_demo(print_key="acme-mcp-gateway").strip()
        assert key.startswith("sk_")

        with http_gateway(
            live_server.url, upstream.url, key, tmp_path, "--agent", mcp_agent.AGENT, namespace="people"
        ) as gateway_url:
            said: list[str] = []
            run = mcp_agent.seed_session(
                base_url=live_server.url, key=key, gateway_url=gateway_url, log=said.append
            )
            assert run is not None and run["status"] == "failed"
            assert "failed into the recovery queue" in said[0] and "is not an email address" in said[0]
            # A second seed finds the session's run and plays nothing.
            assert mcp_agent.seed_session(base_url=live_server.url, key=key, gateway_url=gateway_url) is None
        # The first seeding played the session once: one run, one queue item, one create_user
        # upstream (a second would fail there, "A user … already exists", into a second item).
        assert upstream.tools_called() == ["create_user", "assign_license", "send_email"]
        assert Run.objects.filter(agent=mcp_agent.AGENT).count() == 1
        assert RecoveryItem.objects.filter(run__agent=mcp_agent.AGENT).count() == 1

        recorded = Run.objects.get(pk=run["id"])
        assert (recorded.agent, recorded.tenant.slug) == ("mcp-agent", "acme")
        assert recorded.metadata["mcp_client"] == "saga-demo-onboarding-agent 1.0"
        actions = list(recorded.actions.order_by("seq"))
        assert [(a.tool, a.status) for a in actions] == [
            ("people.create_user", Action.Status.SUCCEEDED),
            ("people.assign_license", Action.Status.SUCCEEDED),
            ("people.send_email", Action.Status.FAILED),
        ]
        assert actions[2].args["to"] == "sofia.marino@@outlook.example"
        # The global demo policies named the compensations: the MCP calls carried none.
        assert [a.compensation_tool for a in actions[:2]] == ["people.delete_user", "people.revoke_license"]
        item = recorded.recovery_items.get(status=RecoveryItem.Status.OPEN)
        assert (item.reason, item.failed_action_id) == ("failed", actions[2].pk)
        # The session has ended, so no one would pick up a resume: the queue suggests what the
        # story does (and the run page shows the same field), Compensate.
        assert item.suggested_resolution == RecoveryItem.Suggestion.COMPENSATE

        # Alice compensates; the worker calls the server's undo tools, the licence first.
        worker = start_worker()
        alice = get_user_model().objects.get(username="alice")
        unwind_start(item=item, actor=Actor.for_user(alice), reason="Sofia withdrew her acceptance")
        try:
            wait_for(
                lambda: Run.objects.get(pk=recorded.pk).status == Run.Status.COMPENSATED,
                timeout=60,
                interval=0.25,
                what="the MCP session's run to be compensated",
                progress=work_under_way(worker.log_path),
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
        undo = [call for call in upstream.calls() if call["tool"] in ("revoke_license", "delete_user")]
        assert [(call["tool"], call["args"]) for call in undo] == [
            ("revoke_license", {"email": "sofia.marino@acme.example", "sku": "business-standard"}),
            ("delete_user", {"email": "sofia.marino@acme.example"}),
        ]
        assert all(call["idempotency_key"] for call in undo)
        assert [a.status for a in recorded.actions.order_by("seq")] == [
            Action.Status.COMPENSATED,
            Action.Status.COMPENSATED,
            Action.Status.FAILED,
        ]
        assert RecoveryItem.objects.get(pk=item.pk).resolution == RecoveryItem.Resolution.COMPENSATED


async def _title_calls(url: str) -> dict[str, Any]:
    from mcp import Client

    async with Client(url, mode="legacy") as client:
        return {
            "before": await client.call_tool("get_user", {"email": "priya.raman@acme.example"}),
            "updated": await client.call_tool(
                "update_title", {"email": "priya.raman@acme.example", "title": "Support manager"}
            ),
            "after": await client.call_tool("get_user", {"email": "priya.raman@acme.example"}),
            "blank": await client.call_tool(
                "update_title", {"email": "priya.raman@acme.example", "title": " "}
            ),
            "nobody": await client.call_tool("get_user", {"email": "nobody@acme.example"}),
        }


def test_the_demo_mcp_server_reads_and_updates_a_title_as_the_policy_before_expects(tmp_path: Path) -> None:
    from ledger.policies.before_images import image_at, read_result

    def image(result: Any) -> Any:
        texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
        return image_at(read_result(structured=result.structured_content, texts=texts), "user")

    with http_upstream(tmp_path, HR_MCP_DIRECTORY="acme") as upstream:
        said = asyncio.run(_title_calls(upstream.url))
        # A write is journaled; the reads are not.
        assert upstream.tools_called() == ["update_title", "update_title"]
    assert not said["before"].is_error and not said["updated"].is_error
    before, after = image(said["before"]), image(said["after"])
    assert before == {
        "user_id": before["user_id"],
        "email": "priya.raman@acme.example",
        "name": "Priya Raman",
        "title": "Support lead",
    }
    assert after == {**before, "title": "Support manager"} == image(said["updated"])
    assert said["blank"].is_error and said["nobody"].is_error


@pytest.mark.slow
def test_the_seeded_promotion_session_updates_a_title_through_the_gateway_into_the_queue(
    live_server: Any, tmp_path: Path
) -> None:
    from ledger.models import Action, Run, StateReader
    from recovery.models import RecoveryItem

    with http_upstream(tmp_path, HR_MCP_DIRECTORY="acme") as upstream:
        _seed_demo(url=live_server.url, setup_only=True, mcp_url=upstream.url)
        # The worker reads people.get_user on the same server to check and verify the undo.
        reader = StateReader.objects.get(tenant=None, tool="people.get_user")
        assert (reader.kind, reader.url, reader.mcp_tool) == ("mcp", upstream.url, "get_user")
        key = _seed_demo(print_key="acme-mcp-gateway").strip()
        with http_gateway(
            live_server.url, upstream.url, key, tmp_path, "--agent", mcp_agent.AGENT, namespace="people"
        ) as gateway_url:
            said: list[str] = []
            run = mcp_agent.seed_promotion_session(
                base_url=live_server.url, key=key, gateway_url=gateway_url, log=said.append
            )
            assert run is not None and run["status"] == "failed"
            assert "MCP promotion session" in said[0] and "Unknown SKU 'business-premium'" in said[0]
            assert (
                mcp_agent.seed_promotion_session(base_url=live_server.url, key=key, gateway_url=gateway_url)
                is None
            )
        assert upstream.tools_called() == ["update_title", "assign_license"]

    recorded = Run.objects.get(pk=run["id"])
    assert recorded.metadata["mcp_client"] == mcp_agent.PROMOTION_CLIENT_LABEL
    actions = list(recorded.actions.order_by("seq"))
    assert [(a.tool, a.status) for a in actions] == [
        ("people.update_title", Action.Status.SUCCEEDED),
        ("people.assign_license", Action.Status.FAILED),
    ]
    title = actions[0]
    assert title.args == {"email": "priya.raman@acme.example", "title": "Support manager"}
    # The update's frozen policy names its read, which the gateway takes the images with, and
    # its undo: the same tool with the title the read found before.
    assert title.policy["before"] == {
        "tool": "people.get_user",
        "args": {"email": "$args.email"},
        "path": "user",
    }
    assert (title.compensation_tool, title.compensation_args) == (
        "people.update_title",
        {"email": "$args.email", "title": "$before.title"},
    )
    assert recorded.recovery_items.get().status == RecoveryItem.Status.OPEN


def test_an_mcp_url_that_is_not_one_is_refused_with_a_clear_error(db: Any) -> None:
    from ledger.models import Compensator

    with pytest.raises(CommandError, match="mcp-url"):
        _seed_demo(url="http://127.0.0.1:8000", setup_only=True, mcp_url="file:///etc/passwd")
    assert not Compensator.objects.filter(tool__startswith="people.").exists()


def test_setup_only_and_no_setup_together_are_refused(db: Any) -> None:
    # make run's seeding step skips the setup its --setup-only step has just done; both at once
    # would do nothing at all, silently.
    with pytest.raises(CommandError, match="--setup-only and --no-setup"):
        _seed_demo(url="http://127.0.0.1:8000", setup_only=True, no_setup=True)
