"""``@saga.tool``: a function whose every call is a step of the run active in the current context.

The run context managers (``with saga.run(...)``, ``async with async_saga.run(...)``) set the
active run in a ``contextvars.ContextVar``, so it follows the code that runs inside the block —
including asyncio tasks started there — and nothing else. ``AsyncSaga.tool`` returns an
``AsyncTool`` and ``Saga.tool`` a ``Tool``: the two decorators, written by hand side by side (the
clients themselves are generated one from the other, see ``saga_client._twins``).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Coroutine, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from saga_client._before import register_tool_reader
from saga_client.errors import NoActiveRun, SagaError

if TYPE_CHECKING:
    from typing_extensions import ParamSpec

    P = ParamSpec("P")

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")

# The active run of each client kind (a Run in one, an AsyncRun in the other): a sync tool cannot
# be a step of an async run (it could not await it) and the other way round.
sync_run: ContextVar[Any] = ContextVar("saga_client.run", default=None)
async_run: ContextVar[Any] = ContextVar("saga_client.async_run", default=None)


def require_run(var: ContextVar[Any], tool: str, *, client: str) -> Any:
    run = var.get()
    if run is None:
        opener = "async with saga.run(...)" if client == "AsyncSaga" else "with saga.run(...)"
        raise NoActiveRun(
            f"{tool} was called outside a run: a @{client}.tool function records each call as a step "
            f"of the run active in its context; call it inside `{opener}:` (or attach a run)."
        )
    return run


def _recordable(value: Any) -> Any:
    """The JSON the ledger records for an argument: tuples become lists, other values that JSON
    cannot hold their ``str`` (the function still receives the object itself)."""
    return json.loads(json.dumps(value, default=str))


def _by_name(func: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments ``func`` takes by name (all of them when it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return dict(arguments)
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return dict(arguments)
    return {k: v for k, v in arguments.items() if k in parameters}


class ToolSpec:
    """What ``@saga.tool`` knows about one function: how a call becomes a step's arguments, and
    how the (possibly approver-edited) args become a call again."""

    def __init__(
        self,
        func: Callable[..., Any],
        name: str,
        *,
        target: Any,
        compensate: Any,
        intent: Mapping[str, Any] | None,
        approval_timeout_s: float | None,
    ) -> None:
        self.func, self.name = func, name
        self.target, self.compensate, self.intent = target, compensate, intent
        self.approval_timeout_s = approval_timeout_s
        self.signature = inspect.signature(func)
        first = next(iter(self.signature.parameters), None)
        # A method's own object is how it is called, not what it is called with.
        self._skipped = {first} if first in ("self", "cls") else set()
        if not self._skipped:
            # The function reads ``name`` for a policy's ``before`` when no reader is registered.
            register_tool_reader(name, func)

    def step_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``run.step`` keyword arguments for one call. A call that does not fit the signature
        raises the usual ``TypeError`` here, before anything is recorded."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named = {k: v for k, v in bound.arguments.items() if k not in self._skipped}
        recorded = {k: _recordable(v) for k, v in named.items()}
        target = self.target(**_by_name(self.target, named)) if callable(self.target) else self.target
        compensate = (
            self.compensate(**_by_name(self.compensate, named))
            if callable(self.compensate)
            else self.compensate
        )

        def do(effective: dict[str, Any]) -> Any:
            if effective == recorded:
                return self.func(*bound.args, **bound.kwargs)
            return self._call_with(bound, effective)

        return {
            "do": do,
            "args": recorded,
            "target": target,
            "compensate": compensate,
            "intent": self.intent,
            "approval_timeout_s": self.approval_timeout_s,
        }

    def _call_with(self, bound: inspect.BoundArguments, effective: Mapping[str, Any]) -> Any:
        """Call the function with the args an approver edited (JSON values, by parameter name)."""
        parameters = self.signature.parameters
        arguments = dict(bound.arguments)
        var_keyword = next((p.name for p in parameters.values() if p.kind is p.VAR_KEYWORD), None)
        for key, value in effective.items():
            parameter = parameters.get(key)
            if parameter is not None and key not in self._skipped:
                arguments[key] = tuple(value) if parameter.kind is parameter.VAR_POSITIONAL else value
            elif var_keyword is not None and key != var_keyword:
                arguments[var_keyword] = {**arguments.get(var_keyword, {}), key: value}
            else:
                raise SagaError(
                    f"The approved args of {self.name} name {key!r}, which "
                    f"{getattr(self.func, '__qualname__', self.func)} does not take.",
                    code="args_edited",
                )
        edited = inspect.BoundArguments(self.signature, arguments)
        return self.func(*edited.args, **edited.kwargs)

    def wraps(self, wrapper: F) -> F:
        wrapped = functools.wraps(self.func)(wrapper)
        wrapped.__saga_tool__ = self.name  # type: ignore[attr-defined]
        return cast(F, wrapped)


class AsyncTool:
    """The decorator ``AsyncSaga.tool(...)`` returns. The decorated function (sync or async)
    becomes a coroutine function: each call, awaited, is a step of the async run active in this
    context."""

    def __init__(self, saga: object, name: str, **options: Any) -> None:
        self.saga, self.name, self.options = saga, name, options

    @overload
    def __call__(self, func: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
        spec = ToolSpec(func, self.name, **self.options)
        name = self.name

        async def call(*args: Any, **kwargs: Any) -> Any:
            run = require_run(async_run, name, client="AsyncSaga")
            return await run.step(name, **spec.step_arguments(args, kwargs))

        return spec.wraps(call)


class Tool:
    """The decorator ``Saga.tool(...)`` returns: each call of the decorated function is a step of
    the blocking run active in this context. An async function is refused (it could not be
    awaited): decorate it with ``AsyncSaga.tool``."""

    def __init__(self, saga: object, name: str, **options: Any) -> None:
        self.saga, self.name, self.options = saga, name, options

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(func):
            raise TypeError(
                f"{func.__qualname__} is an async function: decorate it with AsyncSaga.tool, "
                "whose steps are awaited."
            )
        spec = ToolSpec(func, self.name, **self.options)
        name = self.name

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            run = require_run(sync_run, name, client="Saga")
            result: R = run.step(name, **spec.step_arguments(args, kwargs))
            return result

        return spec.wraps(call)
