"""The one place that builds Saga Admin requests and reads their answers, with no I/O of its own.

Every operation is a generator (a *flow*) that yields effects — send this HTTP request, sleep this
long, call the agent's function — and is sent back their outcomes (or has their exception thrown
in). ``Saga`` drives flows with blocking calls, ``AsyncSaga`` with ``await``; neither holds a rule
of the API, so the two cannot drift apart (the shape of httpx's ``Client``/``AsyncClient``).

This module: the effects, the retry rule and one flow per endpoint (``Api``). The flows of a run
and its steps, built on these, are in ``saga_client._run``.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, cast

import httpx

from saga_client._codes import RETRY_CODES, RETRY_STATUS
from saga_client._policies import PolicyCache
from saga_client._tracing import trace_headers
from saga_client.errors import (
    ApprovalRejected,
    ApprovalTimeout,
    NotFound,
    SagaError,
    SagaUnavailable,
    error_from_response,
    rejection_for,
)
from saga_client.responses import (
    ActionDict,
    ActionPageDict,
    ActionVerifyDict,
    CheckpointDict,
    CommandDict,
    PoliciesDict,
    RunDetailDict,
    RunDict,
    RunFailDict,
    RunPageDict,
    TrailDict,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

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
    # The answer's ETag (``GET /policies``), "" without one.
    etag: str = ""

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
    # How long the client uses its copy of the tenant's policies before it asks whether they
    # changed (``If-None-Match``: 304 when not): ``saga_client._policies``.
    policy_refresh_s: float = 5.0


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
        # The tools the server said no policy names (``default_policy``), each logged once.
        self.defaulted_tools: set[str] = set()
        # The tenant's policies as last read, and the readers registered on this client by read
        # tool name (``saga.reader``): what a step whose policy has ``before`` needs.
        self.policy_cache = PolicyCache(settings.policy_refresh_s)
        self.readers: dict[str, Callable[..., Any]] = {}

    def note_warnings(self, actions: Sequence[Mapping[str, Any]]) -> None:
        """Log, once per tool for this client, a recorded action's ``default_policy`` warning: no
        policy names the tool (a mistyped name, most often), so the default applied and the step
        may wait for an approval nobody expected."""
        for action in actions:
            for warning in action.get("warnings") or ():
                tool = str(action.get("tool", ""))
                if warning.get("code") == "default_policy" and tool not in self.defaulted_tools:
                    self.defaulted_tools.add(tool)
                    log.warning("saga: %s", warning.get("message", f"no policy names {tool}"))

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
        headers: Mapping[str, str] | None = None,
    ) -> Flow[Reply]:
        """One API call with retries; the reply, or a typed ``SagaError``.

        Retried: connection errors and timeouts, 5xx, 409 ``idempotency_key_in_flight`` and 429
        (after Retry-After) — for reads, for writes that carry an idempotency key (the same key on
        every attempt, so a retry can never do a thing twice) and for writes that are harmless to
        repeat (``retry_safe``)."""
        # The caller's trace context (``_tracing``), taken here, in the caller's own context.
        sent = {**trace_headers(), **(headers or {})}
        if idempotency_key:
            sent["Idempotency-Key"] = idempotency_key
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
                response: httpx.Response = yield Send(method, path, json_body, params, sent)
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
                return Reply(
                    response.status_code,
                    _decoded(response),
                    resent=resent,
                    replayed=replayed,
                    etag=response.headers.get("ETag", ""),
                )
            error = error_from_response(response)
            retry = response.status_code in RETRY_STATUS or error.code in RETRY_CODES
            if not retry or not safe or attempt > self.settings.retries:
                raise error
            yield Sleep(self.backoff(attempt, retry_after=response.headers.get("Retry-After")))

    def call(self, method: str, path: str, **kwargs: Any) -> Flow[Any]:
        reply = yield from self.request(method, path, **kwargs)
        return reply.data

    # Runs -----------------------------------------------------------------------------------

    def create_run(
        self, *, agent: str, request: str, idempotency_key: str | None = None, **fields: Any
    ) -> Flow[RunDict]:
        return self.call(
            "POST",
            "/runs",
            json_body={"agent": agent, "request": request, **fields},
            idempotency_key=idempotency_key or f"run-{uuid.uuid4()}",
        )

    def get_run(self, run_id: str) -> Flow[RunDetailDict]:
        return self.call("GET", f"/runs/{run_id}")

    def actions_page(self, run_id: str, params: Mapping[str, Any]) -> Flow[ActionPageDict]:
        return self.call("GET", f"/runs/{run_id}/actions", params=params)

    def runs_page(self, params: Mapping[str, Any]) -> Flow[RunPageDict]:
        return self.call("GET", "/runs", params=params)

    def heartbeat(self, run_id: str, note: str = "") -> Flow[list[CommandDict]]:
        # A heartbeat only says "alive" (and reads commands): repeating it is harmless.
        data = yield from self.call(
            "POST", f"/runs/{run_id}/heartbeat", json_body={"note": note}, retry_safe=True
        )
        return list(data["commands"])

    def complete_run(
        self,
        run_id: str,
        summary: str = "",
        *,
        withdraw_approvals: bool = False,
        idempotency_key: str | None = None,
    ) -> Flow[RunDict]:
        body: dict[str, Any] = {"summary": summary}
        if withdraw_approvals:
            body["withdraw_approvals"] = True
        return self.call(
            "POST",
            f"/runs/{run_id}/complete",
            json_body=body,
            idempotency_key=idempotency_key or f"complete-{run_id}",
        )

    def fail_run(
        self,
        run_id: str,
        error: str,
        *,
        failed_action_id: str | None = None,
        reason: str = "failed",
        withdraw_approvals: bool = False,
        idempotency_key: str | None = None,
    ) -> Flow[RunFailDict]:
        body: dict[str, Any] = {"error": error[:_MAX_ERROR] or "failed", "reason": reason}
        if failed_action_id:
            body["failed_action_id"] = failed_action_id
        if withdraw_approvals:
            body["withdraw_approvals"] = True
        return self.call(
            "POST",
            f"/runs/{run_id}/fail",
            json_body=body,
            idempotency_key=idempotency_key or f"fail-{run_id}-{uuid.uuid4()}",
        )

    def commands(self, run_id: str) -> Flow[list[CommandDict]]:
        data = yield from self.call("GET", f"/runs/{run_id}/commands")
        return list(data["commands"])

    def ack_command(self, command_id: str) -> Flow[CommandDict]:
        return self.call("POST", f"/commands/{command_id}/ack", idempotency_key=f"ack-{command_id}")

    def trail(self, run_id: str) -> Flow[TrailDict]:
        return self.call("GET", f"/runs/{run_id}/trail")

    def policies(self) -> Flow[PoliciesDict]:
        return self.call("GET", "/policies")

    # Actions --------------------------------------------------------------------------------

    def record_plan(self, run_id: str, actions: list[dict[str, Any]]) -> Flow[Reply]:
        """Several actions in one request, all or nothing. Safe to send again: a plan whose keys
        were all recorded is answered as a replay (200), never recorded twice."""
        reply = yield from self.request(
            "POST", f"/runs/{run_id}/plan", json_body={"actions": actions}, retry_safe=True
        )
        self.note_warnings(reply.data.get("actions") or [])
        return reply

    def record_action(self, run_id: str, *, tool: str, idempotency_key: str, **fields: Any) -> Flow[Reply]:
        reply = yield from self.request(
            "POST",
            f"/runs/{run_id}/actions",
            json_body={"tool": tool, "idempotency_key": idempotency_key, **fields},
        )
        self.note_warnings([reply.data])
        return reply

    def get_action(self, action_id: str) -> Flow[ActionDict]:
        return self.call("GET", f"/actions/{action_id}")

    def start_action(self, action: Mapping[str, Any]) -> Flow[ActionDict]:
        reply = yield from self.start(action)
        started: ActionDict = reply.data
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
    ) -> Flow[ActionDict]:
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
    ) -> Flow[ActionDict]:
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
    ) -> Flow[ActionVerifyDict]:
        return self.call(
            "POST",
            f"/actions/{action_id}/verify",
            idempotency_key=f"verify-{uuid.uuid4()}",
            json_body={"ok": ok, "expected": expected, "actual": actual, "reason": reason},
        )

    def reconcile_action(
        self, action_id: str, *, happened: bool, reason: str, result: Any = None, after_snapshot: Any = None
    ) -> Flow[ActionDict]:
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
    ) -> Flow[ActionDict]:
        """Poll the action until a person decided, backing off from ``poll_interval_s`` to
        ``max_poll_interval_s``. The action once approved; ``ApprovalRejected`` (rejected or
        expired) or ``ApprovalTimeout``."""
        s = self.settings
        timeout = s.approval_timeout_s if timeout_s is None else timeout_s
        started, interval = time.monotonic(), s.poll_interval_s
        current = cast(ActionDict, dict(action))
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
    ) -> Flow[CheckpointDict]:
        return self.call(
            "POST",
            f"/runs/{run_id}/checkpoints",
            json_body={"name": name, **fields},
            idempotency_key=idempotency_key or f"checkpoint-{uuid.uuid4()}",
        )

    def latest_checkpoint(self, run_id: str) -> Flow[CheckpointDict | None]:
        try:
            checkpoint: CheckpointDict = yield from self.call("GET", f"/runs/{run_id}/checkpoints/latest")
        except NotFound:
            return None
        return checkpoint


def rejection(action: Mapping[str, Any]) -> ApprovalRejected:
    """The rejection a rejected action raises (``ApprovalDeadlinePassed`` for a timed-out one)."""
    return rejection_for(action)


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
