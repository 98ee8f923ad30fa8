"""OpenAI Agents SDK adapter (extra ``openai-agents``): function tools whose every call is a step of
the Saga run active in the context, and whose approval is Saga Admin's.

Saga's decision counts; the SDK's tool-approval flow carries it. ``needs_approval`` records the call
in Saga (``run.record``, not started) and is True until Saga's approver approved it (or Saga needs
no approval), so the run returns with ``interruptions``; ``saga_decisions`` waits for Saga's
decisions and writes them into the run state (approve, or reject with the approver's reason). When
the SDK runs the call, the step asks Saga again: only a call Saga approved runs, once; an approval
given in the SDK alone is a tool error. See clients/python/README.md, "OpenAI Agents SDK".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any, overload

from agents import FunctionTool, RunContextWrapper, default_tool_error_function, function_tool
from agents.result import RunResult, RunResultStreaming
from agents.run_state import RunState

from saga_client.aio import AsyncRun
from saga_client.client import Run
from saga_client.errors import ApprovalPending, ApprovalRejected
from saga_client.tools import ToolSpec, async_run, require_run, sync_run

Target = tuple[str, str]
Compensation = tuple[str, Mapping[str, Any]]
_NOT_YET = frozenset({"awaiting_approval", "rejected"})

__all__ = ["saga_decisions", "saga_function_tool"]


@overload
def saga_function_tool(func: Callable[..., Any], /) -> FunctionTool: ...


@overload
def saga_function_tool(
    *,
    name: str | None = None,
    target: Target | Callable[..., Target] | None = None,
    compensate: Compensation | Callable[..., Compensation | None] | None = None,
    intent: Mapping[str, Any] | None = None,
    **options: Any,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def saga_function_tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    target: Target | Callable[..., Target] | None = None,
    compensate: Compensation | Callable[..., Compensation | None] | None = None,
    intent: Mapping[str, Any] | None = None,
    **options: Any,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """``@function_tool`` whose calls are steps recorded as ``name`` (default: the function's
    name) with the call's arguments by name as ``args``; ``target``/``compensate`` may be callables
    receiving them. ``options`` go to ``function_tool`` (``name_override``, ``timeout``, …)."""

    def build(func: Callable[..., Any]) -> FunctionTool:
        spec = ToolSpec(
            func,
            name or func.__name__,
            target=target,
            compensate=compensate,
            intent=intent,
            approval_timeout_s=None,
        )

        async def invoke(*args: Any, **kwargs: Any) -> Any:
            step = {**spec.step_arguments(args, kwargs), "wait": False}
            run = _active_run(spec.name)
            if isinstance(run, AsyncRun):
                return await run.step(spec.name, **step)
            return await asyncio.to_thread(run.step, spec.name, **step)

        async def needs_approval(
            _context: RunContextWrapper[Any], params: dict[str, Any], _call_id: str
        ) -> bool:
            return (await _record(spec, params))["status"] in _NOT_YET

        fallback = options.pop("failure_error_function", default_tool_error_function)

        def failure(context: RunContextWrapper[Any], error: Exception) -> Any:
            # The SDK hides a failure's details from the model by default; Saga's own are its to read.
            if isinstance(error, (ApprovalPending, ApprovalRejected)):
                return f"Saga Admin: {error}"
            return fallback(context, error) if fallback else None

        tool = function_tool(
            spec.wraps(invoke), needs_approval=needs_approval, failure_error_function=failure, **options
        )
        tool._saga_spec = spec  # type: ignore[attr-defined]  # the SDK's copies keep it
        return tool

    return build(func) if func is not None else build


async def saga_decisions(
    result: RunResult | RunResultStreaming, *, wait: bool = True, timeout_s: float | None = None
) -> RunState[Any]:
    """The run state to resume ``result`` with, its interruptions decided as Saga Admin's approver
    decided them (waiting for the decisions unless ``wait=False``: an undecided call then stays
    interrupted). ``ApprovalTimeout`` when nobody decided within ``timeout_s``."""
    state = result.to_state()
    for item in result.interruptions:
        tools = getattr(item.agent, "tools", ())
        spec = next(
            (t._saga_spec for t in tools if t.name == item.tool_name and hasattr(t, "_saga_spec")), None
        )
        if spec is None:
            continue  # not a Saga tool: the host decides it
        action = await _record(spec, json.loads(item.arguments or "{}"))
        try:
            if wait and action["status"] == "awaiting_approval":
                action = await _call(
                    _active_run(spec.name).client.wait_for_approval, action, timeout_s=timeout_s
                )
            if action["status"] == "rejected":
                raise ApprovalRejected(action["id"], (action.get("approval") or {}).get("reason", ""))
        except ApprovalRejected as rejected:
            reason = f": {rejected.reason}" if rejected.reason else "."
            state.reject(item, rejection_message=f"Saga Admin: an approver rejected {spec.name}{reason}")
            continue
        if action["status"] != "awaiting_approval":
            state.approve(item)
    return state


def _active_run(tool: str) -> Run | AsyncRun:
    run: AsyncRun | None = async_run.get()
    return run if run is not None else require_run(sync_run, tool, client="Saga")


async def _call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A client method of either kind, from async code (a blocking one in a thread)."""
    if asyncio.iscoroutinefunction(method):
        return await method(*args, **kwargs)
    return await asyncio.to_thread(method, *args, **kwargs)


async def _record(spec: ToolSpec, params: Mapping[str, Any]) -> dict[str, Any]:
    """Record the call as the step will (the same key and body) without starting it; an action
    recorded already comes back as it is now."""
    step = spec.step_arguments((), params)
    fields = {k: step[k] for k in ("args", "target", "compensate", "intent")}
    action: dict[str, Any] = await _call(_active_run(spec.name).record, spec.name, **fields)
    return action
