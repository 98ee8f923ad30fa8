"""The one place that builds Saga Admin requests and reads their answers, with no I/O of its own.

Every operation is a generator (a *flow*) that yields effects — send this HTTP request, sleep this
long, call the agent's function — and is sent back their outcomes (or has their exception thrown
in). ``Saga`` drives flows with blocking calls, ``AsyncSaga`` with ``await``; neither holds a rule
of the API, so the two cannot drift apart (the shape of httpx's ``Client``/``AsyncClient``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

import httpx

from saga_client.errors import (
    ApprovalPending,
    ApprovalRejected,
    ApprovalTimeout,
    Conflict,
    NotFound,
    SagaError,
    SagaUnavailable,
    StepInDoubt,
    error_from_response,
)

log = logging.getLogger("saga_client")

T = TypeVar("T")

_RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
# Action states in which the call already ran to completion: a replayed step returns its result.
DONE_STATES = frozenset({"succeeded", "compensating", "compensated", "compensation_failed"})
# What the API keeps of a free-text error.
_MAX_ERROR = 20000
# The header with which the server marks an answer replayed from an earlier request's record.
REPLAYED_HEADER = "Idempotent-Replayed"


# --- Effects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send one HTTP request (relative to the API root); the outcome is the ``httpx.Response``."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Invoke:
    """Call the agent's own function; the async driver awaits what it returns when awaitable, the
    blocking driver refuses an awaitable (it could only drop it)."""

    func: Callable[..., Any]
    args: tuple[Any, ...] = ()


Effect = Union[Send, Sleep, Invoke]
Flow = Generator[Effect, Any, T]


@dataclass(frozen=True)
class Reply:
    status: int
    data: Any
    # The request was sent again after a transport error: its first send may have reached the server.
    resent: bool = False
    # The server answered from its idempotency record (``Idempotent-Replayed: true``): this
    # request changed nothing, an earlier one with the same key did.
    replayed: bool = False

    @property
    def started_here(self) -> bool:
        """Whether this very request moved its action to ``running``: a fresh (not replayed)
        answer that shows it running. A replay never starts anything, and the server cannot tell
        a resend of ours from another caller's request with the same key, so a replay is never
        taken as ours, even when our first send may have been the one that started it: running
        a call twice is worse than leaving one in doubt."""
        return not self.replayed and isinstance(self.data, dict) and self.data.get("status") == "running"


@dataclass(frozen=True)
class Settings:
    retries: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    poll_interval_s: float = 2.0
    max_poll_interval_s: float = 30.0
    approval_timeout_s: float = 3600.0


def api_root(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base if base.endswith("/api/v1") else base + "/api/v1"


def default_headers(api_key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key}",
        "Accept": "application/json",
        "User-Agent": "saga-admin-python-client/1",
    }


# --- The REST API, one flow per endpoint --------------------------------------------------------


class Api:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def backoff(self, attempt: int, retry_after: str | None = None) -> float:
        s = self.settings
        if retry_after and retry_after.isdigit():
            return min(float(retry_after), s.max_backoff_s * 4)
        delay = min(s.backoff_s * 2 ** (attempt - 1), s.max_backoff_s)
        return float(delay) * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not security

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        retry_safe: bool = False,
    ) -> Flow[Reply]:
        """One API call with retries; the reply, or a typed ``SagaError``.

        Retried: connection errors and timeouts, 5xx, 409 ``idempotency_key_in_flight`` and 429
        (after Retry-After) — for reads, for writes that carry an idempotency key (the same key on
        every attempt, so a retry can never do a thing twice) and for writes that are harmless to
        repeat (``retry_safe``)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        safe = (
            retry_safe
            or method == "GET"
            or idempotency_key is not None
            or (isinstance(json_body, dict) and "idempotency_key" in json_body)
        )
        attempt, resent = 0, False
        while True:
            attempt += 1
            try:
                response: httpx.Response = yield Send(method, path, json_body, params, headers)
            except httpx.TransportError as exc:
                if not safe or attempt > self.settings.retries:
                    raise SagaUnavailable(
                        f"Saga Admin did not answer {method} {path} "
                        f"({type(exc).__name__}: {exc}) after {attempt} attempt(s).",
                        attempts=attempt,
                    ) from exc
                resent = True
                yield Sleep(self.backoff(attempt))
                continue
            if response.status_code < 400:
                replayed = response.headers.get(REPLAYED_HEADER, "").lower() == "true"
                return Reply(response.status_code, _decoded(response), resent=resent, replayed=replayed)
            error = error_from_response(response)
            retry = (
                response.status_code in _RETRYABLE_STATUS
                or response.status_code == 429
                or (response.status_code == 409 and error.code == "idempotency_key_in_flight")
            )
            if not retry or not safe or attempt > self.settings.retries:
                raise error
            yield Sleep(self.backoff(attempt, retry_after=response.headers.get("Retry-After")))

    def call(self, method: str, path: str, **kwargs: Any) -> Flow[Any]:
        reply = yield from self.request(method, path, **kwargs)
        return reply.data

    # Runs -----------------------------------------------------------------------------------

    def create_run(
        self, *, agent: str, request: str, idempotency_key: str | None = None, **fields: Any
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            "/runs",
            json_body={"agent": agent, "request": request, **fields},
            idempotency_key=idempotency_key or f"run-{uuid.uuid4()}",
        )

    def get_run(self, run_id: str) -> Flow[dict[str, Any]]:
        return self.call("GET", f"/runs/{run_id}")

    def actions_page(self, run_id: str, params: Mapping[str, Any]) -> Flow[dict[str, Any]]:
        return self.call("GET", f"/runs/{run_id}/actions", params=params)

    def runs_page(self, params: Mapping[str, Any]) -> Flow[dict[str, Any]]:
        return self.call("GET", "/runs", params=params)

    def heartbeat(self, run_id: str, note: str = "") -> Flow[list[dict[str, Any]]]:
        # A heartbeat only says "alive" (and reads commands): repeating it is harmless.
        data = yield from self.call(
            "POST", f"/runs/{run_id}/heartbeat", json_body={"note": note}, retry_safe=True
        )
        return list(data["commands"])

    def complete_run(
        self, run_id: str, summary: str = "", *, idempotency_key: str | None = None
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            f"/runs/{run_id}/complete",
            json_body={"summary": summary},
            idempotency_key=idempotency_key or f"complete-{run_id}",
        )

    def fail_run(
        self,
        run_id: str,
        error: str,
        *,
        failed_action_id: str | None = None,
        reason: str = "failed",
        idempotency_key: str | None = None,
    ) -> Flow[dict[str, Any]]:
        body: dict[str, Any] = {"error": error[:_MAX_ERROR] or "failed", "reason": reason}
        if failed_action_id:
            body["failed_action_id"] = failed_action_id
        return self.call(
            "POST",
            f"/runs/{run_id}/fail",
            json_body=body,
            idempotency_key=idempotency_key or f"fail-{run_id}-{uuid.uuid4()}",
        )

    def commands(self, run_id: str) -> Flow[list[dict[str, Any]]]:
        data = yield from self.call("GET", f"/runs/{run_id}/commands")
        return list(data["commands"])

    def ack_command(self, command_id: str) -> Flow[dict[str, Any]]:
        return self.call("POST", f"/commands/{command_id}/ack", idempotency_key=f"ack-{command_id}")

    def trail(self, run_id: str) -> Flow[dict[str, Any]]:
        return self.call("GET", f"/runs/{run_id}/trail")

    def policies(self) -> Flow[dict[str, Any]]:
        return self.call("GET", "/policies")

    # Actions --------------------------------------------------------------------------------

    def record_action(self, run_id: str, *, tool: str, idempotency_key: str, **fields: Any) -> Flow[Reply]:
        return self.request(
            "POST",
            f"/runs/{run_id}/actions",
            json_body={"tool": tool, "idempotency_key": idempotency_key, **fields},
        )

    def get_action(self, action_id: str) -> Flow[dict[str, Any]]:
        return self.call("GET", f"/actions/{action_id}")

    def start_action(self, action: Mapping[str, Any]) -> Flow[dict[str, Any]]:
        reply = yield from self.start(action)
        started: dict[str, Any] = reply.data
        return started

    def start(self, action: Mapping[str, Any]) -> Flow[Reply]:
        """Start an action; ``Reply.started_here`` says whether this request did it.

        One key per attempt, shared by every caller of the same action: two callers that both
        saw it approved send the same key, so the second gets the first's answer replayed (and
        knows it is not the one to run the call) instead of a second attempt."""
        key = f"{action['idempotency_key']}:start:{action['attempts'] + 1}"
        return self.request("POST", f"/actions/{action['id']}/start", idempotency_key=key)

    def succeed_action(
        self, action: Mapping[str, Any], *, result: Any = None, after_snapshot: Any = None
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            f"/actions/{action['id']}/succeed",
            json_body={"result": result, "after_snapshot": after_snapshot},
            idempotency_key=f"{action['idempotency_key']}:succeed:{action['attempts']}",
        )

    def fail_action(
        self,
        action: Mapping[str, Any],
        *,
        error: str,
        retryable: bool = False,
        layer: str = "tool",
        outcome_unknown: bool = False,
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            f"/actions/{action['id']}/fail",
            idempotency_key=f"{action['idempotency_key']}:fail:{action['attempts']}",
            json_body={
                "error": error[:_MAX_ERROR] or "failed",
                "retryable": retryable,
                "layer": layer,
                "outcome_unknown": outcome_unknown,
            },
        )

    def verify_action(
        self, action_id: str, *, ok: bool, expected: Any = None, actual: Any = None, reason: str = ""
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            f"/actions/{action_id}/verify",
            idempotency_key=f"verify-{uuid.uuid4()}",
            json_body={"ok": ok, "expected": expected, "actual": actual, "reason": reason},
        )

    def reconcile_action(
        self, action_id: str, *, happened: bool, reason: str, result: Any = None, after_snapshot: Any = None
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            f"/actions/{action_id}/reconcile",
            idempotency_key=f"reconcile-{uuid.uuid4()}",
            json_body={
                "happened": happened,
                "reason": reason,
                "result": result,
                "after_snapshot": after_snapshot,
            },
        )

    def wait_for_approval(
        self, action: Mapping[str, Any], *, timeout_s: float | None = None
    ) -> Flow[dict[str, Any]]:
        """Poll the action until a person decided, backing off from ``poll_interval_s`` to
        ``max_poll_interval_s``. The action once approved; ``ApprovalRejected`` (rejected or
        expired) or ``ApprovalTimeout``."""
        s = self.settings
        timeout = s.approval_timeout_s if timeout_s is None else timeout_s
        started, interval = time.monotonic(), s.poll_interval_s
        current = dict(action)
        while current["status"] == "awaiting_approval":
            waited = time.monotonic() - started
            if waited >= timeout:
                raise ApprovalTimeout(current["id"], waited)
            yield Sleep(max(min(interval, timeout - waited), 0.0))
            interval = min(interval * 1.5, max(s.max_poll_interval_s, s.poll_interval_s))
            current = yield from self.get_action(current["id"])
        if current["status"] == "rejected":
            raise rejection(current)
        return current

    # Checkpoints ----------------------------------------------------------------------------

    def write_checkpoint(
        self, run_id: str, *, name: str, idempotency_key: str | None = None, **fields: Any
    ) -> Flow[dict[str, Any]]:
        return self.call(
            "POST",
            f"/runs/{run_id}/checkpoints",
            json_body={"name": name, **fields},
            idempotency_key=idempotency_key or f"checkpoint-{uuid.uuid4()}",
        )

    def latest_checkpoint(self, run_id: str) -> Flow[dict[str, Any] | None]:
        try:
            checkpoint: dict[str, Any] = yield from self.call("GET", f"/runs/{run_id}/checkpoints/latest")
        except NotFound:
            return None
        return checkpoint


def rejection(action: Mapping[str, Any]) -> ApprovalRejected:
    approval = action.get("approval") or {}
    return ApprovalRejected(action["id"], approval.get("reason") or action.get("error", ""), action=action)


def _decoded(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        raise SagaError(
            f"Saga Admin answered {response.status_code} with a body that is not JSON "
            f"({response.headers.get('Content-Type', 'no content type')}).",
            code="invalid_response",
        ) from None


# --- A run and its steps ------------------------------------------------------------------------

Target = tuple[str, str]
Compensation = tuple[str, Mapping[str, Any]]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def jsonable(value: Any) -> Any:
    """What can be stored as a step's result: the value itself when it is JSON, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)[:10000]}
    return value


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, (TimeoutError, httpx.TimeoutException))


def accepts_argument(func: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume they take the args
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


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


class RunCore:
    """A run's state and the flows of its lifecycle and steps, shared by ``Run`` and ``AsyncRun``."""

    def __init__(
        self, api: Api, *, agent: str, request: str, fields: Mapping[str, Any], run_id: str = ""
    ) -> None:
        self._api = api
        self._create = {"agent": agent, "request": request, **fields}
        self.id = run_id
        self.run: dict[str, Any] = {}
        self.actions: list[dict[str, Any]] = []
        # Steps that raised ApprovalPending and have not been decided since (action id → action).
        self.pending_approvals: dict[str, dict[str, Any]] = {}
        self._finished = False
        self._failed_action_id: str | None = None
        # What the run's failure report calls it: a timed-out step must be reconciled first.
        self._failure_reason = "failed"

    # Lifecycle --------------------------------------------------------------------------------

    def _open(self) -> Flow[dict[str, Any]]:
        if self.id:
            if not self.run:
                self.run = yield from self._api.get_run(self.id)
        else:
            self.run = yield from self._api.create_run(**self._create)
            self.id = self.run["id"]
        return self.run

    def _exit(self, exc: BaseException | None) -> Flow[None]:
        if self._finished:
            return
        if isinstance(exc, ApprovalPending) or (exc is None and self.pending_approvals):
            # Parked, not finished: a step waits for a person. The run stays running; the agent
            # (or an adapter) carries on later with ``attach(run_id)``.
            log.info(
                "saga: run %s left running, waiting for approval of %s", self.id, list(self.pending_approvals)
            )
            return
        if exc is None:
            yield from self._complete()
            return
        try:
            yield from self._fail(
                f"{type(exc).__name__}: {exc}",
                failed_action_id=self._failed_action_id,
                reason=self._failure_reason,
            )
        except SagaError:
            # The original exception matters more than a failed report (the run may already be
            # cancelled); the heartbeat sweeper will still find a silent run.
            log.exception("saga: could not report the failure of run %s", self.id)

    def _complete(self, summary: str = "") -> Flow[dict[str, Any]]:
        self.run = yield from self._api.complete_run(self.id, summary)
        self._finished = True
        return self.run

    def _fail(
        self, error: str, *, failed_action_id: str | None = None, reason: str = "failed"
    ) -> Flow[dict[str, Any]]:
        self._finished = True
        self.run = yield from self._api.fail_run(
            self.id, error, failed_action_id=failed_action_id, reason=reason
        )
        return self.run

    # Steps ----------------------------------------------------------------------------------

    def step_key(self, tool: str, target: Target | None, args: Any) -> str:
        """Deterministic: the same call in the same run always gets the same key, so a retried
        step (in this process or after a restart) replays instead of acting twice."""
        digest = hashlib.sha256(canonical([self.id, tool, list(target) if target else None, args]).encode())
        return f"{self.id}:{digest.hexdigest()[:40]}"

    def _action_request(
        self,
        tool: str,
        target: Target | None,
        args: dict[str, Any],
        compensate: Compensation | None,
        intent: Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> tuple[str, dict[str, Any]]:
        """The idempotency key and body that record a step: one place, so that a step recorded
        ahead (``record``) and the same step run later are one action."""
        key = idempotency_key or self.step_key(tool, target, args)
        body: dict[str, Any] = {"args": args}
        if target is not None:
            body["target_type"], body["target_id"] = str(target[0]), str(target[1])
        if compensate is not None:
            body["compensation"] = {"tool": compensate[0], "args": dict(compensate[1])}
        if intent is not None:
            body["intent"] = dict(intent)
        return key, body

    def _record(
        self,
        tool: str,
        *,
        target: Target | None,
        args: Mapping[str, Any] | None,
        compensate: Compensation | None,
        intent: Mapping[str, Any] | None,
        idempotency_key: str | None,
    ) -> Flow[dict[str, Any]]:
        if not self.id:
            raise SagaError(
                "The run is not open yet: use it as a context manager (or open it) first.",
                code="run_not_open",
            )
        key, body = self._action_request(tool, target, dict(args or {}), compensate, intent, idempotency_key)
        reply = yield from self._api.record_action(self.id, tool=tool, idempotency_key=key, **body)
        action: dict[str, Any] = reply.data
        return action

    def _step(
        self,
        tool: str,
        *,
        do: Callable[..., Any],
        target: Target | None,
        args: Mapping[str, Any] | None,
        compensate: Compensation | None,
        before: Any,
        after: Any,
        intent: Mapping[str, Any] | None,
        idempotency_key: str | None,
        approval_timeout_s: float | None,
        wait: bool,
    ) -> Flow[Any]:
        if not self.id:
            raise SagaError(
                "The run is not open yet: use it as a context manager (or open it) first.",
                code="run_not_open",
            )
        call_args = dict(args or {})
        key, body = self._action_request(tool, target, call_args, compensate, intent, idempotency_key)
        body["start"] = True
        snapshot = (yield Invoke(before)) if callable(before) else before
        if snapshot is not None:
            body["before_snapshot"] = snapshot

        reply = yield from self._api.record_action(self.id, tool=tool, idempotency_key=key, **body)
        action: dict[str, Any] = reply.data
        if action["status"] in DONE_STATES:
            self._settled(action)
            return action["result"]
        # Started by this very call (``start: true``) only when the answer is not a replay. A
        # replayed ``running`` may be another caller's start (another process running the same
        # step, or our own first send whose answer was lost — the server cannot tell which):
        # running ``do`` on it could make one recorded call two real ones.
        started_here = reply.started_here
        try:
            value = yield from self._execute(
                action,
                started_here=started_here,
                do=do,
                call_args=call_args,
                after=after,
                approval_timeout_s=approval_timeout_s,
                wait=wait,
            )
        except ApprovalPending as pending:
            self.pending_approvals[pending.action_id] = pending.action
            raise
        except BaseException:
            # Whatever stopped this step (rejection, approval timeout, the tool itself), the
            # run's failure report names it.
            self.pending_approvals.pop(action["id"], None)
            self._failed_action_id = action["id"]
            raise
        # An earlier failed step that was retried successfully is no longer the run's culprit.
        self._failed_action_id = None
        self._failure_reason = "failed"
        return value

    def _execute(
        self,
        action: dict[str, Any],
        *,
        started_here: bool,
        do: Callable[..., Any],
        call_args: dict[str, Any],
        after: Any,
        approval_timeout_s: float | None,
        wait: bool,
    ) -> Flow[Any]:
        if not started_here:
            if action["status"] in ("running", "unknown"):
                raise StepInDoubt(action)
            if action["status"] == "rejected":
                raise rejection(action)
            if action["status"] == "awaiting_approval":
                if not wait:
                    raise ApprovalPending(action)
                action = yield from self._api.wait_for_approval(action, timeout_s=approval_timeout_s)

        effective_args = action["args"]
        takes_args = accepts_argument(do)
        if not takes_args and effective_args != call_args:
            raise SagaError(
                f"The approver edited the args of {action['tool']}; `do` must accept them as a parameter.",
                code="args_edited",
            )
        if not started_here:
            started = yield from self._start(action, approval_timeout_s=approval_timeout_s, wait=wait)
            action = started.data
            if not started.started_here:
                # Another call of this step started it first: its outcome is that call's to
                # report. A finished one is replayed; one still running is in doubt here.
                if action["status"] in DONE_STATES:
                    self._settled(action)
                    return action["result"]
                raise StepInDoubt(action)
        self.pending_approvals.pop(action["id"], None)
        try:
            value = yield Invoke(do, (effective_args,) if takes_args else ())
        except BaseException as exc:
            unknown = is_timeout(exc)
            if unknown:
                self._failure_reason = "outcome_unknown"
            try:
                yield from self._api.fail_action(
                    action,
                    error=f"{type(exc).__name__}: {exc}",
                    retryable=bool(getattr(exc, "retryable", unknown)),
                    layer="tool",
                    outcome_unknown=unknown,
                )
            except SagaError:
                # The tool's own exception is what the caller must see; the run's failure report
                # still names this action.
                log.exception("saga: could not record the failure of %s", action["id"])
            raise
        try:
            after_snapshot = (yield Invoke(after, (value,))) if callable(after) else after
        except Exception:
            # The call happened: record it (without a snapshot) before the error goes up.
            yield from self._succeeded(action, value, None)
            raise
        yield from self._succeeded(action, value, after_snapshot)
        return value

    def _succeeded(self, action: Mapping[str, Any], value: Any, after_snapshot: Any) -> Flow[None]:
        done = yield from self._api.succeed_action(
            action, result=jsonable(value), after_snapshot=after_snapshot
        )
        self._settled(done)

    def _start(self, action: dict[str, Any], *, approval_timeout_s: float | None, wait: bool) -> Flow[Reply]:
        try:
            return (yield from self._api.start(action))
        except Conflict as exc:
            if exc.code == "approval_rejected":
                raise rejection((yield from self._api.get_action(action["id"]))) from None
            if exc.code != "approval_pending":
                raise
            # Recorded before its approval was opened (a race with a policy change): wait, retry once.
            current = yield from self._api.get_action(action["id"])
            if not wait:
                raise ApprovalPending(current) from None
            approved = yield from self._api.wait_for_approval(current, timeout_s=approval_timeout_s)
            return (yield from self._api.start(approved))

    def _settled(self, action: dict[str, Any]) -> None:
        self.pending_approvals.pop(action["id"], None)
        self.actions = [a for a in self.actions if a["id"] != action["id"]] + [action]

    # Checkpoints ----------------------------------------------------------------------------

    def _checkpoint(
        self,
        name: str,
        *,
        state: Mapping[str, Any] | None,
        summary: str,
        recovery_mode: str,
        recovery_instructions: str,
        completed_action_ids: list[str] | None,
        pending_action_ids: list[str] | None,
        requires_user_approval: bool,
        trace_links: list[Any] | None,
    ) -> Flow[Any]:
        return self._api.write_checkpoint(
            self.id,
            name=name,
            state=dict(state or {}),
            summary=summary,
            recovery_mode=recovery_mode,
            recovery_instructions=recovery_instructions,
            completed_action_ids=completed_action_ids
            if completed_action_ids is not None
            else [a["id"] for a in self.actions if a["status"] == "succeeded"],
            pending_action_ids=pending_action_ids or [],
            requires_user_approval=requires_user_approval,
            trace_links=trace_links or [],
        )
