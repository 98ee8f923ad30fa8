"""LangGraph adapter (extra ``langgraph``): each call of a wrapped tool is a step of the Saga run
active in the context; a call waiting for approval pauses the graph with ``interrupt()``.

Saga Admin's approver decides, not the resume value: on ``Command(resume=…)`` the tool asks Saga
again, so an approved call runs (once, with the approver's args if edited), a rejected one is an
error ``ToolMessage`` for the model (``ToolRejected`` with ``raise_on_reject=True``), and one still
undecided pauses the graph again. The run stays open while a call waits; another process resumes
the graph inside ``with saga.attach(run_id):``. See clients/python/README.md, "LangGraph".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langchain_core.tools import tool as as_tool
from langchain_core.utils.pydantic import get_fields
from langgraph.types import Command, interrupt

from saga_client.aio import AsyncRun
from saga_client.client import Run
from saga_client.errors import ApprovalPending, ApprovalRejected
from saga_client.tools import _by_name, _recordable, async_run, require_run, sync_run

Target = tuple[str, str]
Compensation = tuple[str, Mapping[str, Any]]

__all__ = ["ToolRejected", "resume_when_decided", "saga_tool", "saga_tools"]


class ToolRejected(ToolException, ApprovalRejected):
    """A person rejected this call in Saga Admin; nothing ran. A ``ToolException``, so a wrapped
    tool returns it to the model as an error ``ToolMessage`` (unless ``raise_on_reject``)."""

    def __init__(self, tool: str, rejected: ApprovalRejected) -> None:
        ApprovalRejected.__init__(self, rejected.action_id, rejected.reason, action=rejected.action)
        self.message = f"Saga Admin: an approver rejected {tool}" + (
            f": {rejected.reason}" if rejected.reason else "."
        )
        self.args = (self.message,)


def saga_tool(
    tool: BaseTool | Callable[..., Any],
    *,
    name: str | None = None,
    target: Target | Callable[..., Target] | None = None,
    compensate: Compensation | Callable[..., Compensation | None] | None = None,
    raise_on_reject: bool = False,
) -> BaseTool:
    """The tool (a ``BaseTool``/``@tool``, or a plain function) as one the model calls the same
    way, each call a step recorded as ``name`` (default: the tool's name) with the call's
    arguments by name as ``args``; ``target``/``compensate`` may be callables receiving them."""
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)
    step_name = name or base.name
    schema = base.tool_call_schema  # what the model sends: injected arguments are not the step's
    model_args = set(schema.get("properties", {}) if isinstance(schema, dict) else get_fields(schema))

    def step(kwargs: dict[str, Any], invoke: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        named = {k: v for k, v in kwargs.items() if k in model_args}
        recorded = {k: _recordable(v) for k, v in named.items()}
        return {
            "args": recorded,
            "target": target(**_by_name(target, named)) if callable(target) else target,
            "compensate": compensate(**_by_name(compensate, named)) if callable(compensate) else compensate,
            # The approver's edit replaces what the model sent; injected arguments stay as they were.
            "do": lambda effective: invoke(kwargs if effective == recorded else {**kwargs, **effective}),
            "wait": False,
        }

    def call(**kwargs: Any) -> Any:
        run: Run = require_run(sync_run, step_name, client="Saga")
        while True:
            try:
                return run.step(step_name, **step(kwargs, base.invoke))
            except ApprovalPending as pending:
                interrupt(_payload(pending, run))  # returns the resume value on resume: ask again
            except ApprovalRejected as rejected:
                raise ToolRejected(step_name, rejected) from None

    async def acall(**kwargs: Any) -> Any:
        run: AsyncRun | None = async_run.get()
        if run is None:  # a blocking Saga's run, in an async graph
            return await asyncio.to_thread(call, **kwargs)
        while True:
            try:
                return await run.step(step_name, **step(kwargs, base.ainvoke))
            except ApprovalPending as pending:
                interrupt(_payload(pending, run))
            except ApprovalRejected as rejected:
                raise ToolRejected(step_name, rejected) from None

    def on_error(error: ToolException) -> str:
        if isinstance(error, ToolRejected) and not raise_on_reject:
            return error.message
        raise error

    return StructuredTool.from_function(
        func=call,
        coroutine=acall,
        name=base.name,
        description=base.description,
        args_schema=base.args_schema,
        return_direct=base.return_direct,
        handle_tool_error=on_error,
    )


def saga_tools(
    tools: Sequence[BaseTool | Callable[..., Any]],
    *,
    names: Mapping[str, str] | None = None,
    namespace: str = "",
) -> list[BaseTool]:
    """``saga_tool`` for each tool: recorded as ``names[tool name]``, else ``namespace.tool name``
    (or the bare name without a namespace)."""
    wrapped = []
    for tool in tools:
        base = tool if isinstance(tool, BaseTool) else as_tool(tool)
        default = f"{namespace}.{base.name}" if namespace else base.name
        wrapped.append(saga_tool(base, name=(names or {}).get(base.name, default)))
    return wrapped


def resume_when_decided(state: Mapping[str, Any], *, timeout_s: float | None = None) -> Command[Any]:
    """Wait (in the active blocking run) until Saga Admin's approver decided every approval the
    graph paused for, then the ``Command`` that resumes it; each interrupt's resume value is the
    decision ``{"approval_id", "action_id", "status"}`` (informational: the tool asks Saga again).
    ``ApprovalTimeout`` when nobody decided within ``timeout_s`` (default: the client's)."""
    run: Run = require_run(sync_run, "resume_when_decided", client="Saga")
    decisions = {}
    for paused in state.get("__interrupt__", ()):
        value = paused.value
        if not (isinstance(value, Mapping) and value.get("saga") == "approval_pending"):
            continue
        try:
            action = run.client.wait_for_approval(
                run.client.get_action(value["action_id"]), timeout_s=timeout_s
            )
            status = action["status"]
        except ApprovalRejected:
            status = "rejected"
        decisions[paused.id] = {"approval_id": value["approval_id"], "action_id": value["action_id"]}
        decisions[paused.id]["status"] = status
    return Command(resume=decisions)


def _payload(pending: ApprovalPending, run: Run | AsyncRun) -> dict[str, Any]:
    """What the graph's caller sees in ``state["__interrupt__"][i].value``."""
    return {
        "saga": "approval_pending",
        "approval_id": pending.approval_id,
        "action_id": pending.action_id,
        "run_id": run.id,
        "tool": pending.tool,
        "args": pending.step_args,
        "risk": pending.action.get("risk"),
        "link": run.client.api_url.removesuffix("/api/v1") + "/approvals/",  # the dashboard's inbox
    }
