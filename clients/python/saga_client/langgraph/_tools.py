"""``saga_tool``/``saga_tools``: a LangGraph tool whose every call is a step of the active Saga
run, pausing the graph with ``interrupt()`` while the call waits for approval; ``ToolRejected``,
the error a rejected call becomes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langchain_core.tools import tool as as_tool
from langchain_core.utils.pydantic import get_fields
from langgraph.types import interrupt

from saga_client._before import register_tool_reader
from saga_client.aio import AsyncRun
from saga_client.client import Run
from saga_client.errors import ApprovalPending, ApprovalRejected, rejection_words
from saga_client.tools import _by_name, _recordable, async_run, require_run, sync_run

Target = tuple[str, str]
Compensation = tuple[str, Mapping[str, Any]]


class ToolRejected(ToolException, ApprovalRejected):
    """A person rejected this call in Saga Admin, or nobody decided it before its approval deadline
    (``rejected`` is then an ``ApprovalDeadlinePassed``); nothing ran. A ``ToolException``, so a wrapped
    tool returns it to the model as an error ``ToolMessage`` (unless ``raise_on_reject``)."""

    def __init__(self, tool: str, rejected: ApprovalRejected) -> None:
        ApprovalRejected.__init__(self, rejected.action_id, rejected.reason, action=rejected.action)
        # What rejected it: a person, or the approval deadline (``ApprovalDeadlinePassed``).
        self.rejected = rejected
        self.message = rejection_words(tool, rejected)
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

    # The raw tool reads ``step_name`` for a policy's ``before`` (``saga_client._before``).
    register_tool_reader(step_name, _reader(base))
    call = _blocking_call(step_name, step, base.invoke)
    acall = _async_call(step_name, step, base.ainvoke, call)

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


def _reader(base: BaseTool) -> Callable[..., Any]:
    """The unwrapped tool as a reader: its input is the read's args; an async-only tool is
    awaited (by ``AsyncSaga``; the blocking client refuses it)."""
    if isinstance(base, StructuredTool) and base.func is None and base.coroutine is not None:
        return lambda **args: base.ainvoke(args)
    return lambda **args: base.invoke(args)


StepArguments = Callable[[dict[str, Any], Callable[[dict[str, Any]], Any]], dict[str, Any]]


def _blocking_call(
    step_name: str, step: StepArguments, invoke: Callable[[dict[str, Any]], Any]
) -> Callable[..., Any]:
    """The tool's function: each call a step of the blocking run active in the context."""

    def call(**kwargs: Any) -> Any:
        run: Run = require_run(sync_run, step_name, client="Saga")
        # ToolNode may hand a failed call to the model and carry on: the run's end rule decides.
        run.fail_unretried_steps = True
        while True:
            try:
                return run.step(step_name, **step(kwargs, invoke))
            except ApprovalPending as pending:
                interrupt(_payload(pending, run))  # returns the resume value on resume: ask again
            except ApprovalRejected as rejected:
                raise ToolRejected(step_name, rejected) from None

    return call


def _async_call(
    step_name: str, step: StepArguments, ainvoke: Callable[[dict[str, Any]], Any], call: Callable[..., Any]
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """The tool's coroutine: a step of the async run active in the context, or of the blocking
    one (``call``, in a thread) when there is none."""

    async def acall(**kwargs: Any) -> Any:
        run: AsyncRun | None = async_run.get()
        if run is None:  # a blocking Saga's run, in an async graph
            return await asyncio.to_thread(call, **kwargs)
        run.fail_unretried_steps = True
        while True:
            try:
                return await run.step(step_name, **step(kwargs, ainvoke))
            except ApprovalPending as pending:
                interrupt(_payload(pending, run))
            except ApprovalRejected as rejected:
                raise ToolRejected(step_name, rejected) from None

    return acall


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
