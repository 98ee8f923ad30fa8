"""What the blocking client and the asyncio one do differently, written by hand side by side.

``saga_client/aio.py`` is the source of both clients: ``saga_client/client.py`` is generated from it
by unasync (``clients/python/scripts/generate_sync_client.py``). Where the two must differ, aio.py
uses the async name below and the generator renames it to the blocking twin beside it (as
httpcore's ``_synchronization.py``):

- ``async_invoke`` / ``invoke``: calling the agent's function. The asyncio client awaits what it
  returns when awaitable; the blocking one cannot, so it refuses an awaitable (it could only drop
  it, and the step would be recorded as done while it never ran).
- ``accept_async_callables`` / ``refuse_async_callables``: the same refusal before a step records
  anything (an ``async def`` ``do``, ``before`` or ``after``).
- ``async_attached`` / ``attached``: ``AsyncSaga.attach`` hands the run back to be awaited or
  entered; ``Saga.attach`` opens it at once.
- ``AsyncRunBase`` / ``RunBase``: an ``AsyncRun`` can be awaited (``run = await saga.run(...)``).
- ``AsyncPerform`` / ``Perform``: what performs a flow's effects.

The ``@saga.tool`` decorators (``AsyncTool`` / ``Tool``) are in ``saga_client.tools``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from saga_client._core import Effect, Invoke
from saga_client._run import RunCore

AsyncPerform = Callable[[Effect], Awaitable[Any]]
Perform = Callable[[Effect], Any]


class _Opens(Protocol):
    def open(self) -> Any: ...


R = TypeVar("R", bound=_Opens)
AR = TypeVar("AR", bound="AsyncRunBase")


# --- Calling the agent's function -----------------------------------------------------------


async def async_invoke(effect: Invoke) -> Any:
    result = effect.func(*effect.args)
    # An async `do` (or one returning an awaitable) is awaited: never recorded as done
    # while its coroutine has not run.
    return await result if inspect.isawaitable(result) else result


def invoke(effect: Invoke) -> Any:
    result = effect.func(*effect.args)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited, on purpose: no "never awaited" warning
        raise TypeError(
            f"{getattr(effect.func, '__qualname__', effect.func)!r} returned an awaitable; the "
            "blocking Saga client cannot await it. Use AsyncSaga."
        )
    return result


def accept_async_callables(**callables: Any) -> None:
    """An ``AsyncRun`` awaits an async ``do``, ``before`` or ``after``: nothing to refuse."""


def refuse_async_callables(**callables: Any) -> None:
    """The blocking client cannot await: an ``async def`` would be called, its coroutine dropped
    and the step recorded as done. Refuse before anything is recorded."""
    for name, func in callables.items():
        if callable(func) and _is_async_callable(func):
            raise TypeError(
                f"`{name}` is an async function ({getattr(func, '__qualname__', func)!r}); the blocking "
                "Saga client cannot await it. Use AsyncSaga, or pass a regular function."
            )


def _is_async_callable(func: Any) -> bool:
    while hasattr(func, "func") and not inspect.isfunction(func):  # functools.partial
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004


# --- Attaching to a run ---------------------------------------------------------------------


def async_attached(run: R) -> R:
    """``AsyncSaga.attach``: the run as it is; ``await`` or ``async with`` opens it."""
    return run


def attached(run: R) -> R:
    """``Saga.attach``: the run, opened at once."""
    run.open()
    return run


# --- The runs' bases ------------------------------------------------------------------------


class AsyncRunBase(RunCore):
    """What only an ``AsyncRun`` does: ``await saga.run(...)`` (or ``await saga.attach(...)``)
    opens it without the context manager."""

    if TYPE_CHECKING:

        async def open(self) -> Any: ...

    def __await__(self: AR) -> Generator[Any, None, AR]:
        return self.open().__await__()


class RunBase(RunCore):
    """A blocking ``Run`` is ``RunCore`` as it is: it is not awaitable."""


__all__ = [
    "AsyncPerform",
    "AsyncRunBase",
    "Perform",
    "RunBase",
    "accept_async_callables",
    "async_attached",
    "async_invoke",
    "attached",
    "invoke",
    "refuse_async_callables",
]
