"""A LangGraph agent whose tools are Saga Admin steps; the gated charge waits for an approver.

    pip install './clients/python[langgraph]'
    SAGA_URL=http://127.0.0.1:8000 SAGA_API_KEY=sk_… python clients/python/examples/langgraph_agent.py

The chat model is scripted so the example runs without a model provider: put yours in its place
(``ChatOpenAI(...).bind_tools(tools)``, …). Approve the charge in the dashboard's inbox (the link
is printed) or over the API with an approver key.
"""

from __future__ import annotations

import os

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from saga_client import Saga
from saga_client.langgraph import resume_when_decided, saga_tool, saga_tools


def create_user(email: str, name: str) -> dict:
    """Create the new hire's account in the HR system."""
    return {"user_id": 7, "email": email}


def charge(customer: str, amount: int, currency: str = "EUR") -> str:
    """Charge a customer's card."""
    return f"charged {amount} {currency} to {customer}"


tools = [
    *saga_tools([create_user], namespace="hr"),  # recorded as hr.create_user
    saga_tool(charge, name="payments.charge", target=lambda customer: ("customer", customer)),
]
model = GenericFakeChatModel(
    messages=iter(
        [
            AIMessage(
                "",
                tool_calls=[
                    {"name": "create_user", "args": {"email": "ashu@company.com", "name": "Ashu"}, "id": "1"}
                ],
            ),
            AIMessage(
                "", tool_calls=[{"name": "charge", "args": {"customer": "c-9", "amount": 30}, "id": "2"}]
            ),
            AIMessage("Ashu is set up and the first month is charged."),
        ]
    )
)


def agent(state: MessagesState) -> dict:
    return {"messages": [model.invoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode(tools))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile(checkpointer=InMemorySaver())  # interrupt() needs a checkpointer

if __name__ == "__main__":
    saga = Saga(os.environ["SAGA_URL"], os.environ["SAGA_API_KEY"], poll_interval_s=0.5)
    config: RunnableConfig = {"configurable": {"thread_id": "onboard-ashu"}}
    request: MessagesState = {"messages": [HumanMessage("Onboard Ashu, charge c-9 30 EUR")]}
    with saga.run(agent="onboarding", request="Onboard Ashu and charge the first month") as run:
        state = graph.invoke(request, config)
        while state.get("__interrupt__"):
            for paused in state["__interrupt__"]:
                print(
                    f"waiting for approval of {paused.value['tool']} {paused.value['args']}: {paused.value['link']}"
                )
            state = graph.invoke(resume_when_decided(state), config)
        print(state["messages"][-1].content)
    print(f"run {run.id}")
