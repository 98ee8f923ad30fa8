"""The client and its run, written once: ``AsyncSaga`` and ``AsyncRun`` in ``saga_client.aio`` (this
source), ``Saga`` and ``Run`` in ``saga_client.client``, generated from it by unasync
(``clients/python/scripts/generate_sync_client.py``). Pure Python + httpx: no Django.

    saga = Saga("https://saga.example.com", api_key)
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        user = run.step("hr.create_user", target=("user", email), args={"email": email},
                        do=lambda args: hr.create_user(**args),
                        compensate=("hr.delete_user", {"email": email}))

``AsyncSaga`` is the same with ``async with`` and ``await`` (``do`` may then be a coroutine
function). Every request is built and every answer read in ``saga_client._core`` and
``saga_client._run``; this module only performs the effects they ask for. The few things the two
clients do differently are written by hand in ``saga_client._twins``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextvars import Token
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx

from saga_client._core import (
    Api,
    Effect,
    Flow,
    Invoke,
    Reply,
    Send,
    Settings,
    Sleep,
    api_root,
    default_headers,
)
from saga_client._run import Compensation, PlanStep, Target
from saga_client._twins import (
    AsyncPerform,
    AsyncRunBase,
    accept_async_callables,
    async_attached,
    async_invoke,
)
from saga_client.responses import (
    ActionDict,
    ActionVerifyDict,
    CheckpointDict,
    CommandDict,
    PlanDict,
    PoliciesDict,
    RunDetailDict,
    RunDict,
    RunFailDict,
    TrailDict,
)
from saga_client.tools import AsyncTool, async_run

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


async def drive(flow: Flow[T], perform: AsyncPerform) -> T:
    """Run a flow to its end, performing each effect it yields and handing back the outcome (or
    throwing the effect's exception into the flow, which decides what it means)."""
    outcome: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = flow.throw(error) if error is not None else flow.send(outcome)
        except StopIteration as done:
            value: T = done.value
            return value
        outcome, error = None, None
        try:
            outcome = await perform(effect)
        except BaseException as exc:  # the flow decides; it re-raises what it does not handle
            error = exc
        finally:
            del effect


class AsyncSaga:
    """The Saga Admin agent API over HTTP, with retries (``AsyncSaga``: every method that talks to
    the server is a coroutine). ``run()`` is the high-level entry; the other methods are one
    endpoint each."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retries: int = 4,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        poll_interval_s: float = 2.0,
        max_poll_interval_s: float = 30.0,
        approval_timeout_s: float = 3600.0,
        policy_refresh_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``policy_refresh_s``: how long the client uses its copy of the tenant's policies (read
        for the steps whose policy takes before-images) before it asks the server whether they
        changed, a 304 when they did not."""
        self.api = Api(
            Settings(
                retries=retries,
                backoff_s=backoff_s,
                max_backoff_s=max_backoff_s,
                poll_interval_s=poll_interval_s,
                max_poll_interval_s=max_poll_interval_s,
                approval_timeout_s=approval_timeout_s,
                policy_refresh_s=policy_refresh_s,
            )
        )
        # The API root this client talks to (links to the dashboard are made from it).
        self.api_url = api_root(base_url)
        self._http = httpx.AsyncClient(
            base_url=api_root(base_url),
            timeout=timeout,
            transport=transport,
            headers=default_headers(api_key),
        )

    # Plumbing -------------------------------------------------------------------------------

    async def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Send):
            return await self._http.request(
                effect.method, effect.path, json=effect.json, params=effect.params, headers=effect.headers
            )
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        if isinstance(effect, Invoke):
            return await async_invoke(effect)
        raise AssertionError(f"unknown effect {effect!r}")

    async def _drive(self, flow: Flow[T]) -> T:
        return await drive(flow, self._perform)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSaga:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Any endpoint: the decoded JSON, or a typed ``SagaError`` (retries as everywhere)."""
        return await self._drive(
            self.api.call(method, path, json_body=json_body, params=params, idempotency_key=idempotency_key)
        )

    # High level -----------------------------------------------------------------------------

    def run(self, *, agent: str, request: str, **fields: Any) -> AsyncRun:
        """A context manager (``async with`` for ``AsyncSaga``) that creates the run on entry,
        completes it on a clean exit and fails it (landing it in the recovery queue) when the block
        raises; an ``AsyncRun`` awaited instead is only created. ``fields``: ``external_id``,
        ``user_id``, ``goal``, ``trace_url``, ``resume_url``, ``metadata``."""
        return AsyncRun(self, agent=agent, request=request, fields=fields)

    def attach(self, run_id: str) -> AsyncRun:
        """Continue an existing run (e.g. after a resume command or a decided approval): steps
        already done replay their recorded results instead of running again. ``Saga`` opens it at
        once; ``AsyncSaga`` when it is awaited or entered (``async with``)."""
        return async_attached(AsyncRun(self, agent="", request="", fields={}, run_id=run_id))

    def tool(
        self,
        name: str,
        *,
        target: Target | Callable[..., Target] | None = None,
        compensate: Compensation | Callable[..., Compensation | None] | None = None,
        intent: Mapping[str, Any] | None = None,
        approval_timeout_s: float | None = None,
    ) -> AsyncTool:
        """Make each call of the decorated function a step of the run active in this context, with
        its arguments (by parameter name) as the step's ``args``. ``target``/``compensate`` may be
        callables that receive those arguments by name. With ``AsyncSaga`` the function (sync or
        async) becomes a coroutine function; ``Saga`` refuses an async one."""
        return AsyncTool(
            self,
            name,
            target=target,
            compensate=compensate,
            intent=intent,
            approval_timeout_s=approval_timeout_s,
        )

    def reader(self, name: str) -> Callable[[F], F]:
        """Register the decorated function as this client's reader of the read tool ``name``:
        for a step whose policy has ``before`` naming ``name``, the client calls it with the
        read's args (by keyword) before the call and after it, and sends the value at the
        policy's path as the action's before- and after-image. It returns the read's result (a
        mapping, or a JSON object as text). Without one, a function wrapped as a tool of that
        name (``@saga.tool(name)``, an adapter's) is the reader. The function is unchanged."""

        def register(func: F) -> F:
            self.api.readers[name] = func
            return func

        return register

    # Runs -----------------------------------------------------------------------------------

    async def create_run(
        self, *, agent: str, request: str, idempotency_key: str | None = None, **fields: Any
    ) -> RunDict:
        return await self._drive(
            self.api.create_run(agent=agent, request=request, idempotency_key=idempotency_key, **fields)
        )

    async def get_run(self, run_id: str) -> RunDetailDict:
        """The run with its newest actions (at most 100; ``actions_next`` is set when it has more:
        ``list_actions`` reads them all)."""
        return await self._drive(self.api.get_run(run_id))

    async def list_actions(self, run_id: str, *, page_size: int = 500) -> AsyncIterator[ActionDict]:
        """Every action of the run, oldest first, following the cursor (``page_size`` ≤ 500)."""
        params: dict[str, Any] = {"limit": page_size}
        while True:
            page = await self._drive(self.api.actions_page(run_id, params))
            for item in page["items"]:
                yield item
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    async def list_runs(self, **filters: Any) -> AsyncIterator[RunDict]:
        """Every run matching the filters (``status``, ``agent``, ``external_id``), newest first."""
        params = {k: v for k, v in filters.items() if v is not None}
        while True:
            page = await self._drive(self.api.runs_page(params))
            for item in page["items"]:
                yield item
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    async def heartbeat(self, run_id: str, note: str = "") -> list[CommandDict]:
        return await self._drive(self.api.heartbeat(run_id, note))

    async def complete_run(
        self,
        run_id: str,
        summary: str = "",
        *,
        withdraw_approvals: bool = False,
        idempotency_key: str | None = None,
    ) -> RunDict:
        """``withdraw_approvals``: withdraw the approvals the run's actions still wait for (each
        action is rejected); without it such a run is refused (``Conflict``, code
        ``pending_approvals``, naming them)."""
        return await self._drive(
            self.api.complete_run(
                run_id, summary, withdraw_approvals=withdraw_approvals, idempotency_key=idempotency_key
            )
        )

    async def fail_run(
        self,
        run_id: str,
        error: str,
        *,
        failed_action_id: str | None = None,
        reason: str = "failed",
        withdraw_approvals: bool = False,
        idempotency_key: str | None = None,
    ) -> RunFailDict:
        """``withdraw_approvals``: as ``complete_run``."""
        return await self._drive(
            self.api.fail_run(
                run_id,
                error,
                failed_action_id=failed_action_id,
                reason=reason,
                withdraw_approvals=withdraw_approvals,
                idempotency_key=idempotency_key,
            )
        )

    async def commands(self, run_id: str) -> list[CommandDict]:
        return await self._drive(self.api.commands(run_id))

    async def ack_command(self, command_id: str) -> CommandDict:
        return await self._drive(self.api.ack_command(command_id))

    async def trail(self, run_id: str) -> TrailDict:
        return await self._drive(self.api.trail(run_id))

    async def policies(self) -> PoliciesDict:
        return await self._drive(self.api.policies())

    # Actions --------------------------------------------------------------------------------

    async def record_action(
        self, run_id: str, *, tool: str, idempotency_key: str, **fields: Any
    ) -> ActionDict:
        """Record an action; ``start=True`` also starts it when it needs no approval (it comes back
        ``running``; a replay comes back as the action is now)."""
        reply = await self._drive(
            self.api.record_action(run_id, tool=tool, idempotency_key=idempotency_key, **fields)
        )
        action: ActionDict = reply.data
        return action

    async def record_plan(self, run_id: str, actions: Sequence[Mapping[str, Any]]) -> PlanDict:
        """Record several actions of a run in one request, all or nothing (each a body of
        ``record_action``, its ``idempotency_key`` required): the recorded actions in order and the
        plan's pivot ``warnings``. Sent again, the same plan comes back as the actions are now."""
        reply = await self._drive(self.api.record_plan(run_id, [dict(action) for action in actions]))
        plan: PlanDict = reply.data
        return plan

    async def record_action_reply(
        self, run_id: str, *, tool: str, idempotency_key: str, **fields: Any
    ) -> Reply:
        """``record_action`` with how the server answered: ``reply.data`` is the action and
        ``reply.started_here`` is true only when this very request (``start=True``) moved it to
        ``running`` — never for a replay, which may be another caller's start."""
        return await self._drive(
            self.api.record_action(run_id, tool=tool, idempotency_key=idempotency_key, **fields)
        )

    async def start_action_reply(self, action: Mapping[str, Any]) -> Reply:
        """``start_action`` with how the server answered: ``reply.started_here`` is false when
        another caller started this attempt first (its answer replayed); do not run the call then."""
        return await self._drive(self.api.start(action))

    async def get_action(self, action_id: str) -> ActionDict:
        return await self._drive(self.api.get_action(action_id))

    async def start_action(self, action: Mapping[str, Any]) -> ActionDict:
        return await self._drive(self.api.start_action(action))

    async def succeed_action(
        self, action: Mapping[str, Any], *, result: Any = None, after_snapshot: Any = None
    ) -> ActionDict:
        return await self._drive(
            self.api.succeed_action(action, result=result, after_snapshot=after_snapshot)
        )

    async def fail_action(
        self,
        action: Mapping[str, Any],
        *,
        error: str,
        retryable: bool = False,
        layer: str = "tool",
        outcome_unknown: bool = False,
    ) -> ActionDict:
        return await self._drive(
            self.api.fail_action(
                action, error=error, retryable=retryable, layer=layer, outcome_unknown=outcome_unknown
            )
        )

    async def verify_action(
        self, action_id: str, *, ok: bool, expected: Any = None, actual: Any = None, reason: str = ""
    ) -> ActionVerifyDict:
        return await self._drive(
            self.api.verify_action(action_id, ok=ok, expected=expected, actual=actual, reason=reason)
        )

    async def reconcile_action(
        self, action_id: str, *, happened: bool, reason: str, result: Any = None, after_snapshot: Any = None
    ) -> ActionDict:
        return await self._drive(
            self.api.reconcile_action(
                action_id, happened=happened, reason=reason, result=result, after_snapshot=after_snapshot
            )
        )

    async def wait_for_approval(
        self, action: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> ActionDict:
        """Poll the action (with backoff) until a person decided. Returns it once approved; raises
        ``ApprovalRejected`` (rejected or expired) or ``ApprovalTimeout``."""
        return await self._drive(self.api.wait_for_approval(action, timeout_s=timeout_s))

    # Checkpoints ----------------------------------------------------------------------------

    async def write_checkpoint(
        self, run_id: str, *, name: str, idempotency_key: str | None = None, **fields: Any
    ) -> CheckpointDict:
        return await self._drive(
            self.api.write_checkpoint(run_id, name=name, idempotency_key=idempotency_key, **fields)
        )

    async def latest_checkpoint(self, run_id: str) -> CheckpointDict | None:
        return await self._drive(self.api.latest_checkpoint(run_id))


def current_async_run() -> AsyncRun | None:
    """The run of the innermost ``saga.run(...)`` block (``with``, or ``async with`` for the
    async one) this code runs in, if any."""
    run: AsyncRun | None = async_run.get()
    return run


class AsyncRun(AsyncRunBase):
    """One run. As a context manager: created on entry (unless attached), completed on a clean
    exit, failed — into the recovery queue — when the block raises; left running while a step
    waits for approval (``ApprovalPending``). Every method of an ``AsyncRun`` that talks to the
    server is a coroutine."""

    def __init__(
        self, saga: AsyncSaga, *, agent: str, request: str, fields: Mapping[str, Any], run_id: str = ""
    ) -> None:
        super().__init__(saga.api, agent=agent, request=request, fields=fields, run_id=run_id)
        self.client = saga
        self._tokens: list[Token[Any]] = []

    async def open(self) -> AsyncRun:
        """Create the run (or load an attached one) without the context manager."""
        await self.client._drive(self._open())
        return self

    async def __aenter__(self) -> AsyncRun:
        await self.open()
        self._tokens.append(async_run.set(self))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._tokens:
            async_run.reset(self._tokens.pop())
        await self.client._drive(self._exit(exc))
        return False  # re-raise

    async def complete(self, summary: str = "", *, withdraw_approvals: bool = False) -> RunDict:
        """Complete the run. A run with a step still waiting for approval is refused
        (``Conflict``, code ``pending_approvals``) unless ``withdraw_approvals``: then those
        approvals are withdrawn and the steps rejected. (The context manager's clean exit leaves
        such a run running instead: parked for the approval.)"""
        return await self.client._drive(self._complete(summary, withdraw_approvals=withdraw_approvals))

    async def fail(
        self,
        error: str,
        *,
        failed_action_id: str | None = None,
        reason: str = "failed",
        withdraw_approvals: bool = False,
    ) -> RunFailDict:
        """Fail the run (into the recovery queue). ``withdraw_approvals``: as ``complete``; the
        context manager's exit on an exception always withdraws them."""
        return await self.client._drive(
            self._fail(
                error, failed_action_id=failed_action_id, reason=reason, withdraw_approvals=withdraw_approvals
            )
        )

    async def record(
        self,
        tool: str,
        *,
        target: Target | None = None,
        args: Mapping[str, Any] | None = None,
        compensate: Compensation | None = None,
        intent: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> ActionDict:
        """Record a step without starting it (the key and body ``step`` would send), e.g. so that
        it is approved before it runs; returns the action (as it is now, when recorded already).
        ``step`` with the same tool, target and args later runs it — once approved."""
        return await self.client._drive(
            self._record(
                tool,
                target=target,
                args=args,
                compensate=compensate,
                intent=intent,
                idempotency_key=idempotency_key,
            )
        )

    async def plan(self, steps: Sequence[PlanStep | Mapping[str, Any]]) -> PlanDict:
        """Record the steps the agent means to take, in one request, before any of them runs: all
        or nothing (a pause, a denying rule or limit, a refused compensation of any step raises
        its error and records none). Each step is what ``step`` takes, without ``do`` (``tool``,
        ``target``, ``args``, ``compensate``, ``intent``, ``idempotency_key``, ``before``,
        ``start``), and gets the key ``step`` would give it: ``step`` with the same tool, target
        and args later runs the planned action (once approved). Every approval the plan needs is
        requested at once. Returns the recorded actions in order and the plan's ``warnings`` (an
        irreversible step before one that can be undone: ``pivot_order``, naming both). Sent
        again, the same plan comes back as its actions are now."""
        return await self.client._drive(self._plan(steps))

    async def step(
        self,
        tool: str,
        *,
        do: Callable[..., Any],
        target: Target | None = None,
        args: Mapping[str, Any] | None = None,
        compensate: Compensation | None = None,
        before: Any = None,
        after: Any = None,
        intent: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        approval_timeout_s: float | None = None,
        wait: bool = True,
    ) -> Any:
        """Record the action (and start it, when it needs no approval, in the same call), wait for
        approval when policy demands it, call ``do`` and record the outcome. Returns what ``do``
        returned (or, when this step already succeeded earlier, its recorded result — ``do`` is
        not called again).

        ``do`` receives the effective args (the approver may have edited them) when it takes a
        parameter. ``before``/``after`` are snapshots, or callables producing them (``after`` gets
        ``do``'s result). A timeout inside ``do`` records the outcome as unknown. ``do`` raising
        records the action failed and re-raises the same exception. With ``wait=False`` a step
        that needs approval raises ``ApprovalPending`` instead of waiting. In an ``AsyncRun``,
        ``do``, ``before`` and ``after`` may be async functions (awaited); a ``Run`` refuses them."""
        accept_async_callables(do=do, before=before, after=after)
        return await self.client._drive(
            self._step(
                tool,
                do=do,
                target=target,
                args=args,
                compensate=compensate,
                before=before,
                after=after,
                intent=intent,
                idempotency_key=idempotency_key,
                approval_timeout_s=approval_timeout_s,
                wait=wait,
            )
        )

    async def checkpoint(
        self,
        name: str,
        *,
        state: Mapping[str, Any] | None = None,
        summary: str = "",
        recovery_mode: str = "resume_or_compensate",
        recovery_instructions: str = "",
        completed_action_ids: list[str] | None = None,
        pending_action_ids: list[str] | None = None,
        requires_user_approval: bool = False,
        trace_links: list[Any] | None = None,
    ) -> CheckpointDict:
        """Write a safe pause point. By default the completed actions are this run's steps so far."""
        return await self.client._drive(
            self._checkpoint(
                name,
                state=state,
                summary=summary,
                recovery_mode=recovery_mode,
                recovery_instructions=recovery_instructions,
                completed_action_ids=completed_action_ids,
                pending_action_ids=pending_action_ids,
                requires_user_approval=requires_user_approval,
                trace_links=trace_links,
            )
        )

    async def heartbeat(self, note: str = "") -> list[CommandDict]:
        """Tell Saga Admin the agent is alive; returns pending resume/cancel commands."""
        return await self.client.heartbeat(self.id, note)

    async def commands(self) -> list[CommandDict]:
        return await self.client.commands(self.id)

    async def ack(self, command_id: str) -> CommandDict:
        return await self.client.ack_command(command_id)

    async def trail(self) -> TrailDict:
        return await self.client.trail(self.id)


__all__ = ["AsyncRun", "AsyncSaga", "current_async_run", "drive"]
