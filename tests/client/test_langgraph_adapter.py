"""The LangGraph adapter against the real server and real LangGraph: a scripted chat model (no
network) drives a graph whose ToolNode runs Saga-wrapped tools. A gated tool pauses the graph with
``interrupt()``; Bob's approval bot decides over the API; ``Command(resume=…)`` continues it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Annotated, Any

import httpx
import pytest

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import InjectedState, ToolNode, tools_condition  # noqa: E402
from langgraph.types import Command  # noqa: E402
from saga_client import AsyncSaga  # noqa: E402
from saga_client.langgraph import ToolRejected, resume_when_decided, saga_tool, saga_tools  # noqa: E402

from ledger.models import Action, Run  # noqa: E402
from recovery.models import Approval  # noqa: E402
from tests.client.examples import run_example  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"


class Payments:
    """The payment provider the agent charges, in memory: it counts every real charge."""

    def __init__(self) -> None:
        self.charges: list[dict[str, Any]] = []

    def charge(self, customer: str, amount: int, currency: str = "EUR") -> str:
        self.charges.append({"customer": customer, "amount": amount, "currency": currency})
        return f"charged {amount} {currency} to {customer}"


def scripted_agent(tools: list, *calls: dict[str, Any]):
    """A real LangGraph agent loop (model → tools → model …) whose chat model is scripted: it asks
    for the given tool calls, one message each, then answers "done"."""
    replies = [AIMessage("", tool_calls=[{**call, "id": f"call_{n}"}]) for n, call in enumerate(calls)]
    model = GenericFakeChatModel(messages=iter([*replies, AIMessage("done")]))

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


@pytest.fixture
def approvals_api(live_server, approver_key):
    """Bob's approval bot: an approver-scope key talking to the API over HTTP."""
    with httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {approver_key[1]}"}
    ) as client:
        yield client


def charge_tool(payments: Payments, **options: Any):
    @tool("payments_charge")
    def charge(customer: str, amount: int, currency: str = "EUR") -> str:
        """Charge a customer."""
        return payments.charge(customer, amount, currency)

    return saga_tool(
        charge, name="payments.charge", target=lambda customer: ("customer", customer), **options
    )


CONFIG = {"configurable": {"thread_id": "onboarding-1"}}
CHARGE = {"name": "payments_charge", "args": {"customer": "c-9", "amount": 300}}


def test_a_gated_tool_pauses_the_graph_and_runs_once_after_bob_approves_over_the_api(saga, approvals_api):
    payments = Payments()
    graph = scripted_agent([charge_tool(payments)], CHARGE)
    with saga.run(agent="onboarding", request="Charge the first month") as run:
        state = graph.invoke({"messages": [HumanMessage("Charge c-9 for the first month")]}, CONFIG)
        [paused] = state["__interrupt__"]
        approval = Approval.objects.get(status="pending")
        assert paused.value == {
            "saga": "approval_pending",
            "approval_id": approval.pk,
            "action_id": approval.action_id,
            "run_id": run.id,
            "tool": "payments.charge",
            "args": {"customer": "c-9", "amount": 300, "currency": "EUR"},
            "risk": "critical",
            "link": f"{saga.api_url.removesuffix('/api/v1')}/approvals/",
        }
        assert payments.charges == []

        answer = approvals_api.post(f"/approvals/{approval.pk}/approve", json={"reason": "first month"})
        assert answer.status_code == 200, answer.text
        state = graph.invoke(Command(resume={"approval_id": approval.pk}), CONFIG)

    assert "__interrupt__" not in state
    tool_message = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert tool_message.content == "charged 300 EUR to c-9" and tool_message.status == "success"
    assert state["messages"][-1].content == "done"
    assert payments.charges == [{"customer": "c-9", "amount": 300, "currency": "EUR"}]
    action = Action.objects.get(run_id=run.id)
    assert (action.tool, action.status, action.attempts) == ("payments.charge", "succeeded", 1)
    assert (action.target_type, action.target_id) == ("customer", "c-9")
    assert action.result == "charged 300 EUR to c-9"
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_resuming_before_anyone_decided_pauses_the_graph_again(saga, approvals_api):
    """The host cannot approve by resuming: Saga's approver decides."""
    payments = Payments()
    graph = scripted_agent([charge_tool(payments)], CHARGE)
    with saga.run(agent="onboarding", request="Charge the first month"):
        graph.invoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
        state = graph.invoke(Command(resume={"approved": True}), CONFIG)
        assert [i.value["tool"] for i in state["__interrupt__"]] == ["payments.charge"]
        assert payments.charges == []

        approval = Approval.objects.get(status="pending")
        approvals_api.post(f"/approvals/{approval.pk}/approve", json={"reason": "ok"}).raise_for_status()
        state = graph.invoke(Command(resume=True), CONFIG)
    assert "__interrupt__" not in state
    assert len(payments.charges) == 1
    assert Action.objects.get(pk=approval.action_id).status == "succeeded"


def test_a_rejection_is_a_tool_error_the_model_reads_and_nothing_is_charged(saga, approvals_api):
    payments = Payments()
    graph = scripted_agent([charge_tool(payments)], CHARGE)
    with saga.run(agent="onboarding", request="Charge the first month") as run:
        graph.invoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
        approval = Approval.objects.get(status="pending")
        answer = approvals_api.post(
            f"/approvals/{approval.pk}/reject", json={"reason": "not before the trial"}
        )
        assert answer.status_code == 200, answer.text
        state = graph.invoke(Command(resume=True), CONFIG)

    tool_message = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert tool_message.status == "error"
    assert "rejected" in tool_message.content and "not before the trial" in tool_message.content
    assert state["messages"][-1].content == "done"  # the model read the refusal and went on
    assert payments.charges == []
    assert Action.objects.get(run_id=run.id).status == "rejected"


def test_a_rejection_can_be_raised_instead_as_a_typed_exception(saga, approvals_api):
    payments = Payments()
    graph = scripted_agent([charge_tool(payments, raise_on_reject=True)], CHARGE)
    with pytest.raises(ToolRejected) as raised, saga.run(agent="onboarding", request="Charge") as run:
        graph.invoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
        approval = Approval.objects.get(status="pending")
        approvals_api.post(f"/approvals/{approval.pk}/reject", json={"reason": "no"}).raise_for_status()
        graph.invoke(Command(resume=True), CONFIG)
    assert raised.value.action_id == approval.action_id and raised.value.reason == "no"
    assert payments.charges == []
    assert Run.objects.get(pk=run.id).status == "failed"


def test_a_tool_that_needs_no_approval_is_a_step_with_its_args_by_name(saga):
    users: list[str] = []

    def create_user(email: str, name: str) -> dict:
        """Create the HR user."""
        users.append(email)
        return {"user_id": 7}

    [create] = saga_tools([create_user], names={"create_user": "hr.create_user"})
    graph = scripted_agent([create], {"name": "create_user", "args": {"email": EMAIL, "name": "Ashu Kumar"}})
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        state = graph.invoke({"messages": [HumanMessage("Onboard Ashu")]}, CONFIG)
    assert "__interrupt__" not in state and users == [EMAIL]
    action = Action.objects.get(run_id=run.id)
    assert action.tool == "hr.create_user" and action.status == "succeeded"
    assert action.args == {"email": EMAIL, "name": "Ashu Kumar"}
    assert action.result == {"user_id": 7}


def test_a_paused_run_stays_open_and_another_process_resumes_it_by_attaching(saga, approvals_api):
    """The usual shape: the host ends its request while the approval waits; later (another
    request, another process: the graph's checkpointer and the run id are all it needs) it
    attaches to the run and resumes the graph."""
    payments = Payments()
    graph = scripted_agent([charge_tool(payments)], CHARGE)
    with saga.run(agent="onboarding", request="Charge the first month") as run:
        state = graph.invoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
    [paused] = state["__interrupt__"]
    assert Run.objects.get(pk=run.id).status == "running"  # left open, not completed

    approvals_api.post(
        f"/approvals/{paused.value['approval_id']}/approve", json={"reason": "ok"}
    ).raise_for_status()
    with saga.attach(paused.value["run_id"]):
        state = graph.invoke(Command(resume=True), CONFIG)
    assert state["messages"][-1].content == "done" and len(payments.charges) == 1
    assert Action.objects.get(run_id=run.id).status == "succeeded"
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_resume_when_decided_waits_for_the_approver_and_resumes_with_the_decision(saga, approvals_api):
    payments = Payments()
    graph = scripted_agent([charge_tool(payments)], CHARGE)

    def bob_approves_soon() -> None:
        time.sleep(0.3)
        approval = Approval.objects.get(status="pending")
        approvals_api.post(f"/approvals/{approval.pk}/approve", json={"reason": "ok"}).raise_for_status()

    with saga.run(agent="onboarding", request="Charge the first month"):
        state = graph.invoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
        bob = threading.Thread(target=bob_approves_soon)
        bob.start()
        command = resume_when_decided(state, timeout_s=10)
        bob.join()
        [(interrupt_id, decision)] = command.resume.items()
        assert interrupt_id == state["__interrupt__"][0].id
        assert decision == {
            "approval_id": state["__interrupt__"][0].value["approval_id"],
            "action_id": state["__interrupt__"][0].value["action_id"],
            "status": "approved",
        }
        state = graph.invoke(command, CONFIG)
    assert state["messages"][-1].content == "done" and len(payments.charges) == 1


def test_an_async_graph_with_the_async_client(live_server, agent_key, onboarding_policies, approvals_api):
    payments = Payments()
    graph = scripted_agent([charge_tool(payments)], CHARGE)

    async def main() -> str:
        async with (
            AsyncSaga(live_server.url, agent_key[1], poll_interval_s=0.05) as saga,
            saga.run(agent="onboarding", request="Charge the first month") as run,
        ):
            state = await graph.ainvoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
            [paused] = state["__interrupt__"]
            assert paused.value["tool"] == "payments.charge" and payments.charges == []
            answer = await asyncio.to_thread(
                approvals_api.post, f"/approvals/{paused.value['approval_id']}/approve", json={"reason": "ok"}
            )
            assert answer.status_code == 200, answer.text
            state = await graph.ainvoke(Command(resume=True), CONFIG)
            assert state["messages"][-1].content == "done"
            return run.id

    run_id = asyncio.run(main())
    assert len(payments.charges) == 1
    action = Action.objects.get(run_id=run_id)
    assert (action.status, action.attempts) == ("succeeded", 1)
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_the_client_imports_without_langgraph():
    code = "import sys, saga_client; assert not {'langgraph', 'langchain_core'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_example_runs_against_the_server(live_server, agent_key, onboarding_policies, approvals_api):
    out = run_example(
        "langgraph_agent.py", url=live_server.url, key=agent_key[1], approvals_api=approvals_api
    )
    assert "waiting for approval of payments.charge" in out
    assert "Ashu is set up and the first month is charged." in out
    run_id = out.strip().splitlines()[-1].removeprefix("run ")
    assert sorted(Action.objects.filter(run_id=run_id).values_list("tool", "status")) == [
        ("hr.create_user", "succeeded"),
        ("payments.charge", "succeeded"),
    ]


def test_injected_graph_state_reaches_the_tool_but_is_not_recorded(saga):
    @tool
    def create_user(email: str, state: Annotated[dict, InjectedState]) -> str:
        """Create the HR user."""
        return f"created {email} after {len(state['messages'])} messages"

    graph = scripted_agent(
        [saga_tool(create_user, name="hr.create_user")], {"name": "create_user", "args": {"email": EMAIL}}
    )
    with saga.run(agent="onboarding", request="Onboard Ashu") as run:
        state = graph.invoke({"messages": [HumanMessage("Onboard Ashu")]}, CONFIG)
    assert state["messages"][2].content == f"created {EMAIL} after 2 messages"
    action = Action.objects.get(run_id=run.id)
    assert action.args == {"email": EMAIL} and action.status == "succeeded"


def test_a_call_nobody_decided_before_its_deadline_is_the_frameworks_rejection_saying_so(saga):
    from saga_client import ApprovalDeadlinePassed

    from recovery.actions.periodic import approvals_expire

    payments = Payments()
    graph = scripted_agent([charge_tool(payments, raise_on_reject=True)], CHARGE)
    with pytest.raises(ToolRejected) as raised, saga.run(agent="onboarding", request="Charge"):
        graph.invoke({"messages": [HumanMessage("Charge c-9")]}, CONFIG)
        approval = Approval.objects.get(status="pending")
        assert approvals_expire(now=approval.expires_at) == 1  # the sweep, at the deadline
        graph.invoke(Command(resume=True), CONFIG)
    assert isinstance(raised.value.rejected, ApprovalDeadlinePassed)
    assert raised.value.reason == "timed_out"
    assert "nobody approved payments.charge before its approval deadline" in raised.value.message
    assert payments.charges == []
