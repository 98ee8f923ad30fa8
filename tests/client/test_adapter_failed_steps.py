"""The adapters end a run as ``saga-mcp`` ends a session: a step that failed and was not retried
successfully with the same arguments fails the run (into the recovery queue) even though the
framework handed the error to the model and the block ended cleanly. Real LangGraph (``ToolNode(…,
handle_tool_errors=True)``) and the real OpenAI Agents SDK, scripted models, the real server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from saga_client import AsyncSaga  # noqa: E402
from saga_client.langgraph import saga_tools  # noqa: E402
from saga_client.openai_agents import saga_function_tool  # noqa: E402

from ledger.models import Action, Run  # noqa: E402
from recovery.models import RecoveryItem  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

ASHU = {"email": "ashu@company.com", "name": "Ashu Kumar"}
ZOE = {"email": "zoe@company.com", "name": "Zoe"}
CONFIG = {"configurable": {"thread_id": "failed-steps"}}


class Directory:
    """The HR directory the agent writes to: down for the first ``outages`` calls."""

    def __init__(self, outages: int) -> None:
        self.outages = outages
        self.created: list[str] = []

    def create_user(self, email: str, name: str) -> dict[str, Any]:
        if self.outages:
            self.outages -= 1
            raise RuntimeError("the HR directory is down")
        self.created.append(email)
        return {"user_id": len(self.created), "email": email}


def langgraph_agent(directory: Directory, *calls: dict[str, Any]):
    def create_user(email: str, name: str) -> dict:
        """Create the HR user."""
        return directory.create_user(email, name)

    tools = saga_tools([create_user], namespace="hr")
    replies = [
        AIMessage("", tool_calls=[{"name": "create_user", "args": args, "id": f"call_{n}"}])
        for n, args in enumerate(calls)
    ]
    model = GenericFakeChatModel(messages=iter([*replies, AIMessage("done")]))
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    # The framework turns the tool's exception into a message for the model and carries on.
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


def openai_agent(directory: Directory, *calls: dict[str, Any]) -> Agent:
    @saga_function_tool(name="hr.create_user")
    def create_user(email: str, name: str) -> dict:
        """Create the HR user."""
        return directory.create_user(email, name)

    steps = [[function_call("create_user", args, call_id=f"call_{n}")] for n, args in enumerate(calls)]
    return Agent(name="hr", model=ScriptedModel([*steps, [assistant_message("done")]]), tools=[create_user])


def assert_failed_into_the_queue(run_id: str) -> Action:
    run = Run.objects.get(pk=run_id)
    assert run.status == "failed"
    item = RecoveryItem.objects.get(run=run)
    failed = Action.objects.get(pk=item.failed_action_id)
    assert failed.status == "failed" and "the HR directory is down" in failed.error
    assert "not retried successfully" in run.error and "the HR directory is down" in run.error
    return failed


# --- LangGraph ---------------------------------------------------------------------------------


def test_langgraph_a_failed_step_the_model_moved_past_fails_the_run(saga):
    directory = Directory(outages=1)
    graph = langgraph_agent(directory, ASHU)
    with saga.run(agent="onboarding", request="Onboard Ashu") as run:
        state = graph.invoke({"messages": [HumanMessage("Onboard Ashu")]}, CONFIG)
    [message] = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert message.status == "error" and state["messages"][-1].content == "done"
    assert directory.created == []
    assert assert_failed_into_the_queue(run.id).args == ASHU


def test_langgraph_a_failed_step_retried_successfully_with_the_same_arguments_completes_the_run(saga):
    directory = Directory(outages=1)
    graph = langgraph_agent(directory, ASHU, ASHU)
    with saga.run(agent="onboarding", request="Onboard Ashu") as run:
        graph.invoke({"messages": [HumanMessage("Onboard Ashu")]}, CONFIG)
    assert directory.created == [ASHU["email"]]
    assert Run.objects.get(pk=run.id).status == "succeeded"
    assert not RecoveryItem.objects.filter(run_id=run.id).exists()


def test_langgraph_a_success_with_other_arguments_does_not_excuse_a_failed_step(saga):
    directory = Directory(outages=1)
    graph = langgraph_agent(directory, ASHU, ZOE)
    with saga.run(agent="onboarding", request="Onboard Ashu and Zoe") as run:
        graph.invoke({"messages": [HumanMessage("Onboard Ashu and Zoe")]}, CONFIG)
    assert directory.created == [ZOE["email"]]
    assert assert_failed_into_the_queue(run.id).args == ASHU


def test_langgraph_an_async_graph_with_the_async_client_fails_the_run_too(
    live_server, agent_key, onboarding_policies
):
    directory = Directory(outages=1)
    graph = langgraph_agent(directory, ASHU)

    async def scenario() -> str:
        async with AsyncSaga(live_server.url, agent_key[1], backoff_s=0.01) as client:
            async with client.run(agent="onboarding", request="Onboard Ashu") as run:
                await graph.ainvoke({"messages": [HumanMessage("Onboard Ashu")]}, CONFIG)
            return run.id

    assert_failed_into_the_queue(asyncio.run(scenario()))


# --- OpenAI Agents -----------------------------------------------------------------------------

NO_TRACING = RunConfig(tracing_disabled=True)


def test_openai_agents_a_failed_step_the_model_moved_past_fails_the_run(
    live_server, agent_key, onboarding_policies
):
    directory = Directory(outages=1)
    agent = openai_agent(directory, ASHU)

    async def scenario() -> tuple[str, Any]:
        async with AsyncSaga(live_server.url, agent_key[1], backoff_s=0.01) as client:
            async with client.run(agent="onboarding", request="Onboard Ashu") as run:
                result = await Runner.run(agent, "Onboard Ashu", run_config=NO_TRACING)
            return run.id, result

    run_id, result = asyncio.run(scenario())
    assert result.final_output == "done" and directory.created == []
    assert assert_failed_into_the_queue(run_id).args == ASHU


def test_openai_agents_a_failed_step_retried_successfully_completes_the_run(saga):
    """With the blocking client (``Runner.run_sync``)."""
    directory = Directory(outages=1)
    agent = openai_agent(directory, ASHU, ASHU)
    with saga.run(agent="onboarding", request="Onboard Ashu") as run:
        Runner.run_sync(agent, "Onboard Ashu", run_config=NO_TRACING)
    assert directory.created == [ASHU["email"]]
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_a_plain_run_whose_code_handled_a_failed_step_still_completes(saga):
    """The rule is the adapters': code that catches a step's exception itself decided about it."""
    directory = Directory(outages=1)
    with saga.run(agent="onboarding", request="Onboard Ashu") as run, pytest.raises(RuntimeError):
        run.step("hr.create_user", args=ASHU, do=lambda: directory.create_user(**ASHU))
    assert Run.objects.get(pk=run.id).status == "succeeded"
