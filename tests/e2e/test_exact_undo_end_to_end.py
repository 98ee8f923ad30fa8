"""Issue 42 end to end: an agent updates a contact in a real CRM (the SDK's MCP server over
Streamable HTTP, its contacts in a JSON file), through the Python client, the LangGraph adapter or
``saga-mcp``, with no image code of its own; the run fails; an operator compensates through the real
API; a real ``saga_worker`` process checks the value before the undo, calls the CRM's
``update_contact`` back over MCP and reads the value back. The four flows, for each agent:

- ``exact``: the update undone and verified (the contact as it was, the run compensated);
- ``drift``: a hand edit after the agent: the undo step drifted, the compensator never called, the
  hand edit kept, the queue item saying so;
- ``ignored``: the CRM acknowledges the undo and changes nothing: ``not_restored``;
- ``refused``: the before-read fails (no such contact), so the update never reaches the CRM.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from mcp import Client

from ledger.models import Action, Run
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.support.mcp_servers import answers, http_gateway
from tests.support.processes import free_port, wait_for, work_under_way

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

CRM_SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_crm.py"
ORIGINAL = {"id": "c-9", "email": "ana@old.example", "phone": "+1 555 0100"}
WRONG = "ana@wrong.example"
BY_HAND = "ana@fixed-by-hand.example"
UNKNOWN = "c-404"  # no such contact: get_contact answers a tool error

AGENTS = ["python", "langgraph", "saga-mcp"]
FLOWS = ["exact", "drift", "ignored", "refused"]


# --- The CRM, one server for the module; its state file reset for each test ------------------


class Crm:
    def __init__(self, root: Path) -> None:
        self.state_path = root / "crm-state.json"
        self.journal_path = root / "crm-journal.jsonl"
        self.url = ""

    def reset(self) -> None:
        self.state_path.write_text(json.dumps({"contacts": {"c-9": dict(ORIGINAL)}}))
        self.journal_path.write_text("")

    def _state(self) -> dict[str, Any]:
        return dict(json.loads(self.state_path.read_text()))

    def contact(self) -> dict[str, Any]:
        return dict(self._state()["contacts"]["c-9"])

    def edit_by_hand(self, **fields: str) -> None:
        state = self._state()
        state["contacts"]["c-9"].update(fields)
        self.state_path.write_text(json.dumps(state))

    def ignore_updates(self) -> None:
        self.state_path.write_text(json.dumps({**self._state(), "ignore_updates": True}))

    def calls(self, tool: str) -> list[dict[str, Any]]:
        lines = self.journal_path.read_text().splitlines()
        return [entry["args"] for entry in map(json.loads, lines) if entry["tool"] == tool]


@pytest.fixture(scope="module")
def crm_server(tmp_path_factory) -> Iterator[Crm]:
    root = tmp_path_factory.mktemp("crm")
    crm = Crm(root)
    crm.reset()
    port = free_port()
    crm.url = f"http://127.0.0.1:{port}/mcp"
    env = {"CRM_STATE": str(crm.state_path), "CRM_JOURNAL": str(crm.journal_path), "PYTHONUNBUFFERED": "1"}
    with (root / "crm.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, str(CRM_SERVER), "--http", f"127.0.0.1:{port}"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: answers(crm.url), timeout=30, what="the CRM MCP server")
        yield crm
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def crm(crm_server: Crm) -> Crm:
    crm_server.reset()
    return crm_server


def mcp_call(url: str, tool: str, args: dict[str, Any]) -> Any:
    """One call over MCP with the official SDK's client, as an agent's code makes it."""

    async def call() -> Any:
        async with Client(url, mode="legacy") as client:
            return await client.call_tool(tool, args)

    return asyncio.run(call())


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def crm_tool(url: str, tool: str, args: dict[str, Any]) -> Any:
    """The CRM's answer (its structured content), or the tool error raised."""
    result = mcp_call(url, tool, args)
    if result.is_error:
        raise LookupError(text_of(result))
    return result.structured_content


# --- The policy file, loaded by the real loader ----------------------------------------------


def load_policies(tenant, crm: Crm, tmp_path: Path) -> None:
    document = {
        "policies": [
            {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"},
            {
                "tool": "crm.update_contact",
                "risk": "medium",
                "approval": "auto",
                "action_class": "internal_update",
                "compensation": "custom",
                "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
                "compensation_tool": "crm.update_contact",
                "compensation_args": {"id": "$args.id", "email": "$before.email", "phone": "$before.phone"},
            },
        ],
        "compensators": {"crm.update_contact": {"mcp": crm.url, "tool": "update_contact"}},
        "readers": {"crm.get_contact": {"mcp": crm.url, "tool": "get_contact"}},
    }
    path = tmp_path / "crm-policies.json"
    path.write_text(json.dumps(document))
    call_command("load_policies", str(path), tenant=tenant.slug)


# --- The three agents: each updates the contact, then fails looking up one that does not exist -


def python_agent(saga_url: str, key: str, crm: Crm, contact: str, tmp_path: Path) -> str:
    """The Python client: a reader registered once, a step with no before=/after=."""
    from saga_client import Saga

    with Saga(saga_url, key, poll_interval_s=0.05, backoff_s=0.01) as saga:

        @saga.reader("crm.get_contact")
        def get_contact(id: str) -> Any:  # noqa: A002 - the CRM's own argument name
            return crm_tool(crm.url, "get_contact", {"id": id})

        run_id = ""
        try:
            with saga.run(agent="crm-agent", request="Fix Ana's e-mail") as run:
                run_id = run.id
                change = {"id": contact, "email": WRONG}
                run.step(
                    "crm.update_contact",
                    target=("contact", contact),
                    args=change,
                    do=lambda args: crm_tool(crm.url, "update_contact", args),
                )
                run.step(
                    "crm.get_contact",
                    args={"id": UNKNOWN},
                    do=lambda args: crm_tool(crm.url, "get_contact", args),
                )
        except Exception:  # noqa: BLE001 - the agent's failure: the run failed with it
            pass
        return run_id


def langgraph_agent(saga_url: str, key: str, crm: Crm, contact: str, tmp_path: Path) -> str:
    """A LangGraph graph (scripted model) whose CRM tools are wrapped by the adapter: the wrapped
    read is the reader."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from saga_client import Saga
    from saga_client.langgraph import saga_tools

    @tool
    def get_contact(id: str) -> dict:  # noqa: A002 - the CRM's own argument name
        """Read a contact."""
        return dict(crm_tool(crm.url, "get_contact", {"id": id}))

    @tool
    def update_contact(id: str, email: str) -> dict:  # noqa: A002
        """Change a contact's e-mail."""
        return dict(crm_tool(crm.url, "update_contact", {"id": id, "email": email}))

    calls = [
        {"name": "update_contact", "args": {"id": contact, "email": WRONG}},
        {"name": "get_contact", "args": {"id": UNKNOWN}},
    ]
    replies = [AIMessage("", tool_calls=[{**call, "id": f"call_{n}"}]) for n, call in enumerate(calls)]
    model = GenericFakeChatModel(messages=iter([*replies, AIMessage("done")]))
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node(
        "tools", ToolNode(saga_tools([get_contact, update_contact], namespace="crm"), handle_tool_errors=True)
    )
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    with Saga(saga_url, key, poll_interval_s=0.05, backoff_s=0.01) as saga:
        # The graph goes on past the failed tools (ToolNode hands their errors to the model); the
        # adapter fails the run at the block's end, as saga-mcp fails such a session.
        with saga.run(agent="crm-agent", request="Fix Ana's e-mail") as run:
            graph.compile().invoke({"messages": [HumanMessage("Fix Ana's e-mail")]})
        return run.id


def mcp_agent(saga_url: str, key: str, crm: Crm, contact: str, tmp_path: Path) -> str:
    """An MCP host: one session through the real gateway in front of the CRM."""

    async def session(gateway: str) -> str:
        async with Client(gateway, mode="legacy") as client:
            await client.call_tool("update_contact", {"id": contact, "email": WRONG})
            lookup = await client.call_tool("get_contact", {"id": UNKNOWN})
        return str((lookup.meta or {})["saga/run"])

    with http_gateway(saga_url, crm.url, key, tmp_path, namespace="crm") as gateway:
        run_id = asyncio.run(session(gateway))
        # The session's end fails its run (a failed call not retried): wait for it here.
        wait_for(
            lambda: Run.objects.filter(pk=run_id, status=Run.Status.FAILED).exists(),
            timeout=30,
            what="the gateway to fail the session's run",
        )
    return run_id


AGENT_OF: dict[str, Callable[..., str]] = {
    "python": python_agent,
    "langgraph": langgraph_agent,
    "saga-mcp": mcp_agent,
}


# --- The test -------------------------------------------------------------------------------


def compensate(saga_url: str, operator: str, run_id: str) -> str:
    """The operator compensates the failed run through the real API; the unwind's id."""
    item = RecoveryItem.objects.get(run_id=run_id)
    response = httpx.post(
        f"{saga_url}/api/v1/recovery/{item.pk}/compensate",
        json={"reason": "undo the wrong e-mail"},
        headers={"Authorization": f"Bearer {operator}"},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("agent", AGENTS)
def test_an_update_is_undone_exactly_or_refused_end_to_end(
    live_server, tenant, agent_key, operator_key, crm, tmp_path, start_worker, agent, flow
):
    if agent == "langgraph":
        pytest.importorskip("langgraph")
    load_policies(tenant, crm, tmp_path)
    contact = UNKNOWN if flow == "refused" else "c-9"

    run_id = AGENT_OF[agent](live_server.url, agent_key[1], crm, contact, tmp_path)

    if flow == "refused":
        # The read failed, so the update was never sent to the CRM, nor recorded.
        assert crm.calls("get_contact")[0] == {"id": UNKNOWN}
        assert crm.calls("update_contact") == []
        assert not Action.objects.filter(tool="crm.update_contact").exists()
        assert crm.contact() == ORIGINAL
        return

    # The agent's update went through once, with both images taken for it.
    assert crm.calls("update_contact") == [{"id": "c-9", "email": WRONG, "phone": None}]
    update = Action.objects.get(run_id=run_id, tool="crm.update_contact")
    assert update.status == Action.Status.SUCCEEDED
    assert update.before_snapshot == ORIGINAL
    assert update.after_snapshot == {**ORIGINAL, "email": WRONG}
    assert Run.objects.get(pk=run_id).status == Run.Status.FAILED

    if flow == "drift":
        crm.edit_by_hand(email=BY_HAND)
    elif flow == "ignored":
        crm.ignore_updates()

    worker = start_worker()
    unwind_id = compensate(live_server.url, operator_key[1], run_id)
    unwind = wait_for(
        lambda: Unwind.objects.filter(
            pk=unwind_id, status__in=[Unwind.Status.COMPLETED, Unwind.Status.FAILED]
        ).first(),
        timeout=60,
        what="the worker to finish the unwind",
        progress=work_under_way(worker.log_path),
    )
    undone(agent, flow, crm, live_server.url, agent_key[1], unwind, update)


def undone(agent: str, flow: str, crm: Crm, saga_url: str, key: str, unwind: Unwind, update: Action) -> None:
    """What the worker's unwind left: the step, the run, the trail, the CRM and the queue item."""
    run_id = update.run_id
    step = UnwindStep.objects.get(unwind=unwind, action=update)
    run = Run.objects.get(pk=run_id)
    trail = httpx.get(
        f"{saga_url}/api/v1/runs/{run_id}/trail",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()
    undos = crm.calls("update_contact")[1:]
    # What the queue item's sentence names: the step's target (the Python client's step gives
    # one), else, for a call recorded without one (the adapter's, the gateway's), what was read.
    subject = "contact c-9" if agent == "python" else 'the contact read by crm.get_contact {"id": "c-9"}'

    if flow == "exact":
        assert unwind.status == Unwind.Status.COMPLETED, step.error
        assert step.status == UnwindStep.Status.DONE and step.verified is True
        assert undos == [{"id": "c-9", "email": ORIGINAL["email"], "phone": ORIGINAL["phone"]}]
        assert crm.contact() == ORIGINAL
        assert run.status == Run.Status.COMPENSATED
        [restored] = [entry for entry in trail["restored"] if entry["tool"] == "crm.update_contact"]
        assert restored["verified"] is True
    elif flow == "drift":
        assert unwind.status == Unwind.Status.FAILED
        assert step.status == UnwindStep.Status.DRIFTED
        assert undos == []  # the compensator was never called
        assert crm.contact() == {**ORIGINAL, "email": BY_HAND}  # the hand edit kept
        item = RecoveryItem.objects.get(run_id=run_id)
        assert item.reason == RecoveryItem.Reason.STATE_DRIFT
        assert (
            f'{subject} changed since the agent: email is "{BY_HAND}", not "{WRONG}"; '
            "the undo was not run so as not to overwrite it."
        ) in item.error
        assert run.status != Run.Status.COMPENSATED
    else:
        assert unwind.status == Unwind.Status.FAILED
        assert step.status == UnwindStep.Status.FAILED and step.verified is False
        assert len(undos) == 1  # acknowledged, not applied, and not called again
        assert crm.contact() == {**ORIGINAL, "email": WRONG}
        item = RecoveryItem.objects.get(run_id=run_id)
        assert item.reason == RecoveryItem.Reason.NOT_RESTORED
        assert f'{subject} did not come back after the undo: email is "{WRONG}"' in item.error
        assert run.status != Run.Status.COMPENSATED
        assert [e for e in trail["restored"] if e["tool"] == "crm.update_contact"] == []
