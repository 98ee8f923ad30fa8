"""A small synchronous client for the Saga Admin agent API. Pure Python + httpx: no Django.

    saga = Saga("https://saga.example.com", api_key)
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        user = run.step("hr.create_user", target=("user", email), args={"email": email},
                        do=lambda args: hr.create_user(**args),
                        compensate=("hr.delete_user", {"email": email}))

Every write carries an idempotency key that is the same on every retry, so the client retries
transient failures (connection errors, 5xx, 409 in flight, 429) without ever doubling an effect.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal

import httpx

log = logging.getLogger("saga_client")

_RETRYABLE_STATUS = {500, 502, 503, 504}
# Action states in which the call already ran to completion: a replayed step returns its result.
_DONE_STATES = {"succeeded", "compensating", "compensated", "compensation_failed"}


# --- Errors -----------------------------------------------------------------------------------


class SagaError(Exception):
    """Base class of everything this client raises on purpose."""


class SagaAPIError(SagaError):
    """The API answered with an error: ``status``, the stable machine ``code``, ``details``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.details = dict(details or {})
        self.request_id = request_id


class AuthenticationFailed(SagaAPIError):
    """401/403: the key is missing, wrong, revoked, or lacks a scope."""


class NotFound(SagaAPIError):
    """404 (including another tenant's object)."""


class Conflict(SagaAPIError):
    """409: a state change the state machine refused, a gated action, a closed run, …"""


class InvalidRequest(SagaAPIError):
    """400/413/415/422: fix the request; retrying it unchanged will not help."""


class RateLimited(SagaAPIError):
    """429 after the client's own retries."""


class ServerError(SagaAPIError):
    """5xx after the client's own retries."""


class ApprovalTimeout(SagaError):
    def __init__(self, action_id: str, waited_s: float) -> None:
        super().__init__(f"Action {action_id} was still awaiting approval after {waited_s:.0f}s.")
        self.action_id, self.waited_s = action_id, waited_s


class ApprovalRejected(SagaError):
    def __init__(self, action_id: str, reason: str = "") -> None:
        super().__init__(f"Action {action_id} was rejected{': ' + reason if reason else ''}.")
        self.action_id, self.reason = action_id, reason


class StepInDoubt(SagaError):
    """A step's earlier attempt started but never reported an outcome (or timed out). Running it
    again could do it twice: find out whether it happened and reconcile it first."""

    def __init__(self, action: Mapping[str, Any]) -> None:
        super().__init__(
            f"Action {action['id']} ({action['tool']}) is {action['status']} from an earlier attempt; "
            "reconcile it (POST /actions/{id}/reconcile) before running it again."
        )
        self.action = dict(action)


def _error_class(status: int) -> type[SagaAPIError]:
    if status in (401, 403):
        return AuthenticationFailed
    if status == 404:
        return NotFound
    if status == 409:
        return Conflict
    if status == 429:
        return RateLimited
    if status >= 500:
        return ServerError
    return InvalidRequest


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _jsonable(value: Any) -> Any:
    """What can be stored as a step's result: the value itself when it is JSON, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)[:10000]}
    return value


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError | httpx.TimeoutException)


# --- The HTTP layer ---------------------------------------------------------------------------


class SagaClient:
    """The REST API, one method per endpoint, with retries. ``run()`` is the high-level entry."""

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
        approval_timeout_s: float = 3600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        if not base.endswith("/api/v1"):
            base += "/api/v1"
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.poll_interval_s, self.approval_timeout_s = poll_interval_s, approval_timeout_s
        self._http = httpx.Client(
            base_url=base,
            timeout=timeout,
            transport=transport,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": "saga-admin-python-client/1",
            },
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SagaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """One API call with retries; returns the decoded JSON or raises a ``SagaAPIError``.

        Retried: connection errors and timeouts, 5xx, 409 ``idempotency_key_in_flight`` and 429
        (after Retry-After). Writes are only retried when they carry an idempotency key, so a
        retry can never do a thing twice."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        safe_to_retry = (
            method == "GET"
            or idempotency_key is not None
            or (json_body is not None and isinstance(json_body, dict) and "idempotency_key" in json_body)
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(method, path, json=json_body, params=params, headers=headers)
            except httpx.TransportError:
                if not safe_to_retry or attempt > self.retries:
                    raise
                self._sleep(attempt)
                continue
            if response.status_code < 400:
                return response.json() if response.content else None
            error = self._error(response)
            retry = (
                response.status_code in _RETRYABLE_STATUS
                or response.status_code == 429
                or (response.status_code == 409 and error.code == "idempotency_key_in_flight")
            )
            if not retry or not safe_to_retry or attempt > self.retries:
                raise error
            self._sleep(attempt, retry_after=response.headers.get("Retry-After"))

    def _sleep(self, attempt: int, retry_after: str | None = None) -> None:
        if retry_after and retry_after.isdigit():
            delay = min(float(retry_after), self.max_backoff_s * 4)
        else:
            delay = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
            delay *= random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not security
        time.sleep(delay)

    @staticmethod
    def _error(response: httpx.Response) -> SagaAPIError:
        try:
            body = response.json()["error"]
            code, message, details = body["code"], body["message"], body.get("details") or {}
        except (ValueError, KeyError, TypeError):
            code, message, details = "http_error", response.text[:500] or response.reason_phrase, {}
        return _error_class(response.status_code)(
            response.status_code, code, message, details, request_id=response.headers.get("X-Request-Id", "")
        )

    # Runs -----------------------------------------------------------------------------------

    def create_run(
        self, *, agent: str, request: str, idempotency_key: str | None = None, **fields: Any
    ) -> dict:
        return self.request(
            "POST",
            "/runs",
            json_body={"agent": agent, "request": request, **fields},
            idempotency_key=idempotency_key or f"run-{uuid.uuid4()}",
        )

    def get_run(self, run_id: str) -> dict:
        """The run with its newest actions (at most 100; ``actions_next`` is set when it has more:
        ``list_actions`` reads them all)."""
        return self.request("GET", f"/runs/{run_id}")

    def list_actions(self, run_id: str, *, page_size: int = 500) -> Iterator[dict]:
        """Every action of the run, oldest first, following the cursor (``page_size`` ≤ 500)."""
        params: dict[str, Any] = {"limit": page_size}
        while True:
            page = self.request("GET", f"/runs/{run_id}/actions", params=params)
            yield from page["items"]
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def list_runs(self, **filters: Any) -> Iterator[dict]:
        """Every run matching the filters, newest first, following the cursor."""
        params = {k: v for k, v in filters.items() if v is not None}
        while True:
            page = self.request("GET", "/runs", params=params)
            yield from page["items"]
            if not page["next_cursor"]:
                return
            params["cursor"] = page["next_cursor"]

    def heartbeat(self, run_id: str, note: str = "") -> list[dict]:
        return self.request("POST", f"/runs/{run_id}/heartbeat", json_body={"note": note})["commands"]

    def complete_run(self, run_id: str, summary: str = "", *, idempotency_key: str | None = None) -> dict:
        return self.request(
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
    ) -> dict:
        body: dict[str, Any] = {"error": error[:20000] or "failed", "reason": reason}
        if failed_action_id:
            body["failed_action_id"] = failed_action_id
        return self.request(
            "POST",
            f"/runs/{run_id}/fail",
            json_body=body,
            idempotency_key=idempotency_key or f"fail-{run_id}-{uuid.uuid4()}",
        )

    def commands(self, run_id: str) -> list[dict]:
        return self.request("GET", f"/runs/{run_id}/commands")["commands"]

    def ack_command(self, command_id: str) -> dict:
        return self.request("POST", f"/commands/{command_id}/ack", idempotency_key=f"ack-{command_id}")

    def trail(self, run_id: str) -> dict:
        return self.request("GET", f"/runs/{run_id}/trail")

    def policies(self) -> dict:
        return self.request("GET", "/policies")

    # Actions --------------------------------------------------------------------------------

    def record_action(self, run_id: str, *, tool: str, idempotency_key: str, **fields: Any) -> dict:
        """Record an action; ``start=True`` also starts it when it needs no approval (it comes back
        ``running``; a replay comes back as the action is now)."""
        return self.request(
            "POST",
            f"/runs/{run_id}/actions",
            json_body={"tool": tool, "idempotency_key": idempotency_key, **fields},
        )

    def get_action(self, action_id: str) -> dict:
        return self.request("GET", f"/actions/{action_id}")

    def start_action(self, action: Mapping[str, Any]) -> dict:
        # One key per attempt: a retried start of this attempt replays, a later attempt is new.
        key = f"{action['idempotency_key']}:start:{action['attempts'] + 1}"
        return self.request("POST", f"/actions/{action['id']}/start", idempotency_key=key)

    def succeed_action(
        self, action: Mapping[str, Any], *, result: Any = None, after_snapshot: Any = None
    ) -> dict:
        key = f"{action['idempotency_key']}:succeed:{action['attempts']}"
        return self.request(
            "POST",
            f"/actions/{action['id']}/succeed",
            json_body={"result": result, "after_snapshot": after_snapshot},
            idempotency_key=key,
        )

    def fail_action(
        self,
        action: Mapping[str, Any],
        *,
        error: str,
        retryable: bool = False,
        layer: str = "tool",
        outcome_unknown: bool = False,
    ) -> dict:
        key = f"{action['idempotency_key']}:fail:{action['attempts']}"
        return self.request(
            "POST",
            f"/actions/{action['id']}/fail",
            idempotency_key=key,
            json_body={
                "error": error[:20000] or "failed",
                "retryable": retryable,
                "layer": layer,
                "outcome_unknown": outcome_unknown,
            },
        )

    def verify_action(
        self, action_id: str, *, ok: bool, expected: Any = None, actual: Any = None, reason: str = ""
    ) -> dict:
        return self.request(
            "POST",
            f"/actions/{action_id}/verify",
            idempotency_key=f"verify-{uuid.uuid4()}",
            json_body={"ok": ok, "expected": expected, "actual": actual, "reason": reason},
        )

    def reconcile_action(
        self, action_id: str, *, happened: bool, reason: str, result: Any = None, after_snapshot: Any = None
    ) -> dict:
        return self.request(
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

    def wait_for_approval(self, action: Mapping[str, Any], *, timeout_s: float | None = None) -> dict:
        """Poll the action until a human decided. Returns it once approved; raises
        ``ApprovalRejected`` (rejected or expired) or ``ApprovalTimeout``."""
        timeout = self.approval_timeout_s if timeout_s is None else timeout_s
        started = time.monotonic()
        current = dict(action)
        while current["status"] == "awaiting_approval":
            waited = time.monotonic() - started
            if waited >= timeout:
                raise ApprovalTimeout(current["id"], waited)
            time.sleep(min(self.poll_interval_s, max(timeout - waited, 0.01)))
            current = self.get_action(current["id"])
        if current["status"] == "rejected":
            approval = current.get("approval") or {}
            raise ApprovalRejected(current["id"], approval.get("reason") or current.get("error", ""))
        return current

    # Checkpoints ----------------------------------------------------------------------------

    def write_checkpoint(
        self, run_id: str, *, name: str, idempotency_key: str | None = None, **fields: Any
    ) -> dict:
        return self.request(
            "POST",
            f"/runs/{run_id}/checkpoints",
            json_body={"name": name, **fields},
            idempotency_key=idempotency_key or f"checkpoint-{uuid.uuid4()}",
        )

    def latest_checkpoint(self, run_id: str) -> dict | None:
        try:
            return self.request("GET", f"/runs/{run_id}/checkpoints/latest")
        except NotFound:
            return None

    # High level -----------------------------------------------------------------------------

    def run(self, *, agent: str, request: str, **fields: Any) -> RunContext:
        """A context manager that creates the run on entry, completes it on a clean exit and fails
        it (landing it in the recovery queue) when the block raises."""
        return RunContext(self, agent=agent, request=request, fields=fields)

    def attach(self, run_id: str) -> RunContext:
        """Continue an existing run (e.g. after a resume command): steps already done replay
        their recorded results instead of running again."""
        context = RunContext(self, agent="", request="", fields={})
        context.run = self.get_run(run_id)
        context.id = run_id
        return context


Saga = SagaClient


# --- A run and its steps ----------------------------------------------------------------------

Target = tuple[str, str]


class RunContext:
    def __init__(self, client: SagaClient, *, agent: str, request: str, fields: dict[str, Any]) -> None:
        self.client = client
        self._create = {"agent": agent, "request": request, **fields}
        self.run: dict[str, Any] = {}
        self.id = ""
        self.actions: list[dict[str, Any]] = []
        self._finished = False
        self._failed_action_id: str | None = None
        # What the run's failure report calls it: a timed-out step must be reconciled first.
        self._failure_reason = "failed"

    # The context manager ------------------------------------------------------------------

    def __enter__(self) -> RunContext:
        if not self.id:
            self.run = self.client.create_run(**self._create)
            self.id = self.run["id"]
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._finished:
            return False
        if exc is None:
            self.complete()
            return False
        try:
            self.fail(
                f"{type(exc).__name__}: {exc}",
                failed_action_id=self._failed_action_id,
                reason=self._failure_reason,
            )
        except (SagaError, httpx.HTTPError):
            # The original exception matters more than a failed report (the run may already be
            # cancelled); the heartbeat sweeper will still find a silent run.
            log.exception("saga: could not report the run's failure")
        return False  # re-raise

    def complete(self, summary: str = "") -> dict:
        self.run = self.client.complete_run(self.id, summary)
        self._finished = True
        return self.run

    def fail(self, error: str, *, failed_action_id: str | None = None, reason: str = "failed") -> dict:
        self._finished = True
        self.run = self.client.fail_run(self.id, error, failed_action_id=failed_action_id, reason=reason)
        return self.run

    # Steps -------------------------------------------------------------------------------------

    def step_key(self, tool: str, target: Target | None, args: Any) -> str:
        """Deterministic: the same call in the same run always gets the same key, so a retried
        step (in this process or after a restart) replays instead of acting twice."""
        digest = hashlib.sha256(_canonical([self.id, tool, list(target) if target else None, args]).encode())
        return f"{self.id}:{digest.hexdigest()[:40]}"

    def step(
        self,
        tool: str,
        *,
        do: Callable[..., Any],
        target: Target | None = None,
        args: Mapping[str, Any] | None = None,
        compensate: tuple[str, Mapping[str, Any]] | None = None,
        before: Any = None,
        after: Any = None,
        intent: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        approval_timeout_s: float | None = None,
    ) -> Any:
        """Record the action, wait for approval when policy demands it, start it, call ``do``
        and record the outcome. Returns what ``do`` returned (or, when this step already
        succeeded earlier, its recorded result — ``do`` is not called again).

        ``do`` receives the effective args (the approver may have edited them) when it takes a
        parameter. ``before``/``after`` are snapshots, or callables producing them (``after``
        gets ``do``'s result). A timeout inside ``do`` records the outcome as unknown."""
        call_args = dict(args or {})
        key = idempotency_key or self.step_key(tool, target, call_args)
        body: dict[str, Any] = {"args": call_args}
        if target is not None:
            body["target_type"], body["target_id"] = target
        if compensate is not None:
            body["compensation"] = {"tool": compensate[0], "args": dict(compensate[1])}
        if intent is not None:
            body["intent"] = dict(intent)
        snapshot = before() if callable(before) else before
        if snapshot is not None:
            body["before_snapshot"] = snapshot

        action = self.client.record_action(self.id, tool=tool, idempotency_key=key, **body)
        if action["status"] in _DONE_STATES:
            self._remember(action)
            return action["result"]
        try:
            value = self._execute(
                action, do=do, call_args=call_args, after=after, approval_timeout_s=approval_timeout_s
            )
        except BaseException:
            # Whatever stopped this step (rejection, approval timeout, the tool itself), the
            # run's failure report names it.
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
        do: Callable[..., Any],
        call_args: dict[str, Any],
        after: Any,
        approval_timeout_s: float | None,
    ) -> Any:
        if action["status"] in ("running", "unknown"):
            raise StepInDoubt(action)
        if action["status"] == "rejected":
            raise ApprovalRejected(action["id"], (action.get("approval") or {}).get("reason", ""))
        if action["status"] == "awaiting_approval":
            action = self.client.wait_for_approval(action, timeout_s=approval_timeout_s)

        effective_args = action["args"]
        takes_args = _accepts_argument(do)
        if not takes_args and effective_args != call_args:
            raise SagaError(
                f"The approver edited the args of {action['tool']}; `do` must accept them as a parameter."
            )
        action = self._start(action, approval_timeout_s)
        try:
            value = do(effective_args) if takes_args else do()
        except BaseException as exc:
            unknown = _is_timeout(exc)
            if unknown:
                self._failure_reason = "outcome_unknown"
            try:
                self.client.fail_action(
                    action,
                    error=f"{type(exc).__name__}: {exc}",
                    retryable=bool(getattr(exc, "retryable", unknown)),
                    layer="tool",
                    outcome_unknown=unknown,
                )
            except (SagaError, httpx.HTTPError):
                # The tool's own exception is what the caller must see; the run's failure report
                # (in __exit__) still names this action.
                log.exception("saga: could not record the failure of %s", action["id"])
            raise
        after_snapshot = after(value) if callable(after) else after
        action = self.client.succeed_action(action, result=_jsonable(value), after_snapshot=after_snapshot)
        self._remember(action)
        return value

    def _start(self, action: dict[str, Any], approval_timeout_s: float | None) -> dict[str, Any]:
        try:
            return self.client.start_action(action)
        except Conflict as exc:
            # Recorded before its approval was opened (a race with policy changes): wait, retry once.
            if exc.code != "approval_pending":
                raise
            approved = self.client.wait_for_approval(
                self.client.get_action(action["id"]), timeout_s=approval_timeout_s
            )
            return self.client.start_action(approved)

    def _remember(self, action: dict[str, Any]) -> None:
        self.actions = [a for a in self.actions if a["id"] != action["id"]] + [action]

    # Checkpoints, heartbeats, commands ------------------------------------------------------

    def checkpoint(
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
    ) -> dict:
        """Write a safe pause point. By default the completed actions are this run's steps so far."""
        return self.client.write_checkpoint(
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

    def heartbeat(self, note: str = "") -> list[dict]:
        """Tell Saga Admin the agent is alive; returns pending resume/cancel commands."""
        return self.client.heartbeat(self.id, note)

    def commands(self) -> list[dict]:
        return self.client.commands(self.id)

    def ack(self, command_id: str) -> dict:
        return self.client.ack_command(command_id)

    def trail(self) -> dict:
        return self.client.trail(self.id)


def _accepts_argument(func: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume they take the args
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)
