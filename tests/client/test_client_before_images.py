"""Before- and after-images taken by the Python client (API.md, "Before-images and verified undo"),
against the real server: a policy whose ``before`` names a read, a reader registered in Python,
and what the server recorded on the action (``GET /api/v1/actions/{id}``). The sync and async
clients, ``run.step``, ``@saga.tool``, ``run.plan``, ``run.record`` and the LangGraph adapter with
a scripted model, with no agent code for the images."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from saga_client import AsyncSaga, BeforeImageFailed, Saga
from saga_client._before import tool_readers

from ledger.models import Action, Run
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

READ = {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"}
UPDATE = {
    "tool": "crm.update_contact",
    "risk": "medium",
    "approval": "auto",
    "action_class": "internal_update",
    "compensation": "custom",
    "compensation_tool": "crm.update_contact",
    "compensation_args": {"id": "$args.id", "email": "$before.email", "phone": "$before.phone"},
}
BEFORE = {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"}
ORIGINAL = {"email": "ashu@old.example", "phone": "+49 1"}


def load(
    tenant, tmp_path: Path, *, before: bool = True, name: str = "crm.json", approval: str = "auto"
) -> None:
    update = {**UPDATE, "before": BEFORE} if before else {**UPDATE, "compensation_args": {"id": "$args.id"}}
    update["approval"] = approval
    path = tmp_path / name
    path.write_text(json.dumps({"policies": [READ, update]}))
    call_command("load_policies", str(path), tenant=tenant.slug)


class Crm:
    """The system the agent updates, in memory: its contacts, and every read and write made."""

    def __init__(self) -> None:
        self.contacts = {"c-1": dict(ORIGINAL)}
        self.reads: list[str] = []
        self.writes: list[dict[str, Any]] = []

    def get_contact(self, id: str) -> dict[str, Any]:
        self.reads.append(id)
        return {"contact": dict(self.contacts[id])}

    def update_contact(self, args: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(dict(args))
        self.contacts[args["id"]].update({k: v for k, v in args.items() if k != "id"})
        return {"ok": True}


@pytest.fixture(autouse=True)
def _no_tool_readers_left():
    """Readers that wrapped tools registered (process-wide) do not outlive the test."""
    yield
    for name in [n for n in tool_readers if n.startswith("crm.")]:
        del tool_readers[name]


@pytest.fixture
def crm() -> Crm:
    return Crm()


@pytest.fixture
def options(live_server, agent_key) -> dict[str, Any]:
    return {"base_url": live_server.url, "api_key": agent_key[1], "poll_interval_s": 0.05, "backoff_s": 0.01}


@pytest.fixture
def api(live_server, agent_key):
    with httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {agent_key[1]}"}
    ) as client:
        yield client


def recorded(api: httpx.Client, action_id: str) -> dict[str, Any]:
    answer = api.get(f"/actions/{action_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def the_update(run_id: str) -> Action:
    return Action.objects.get(run_id=run_id, tool="crm.update_contact")


CHANGE = {"id": "c-1", "email": "ashu@new.example"}
CHANGED = {"email": "ashu@new.example", "phone": "+49 1"}


def test_a_step_sends_the_before_image_with_the_record_and_the_after_image_with_the_success(
    tenant, tmp_path, options, api, crm
):
    load(tenant, tmp_path)
    with Saga(**options) as saga:
        saga.reader("crm.get_contact")(crm.get_contact)
        with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
    action = recorded(api, the_update(run.id).pk)
    assert action["status"] == "succeeded"
    assert action["before_snapshot"] == ORIGINAL and action["after_snapshot"] == CHANGED
    assert crm.reads == ["c-1", "c-1"] and crm.writes == [CHANGE]
    # The read itself is no step of the run.
    assert list(Action.objects.filter(run_id=run.id).values_list("tool", flat=True)) == ["crm.update_contact"]


@pytest.mark.parametrize(
    ("reader", "why"),
    [
        ("raises", r"LookupError: the CRM is down"),
        ("null", r"null at 'contact'"),
        ("text", r"not JSON"),
    ],
)
def test_a_read_that_fails_refuses_the_step_and_do_is_never_called(
    tenant, tmp_path, options, crm, reader, why
):
    load(tenant, tmp_path)

    def get_contact(id: str) -> Any:
        if reader == "raises":
            raise LookupError("the CRM is down")
        return {"contact": None} if reader == "null" else "contact c-1: ashu@old.example"

    with Saga(**options) as saga:
        saga.reader("crm.get_contact")(get_contact)
        with (
            pytest.raises(BeforeImageFailed, match=why) as refused,
            saga.run(agent="crm", request="Fix Ashu's e-mail") as run,
        ):
            run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
    assert refused.value.code == "before_image_failed" and refused.value.read_tool == "crm.get_contact"
    assert "crm.update_contact was not called" in str(refused.value)
    assert crm.writes == []
    assert not Action.objects.filter(run_id=run.id).exists()
    assert Run.objects.get(pk=run.id).status == "failed"


def test_a_step_without_a_reader_is_refused_naming_the_read(tenant, tmp_path, options, crm):
    load(tenant, tmp_path)
    with Saga(**options) as saga, saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
        with pytest.raises(BeforeImageFailed, match=r"no reader is registered for crm.get_contact"):
            run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
        # Given before= (and after=), the step needs no reader.
        run.step("crm.update_contact", args=CHANGE, do=crm.update_contact, before=ORIGINAL, after=CHANGED)
    assert crm.writes == [CHANGE]


def test_an_explicit_before_wins_over_the_policy_read(tenant, tmp_path, options, api, crm):
    load(tenant, tmp_path)
    given = {"email": "as-the-agent-knew-it", "phone": "+49 1"}
    with Saga(**options) as saga:
        saga.reader("crm.get_contact")(crm.get_contact)
        with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            run.step("crm.update_contact", args=CHANGE, do=crm.update_contact, before=lambda: given)
    action = recorded(api, the_update(run.id).pk)
    assert action["before_snapshot"] == given
    assert action["after_snapshot"] == CHANGED  # still read: no after= was given
    assert crm.reads == ["c-1"]


def test_policy_changes_are_picked_up_by_revalidating_with_the_etag(tenant, tmp_path, options, api, crm):
    load(tenant, tmp_path, before=False)
    with Saga(**options, policy_refresh_s=0) as saga:
        saga.reader("crm.get_contact")(crm.get_contact)
        cache = saga.api.policy_cache
        with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            first = run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
            assert first == {"ok": True} and (cache.fetches, cache.not_modified) == (1, 0)
            stamp = cache.etag
            run.step("crm.update_contact", args={"id": "c-1", "phone": "+49 2"}, do=crm.update_contact)
            # Asked again, answered 304: nothing changed, nothing read.
            assert (cache.fetches, cache.not_modified) == (2, 1) and crm.reads == []

            load(tenant, tmp_path, before=True, name="crm2.json")
            run.step("crm.update_contact", args={"id": "c-1", "phone": "+49 3"}, do=crm.update_contact)
            assert (cache.fetches, cache.not_modified) == (3, 1) and cache.etag != stamp
    updates = list(Action.objects.filter(run_id=run.id, tool="crm.update_contact").order_by("seq"))
    assert [a.before_snapshot for a in updates[:2]] == [None, None]
    assert updates[2].before_snapshot == {"email": "ashu@new.example", "phone": "+49 2"}
    assert updates[2].after_snapshot == {"email": "ashu@new.example", "phone": "+49 3"}


def test_within_the_refresh_interval_the_policies_are_not_asked_for_again(tenant, tmp_path, options, crm):
    load(tenant, tmp_path)
    with Saga(**options, policy_refresh_s=3600) as saga:
        saga.reader("crm.get_contact")(crm.get_contact)
        with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            for phone in ("+49 2", "+49 3", "+49 4"):
                run.step("crm.update_contact", args={"id": "c-1", "phone": phone}, do=crm.update_contact)
    assert saga.api.policy_cache.fetches == 1
    assert Action.objects.filter(run_id=run.id, before_snapshot__isnull=False).count() == 3


def test_saga_tool_functions_take_their_images_with_no_code_for_them(tenant, tmp_path, options, api, crm):
    load(tenant, tmp_path)
    with Saga(**options) as saga:

        @saga.tool("crm.get_contact")
        def get_contact(id: str) -> dict[str, Any]:
            return crm.get_contact(id)

        @saga.tool("crm.update_contact")
        def update_contact(id: str, email: str) -> dict[str, Any]:
            return crm.update_contact({"id": id, "email": email})

        with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            update_contact("c-1", "ashu@new.example")
    action = recorded(api, the_update(run.id).pk)
    assert (action["before_snapshot"], action["after_snapshot"]) == (ORIGINAL, CHANGED)
    assert crm.writes == [CHANGE]


def test_the_async_client_awaits_an_async_reader(tenant, tmp_path, options, api, crm):
    load(tenant, tmp_path)

    async def agent() -> str:
        async with AsyncSaga(**options) as saga:

            @saga.reader("crm.get_contact")
            async def get_contact(id: str) -> str:
                await asyncio.sleep(0)
                return json.dumps(crm.get_contact(id))  # a JSON object as text, as MCP servers send

            async with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
                await run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
            return run.id

    action = recorded(api, the_update(asyncio.run(agent())).pk)
    assert (action["before_snapshot"], action["after_snapshot"]) == (ORIGINAL, CHANGED)


def test_a_planned_or_recorded_step_carries_its_before_image(tenant, tmp_path, options, crm):
    load(tenant, tmp_path)
    with Saga(**options) as saga:
        saga.reader("crm.get_contact")(crm.get_contact)
        with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            [planned] = run.plan([{"tool": "crm.update_contact", "args": CHANGE}])["actions"]
            recorded_ahead = run.record("crm.update_contact", args={"id": "c-1", "phone": "+49 9"})
            run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
    assert Action.objects.get(pk=planned["id"]).before_snapshot == ORIGINAL
    assert Action.objects.get(pk=recorded_ahead["id"]).before_snapshot == ORIGINAL
    # The planned action is the step: it ran once, with its after-image.
    assert Action.objects.get(pk=planned["id"]).after_snapshot == CHANGED
    assert crm.writes == [CHANGE]
    # Read for the plan, for the record, again before the planned step started (the plan's image
    # still held) and after the call: the step sent the plan's image, not a new one.
    assert crm.reads == ["c-1", "c-1", "c-1", "c-1"]


def test_the_langgraph_adapter_takes_the_images_with_no_agent_code_change(
    tenant, tmp_path, options, api, crm
):
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from saga_client.langgraph import saga_tools

    from tests.client.test_langgraph_adapter import scripted_agent

    load(tenant, tmp_path)

    @tool
    def get_contact(id: str) -> dict:
        """Read a contact."""
        return crm.get_contact(id)

    @tool
    def update_contact(id: str, email: str) -> str:
        """Change a contact's e-mail."""
        crm.update_contact({"id": id, "email": email})
        return "updated"

    graph = scripted_agent(
        saga_tools([get_contact, update_contact], namespace="crm"),
        {"name": "update_contact", "args": CHANGE},
    )
    with Saga(**options) as saga, saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
        state = graph.invoke(
            {"messages": [HumanMessage("Fix Ashu's e-mail")]}, {"configurable": {"thread_id": "crm-1"}}
        )
    assert next(m for m in state["messages"] if isinstance(m, ToolMessage)).content == "updated"
    action = recorded(api, the_update(run.id).pk)
    assert (action["before_snapshot"], action["after_snapshot"]) == (ORIGINAL, CHANGED)
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_the_openai_agents_adapter_takes_the_images_with_no_agent_code_change(
    tenant, tmp_path, options, api, crm
):
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call
    from saga_client.openai_agents import saga_function_tool

    load(tenant, tmp_path)

    @saga_function_tool(name="crm.get_contact")
    def get_contact(id: str) -> dict:
        """Read a contact."""
        return crm.get_contact(id)

    @saga_function_tool(name="crm.update_contact")
    def update_contact(id: str, email: str) -> str:
        """Change a contact's e-mail."""
        crm.update_contact({"id": id, "email": email})
        return "updated"

    model = ScriptedModel(
        [[function_call("update_contact", CHANGE, call_id="call_0")], [assistant_message("done")]]
    )
    agent = Agent(
        name="crm", instructions="Keep contacts right.", model=model, tools=[get_contact, update_contact]
    )

    async def main() -> str:
        async with AsyncSaga(**options) as saga, saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
            result = await Runner.run(agent, "Fix Ashu's e-mail", run_config=RunConfig(tracing_disabled=True))
            assert result.interruptions == [] and result.final_output == "done"
            return run.id

    run_id = asyncio.run(main())
    action = recorded(api, the_update(run_id).pk)
    assert (action["before_snapshot"], action["after_snapshot"]) == (ORIGINAL, CHANGED)
    assert crm.writes == [CHANGE]
    # When needs_approval recorded the call, again just before it started, and after it.
    assert crm.reads == ["c-1", "c-1", "c-1"]
    model.assert_complete()


def test_an_adapter_run_whose_read_failed_fails_and_nothing_is_changed(tenant, tmp_path, options, crm):
    pytest.importorskip("langgraph")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from saga_client.langgraph import saga_tools

    load(tenant, tmp_path)

    @tool
    def get_contact(id: str) -> dict:
        """Read a contact."""
        raise ConnectionError("the CRM is down")

    @tool
    def update_contact(id: str, email: str) -> str:
        """Change a contact's e-mail."""
        crm.update_contact({"id": id, "email": email})
        return "updated"

    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage("", tool_calls=[{"name": "update_contact", "args": CHANGE, "id": "call_0"}]),
                AIMessage("done"),
            ]
        )
    )
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node(
        "tools", ToolNode(saga_tools([get_contact, update_contact], namespace="crm"), handle_tool_errors=True)
    )
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    with Saga(**options) as saga, saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
        state = graph.compile().invoke({"messages": [HumanMessage("Fix Ashu's e-mail")]})
    message = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert (
        message.status == "error"
        and "crm.get_contact" in message.content
        and "the CRM is down" in message.content
    )
    assert crm.writes == [] and not Action.objects.filter(run_id=run.id).exists()
    failed = Run.objects.get(pk=run.id)
    assert failed.status == "failed" and "crm.update_contact was not called" in failed.error


def agent_whose_step_waits(client: str, options: dict[str, Any], crm: Crm) -> tuple[str, list[Any]]:
    """An agent whose update waits for approval (the sync or the async client): its run's id and
    the refusals its step raised."""
    refused: list[BeforeImageFailed] = []
    if client == "sync":
        with Saga(**options) as saga:
            saga.reader("crm.get_contact")(crm.get_contact)
            with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
                try:
                    run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
                except BeforeImageFailed as exc:
                    refused.append(exc)
        return run.id, refused

    async def agent() -> str:
        async with AsyncSaga(**options) as saga:
            saga.reader("crm.get_contact")(crm.get_contact)
            async with saga.run(agent="crm", request="Fix Ashu's e-mail") as run:
                try:
                    await run.step("crm.update_contact", args=CHANGE, do=crm.update_contact)
                except BeforeImageFailed as exc:
                    refused.append(exc)
            return run.id

    return asyncio.run(agent()), refused


@pytest.mark.parametrize("meanwhile", ["nothing", "changed", "unreadable"])
@pytest.mark.parametrize("client", ["sync", "async"])
def test_an_approved_step_reads_again_before_it_starts_and_refuses_a_value_that_changed(
    tenant, tmp_path, options, api, crm, live_server, approver_key, client, meanwhile
):
    """The before-image of a step that waits for approval is read when it is recorded; by the time
    a person approves, someone may have changed the value. Read again just before the start, a
    changed value refuses the step (as saga-mcp refuses the call): ``do`` is not called and the
    action stays approved, its approval unspent."""
    load(tenant, tmp_path, approval="manual")
    approver = httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {approver_key[1]}"}
    )

    def bob() -> None:
        pending = wait_for(
            lambda: approver.get("/approvals", params={"status": "pending"}).json()["items"],
            timeout=30,
            what="the step's approval to be requested",
        )
        if meanwhile == "changed":  # a person changes the contact while the step waits
            crm.contacts["c-1"]["phone"] = "+49 7"
        elif meanwhile == "unreadable":  # or it is gone: the read raises
            del crm.contacts["c-1"]
        approver.post(f"/approvals/{pending[0]['id']}/approve", json={"reason": "ok"}).raise_for_status()

    approving = threading.Thread(target=bob)
    approving.start()
    try:
        run_id, refused = agent_whose_step_waits(client, options, crm)
    finally:
        approving.join(timeout=60)
        approver.close()

    action = recorded(api, the_update(run_id).pk)
    assert action["before_snapshot"] == ORIGINAL
    # Read when recorded, and again with the approved args just before the start.
    assert crm.reads[:2] == ["c-1", "c-1"]
    if meanwhile == "nothing":
        assert refused == [] and crm.writes == [CHANGE]
        assert action["status"] == "succeeded" and action["after_snapshot"] == CHANGED
        assert crm.reads == ["c-1", "c-1", "c-1"]
        return
    [refusal] = refused
    if meanwhile == "changed":
        assert refusal.reason == "the value changed while the step waited for approval"
    else:
        assert "the read crm.get_contact made again before it gave no image" in str(refusal)
    assert refusal.read_tool == "crm.get_contact" and refusal.action_id == action["id"]
    assert "crm.update_contact was not started" in str(refusal)
    assert crm.writes == []  # do was never called
    assert action["status"] == "approved" and action["attempts"] == 0
    assert crm.reads == ["c-1", "c-1"]
