"""``saga_function_tool``: ``@function_tool`` whose every call is a step of the active Saga run and
whose ``needs_approval`` asks Saga Admin (recording the call first); and the helpers
``saga_decisions`` shares: the active run of either kind, a client call from async code, the
call recorded as its step will be."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, overload

from agents import FunctionTool, RunContextWrapper, default_tool_error_function, function_tool

from saga_client.aio import AsyncRun
from saga_client.client import Run
from saga_client.errors import ApprovalPending, ApprovalRejected
from saga_client.tools import ToolSpec, async_run, require_run, sync_run

Target = tuple[str, str]
Compensation = tuple[str, Mapping[str, Any]]
_NOT_YET = frozenset({"awaiting_approval", "rejected"})


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
            # The SDK hands a failed call to the model and carries on: the run's end rule decides.
            run.fail_unretried_steps = True
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
