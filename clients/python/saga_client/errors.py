"""What the client raises on purpose. Every class carries ``code``: the API's stable machine code
for an error the server answered, or the client's own for what it found out itself
(``unavailable``, ``approval_pending``, ``approval_timeout``, ``step_in_doubt``, …)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from saga_client._codes import CLASS_RULES, DEFAULT_CLASS, REJECTION_DEFAULT, REJECTION_RULES


class SagaError(Exception):
    """Base class of everything this client raises on purpose."""

    code: str = "saga_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class SagaUnavailable(SagaError):
    """The server could not be reached (connection refused, DNS, timeouts) after the client's own
    retries. The transport error is the ``__cause__``."""

    code = "unavailable"

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


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
        super().__init__(message, code=code)
        self.status = status
        self.details = dict(details or {})
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


class SagaAuthError(SagaAPIError):
    """401/403: the key is missing, wrong, revoked, or lacks a scope. The message is the server's."""


class NotFound(SagaAPIError):
    """404 (including another tenant's object, or another agent's run)."""


class RunArchived(NotFound):
    """410 ``archived``: retention moved the run to its archive and removed it from Saga Admin, so
    it takes no more reads or writes there. A kind of ``NotFound`` (code that handles a missing run
    handles it too); ``archive`` is the URL of the run's manifest, ``archived_at`` when (ISO 8601).
    Only a key that could have read the run is told: any other gets ``NotFound``."""

    @property
    def archive(self) -> str:
        return str(self.details.get("archive") or "")

    @property
    def archived_at(self) -> str:
        return str(self.details.get("archived_at") or "")


class Conflict(SagaAPIError):
    """409: a state change the state machine refused, a gated action, a closed run, …"""


class RunCancelled(Conflict):
    """409 with ``details.current == "cancelled"``: an operator cancelled the run, which refuses
    every further write (``code`` stays the API's, e.g. ``run_not_accepting_actions``). A run
    block that ends with it does not try to fail the run: it is finished already."""

    @property
    def run_id(self) -> str:
        return str(self.details.get("run_id") or self.details.get("subject") or "")


class Paused(Conflict):
    """409 ``paused``: an operator paused this agent or tool (``details`` names the pause)."""


class PolicyDenied(SagaAPIError):
    """403 ``policy_denied``: a policy rule or limit refuses this call (``details`` name it)."""


class InvalidRequest(SagaAPIError):
    """400/413/415/422: fix the request; retrying it unchanged will not help."""


class RateLimited(SagaAPIError):
    """429 after the client's own retries."""


class ServerError(SagaAPIError):
    """5xx after the client's own retries."""


# The names this client had before it grew typed twins; kept so existing code keeps working.
AuthenticationFailed = SagaAuthError


class ApprovalPending(SagaError):
    """A gated step was recorded and is waiting for a person (raised by ``step(..., wait=False)``).

    Nothing ran. Call the same step again (same tool, target and args: the same idempotency key)
    once it is decided: approved → it runs, with the approver's args if they edited them;
    rejected → ``ApprovalRejected``; still undecided → ``ApprovalPending`` again."""

    code = "approval_pending"

    def __init__(self, action: Mapping[str, Any]) -> None:
        self.action = dict(action)
        self.action_id: str = self.action["id"]
        self.run_id: str = self.action.get("run_id", "")
        self.tool: str = self.action.get("tool", "")
        # ``args`` is the exception's own (its message), as for every exception: the step's are these.
        self.step_args: Any = self.action.get("args")
        self.idempotency_key: str = self.action.get("idempotency_key", "")
        self.approval: dict[str, Any] = dict(self.action.get("approval") or {})
        self.approval_id: str = self.approval.get("id", "")
        super().__init__(
            f"Action {self.action_id} ({self.tool}) is waiting for approval"
            f"{' ' + self.approval_id if self.approval_id else ''}; "
            "call the same step again once it is decided."
        )


class ApprovalRejected(SagaError):
    """A person rejected the step (or its approval expired: ``ApprovalDeadlinePassed`` when its
    deadline passed). Nothing ran."""

    code = "approval_rejected"

    def __init__(self, action_id: str, reason: str = "", *, action: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"Action {action_id} was rejected{': ' + reason if reason else ''}.")
        self.action_id, self.reason = action_id, reason
        self.action = dict(action or {})


class ApprovalDeadlinePassed(ApprovalRejected):
    """Nobody decided before the approval deadline of the step's policy (its ``approval_timeout``,
    escalated first if its policy says so), so Saga Admin rejected it: the action is ``rejected``
    and its approval ``expired`` with reason ``timed_out``. Nothing ran. A kind of
    ``ApprovalRejected``: code that handles rejections handles it too. ``deadline``: when it passed
    (ISO 8601, "" when unknown); ``escalated_to``: to whom it was escalated first ("" when not)."""

    code = "approval_deadline_passed"

    def __init__(self, action_id: str, reason: str = "", *, action: Mapping[str, Any] | None = None) -> None:
        super().__init__(action_id, reason, action=action)
        approval = dict((action or {}).get("approval") or {})
        self.deadline: str = str(approval.get("expires_at") or "")
        self.escalated_to: str = (
            str(approval.get("escalate_to") or "") if approval.get("escalated_at") else ""
        )
        escalated = f" (escalated to {self.escalated_to} first)" if self.escalated_to else ""
        when = f" ({self.deadline})" if self.deadline else ""
        self.message = (
            f"Action {action_id} was rejected: nobody decided before its approval deadline{when}"
            f"{escalated}; reason {reason or 'timed_out'}."
        )
        self.args = (self.message,)


def rejection_for(action: Mapping[str, Any]) -> ApprovalRejected:
    """What a rejected action raises: the class of the spec's first rejection rule whose reason is
    the action's approval's (``clients/spec/errors.json``, "rejections"), else ``ApprovalRejected``."""
    approval = action.get("approval") or {}
    reason = str(approval.get("reason") or action.get("error") or "")
    name = next(
        (cls for rule_reason, cls, _code in REJECTION_RULES if rule_reason == approval.get("reason")), None
    )
    rejected_class = _REJECTIONS[name or REJECTION_DEFAULT[0]]
    return rejected_class(str(action["id"]), reason, action=action)


def rejection_words(tool: str, rejected: ApprovalRejected) -> str:
    """A rejection as a framework's adapter tells its model: who refused, and why."""
    if isinstance(rejected, ApprovalDeadlinePassed):
        return (
            f"Saga Admin: nobody approved {tool} before its approval deadline, so it was rejected "
            f"(reason {rejected.reason or 'timed_out'}); it did not run."
        )
    return f"Saga Admin: an approver rejected {tool}" + (f": {rejected.reason}" if rejected.reason else ".")


_REJECTIONS: dict[str, type[ApprovalRejected]] = {
    cls.__name__: cls for cls in (ApprovalRejected, ApprovalDeadlinePassed)
}


class ApprovalTimeout(SagaError):
    """Nobody decided within the approval timeout. The action stays ``awaiting_approval``;
    ``reason`` says why the wait ended."""

    code = "approval_timeout"

    def __init__(self, action_id: str, waited_s: float) -> None:
        self.reason = f"nobody decided within {waited_s:.0f}s"
        super().__init__(
            f"Action {action_id} was still awaiting approval after {waited_s:.0f}s ({self.reason})."
        )
        self.action_id, self.waited_s = action_id, waited_s


# The name both clients use (the TypeScript client's ``ApprovalTimedOut``).
ApprovalTimedOut = ApprovalTimeout


class StepInDoubt(SagaError):
    """A step's earlier attempt started but never reported an outcome (or timed out). Running it
    again could do it twice: find out whether it happened and reconcile it first."""

    code = "step_in_doubt"

    def __init__(self, action: Mapping[str, Any]) -> None:
        if action["status"] == "running":
            # Another call of the same step (another process, or an earlier send of this one
            # whose answer was lost) started it: it was not run here, and must not be run twice.
            message = (
                f"Action {action['id']} ({action['tool']}) is running, started by another call of "
                "the same step; it was not run again here. Read its outcome (GET /actions/{id}) "
                "once that call reports it, or reconcile it if that call is lost."
            )
        else:
            message = (
                f"Action {action['id']} ({action['tool']}) is {action['status']} from an earlier "
                "attempt; reconcile it (POST /actions/{id}/reconcile) before running it again."
            )
        super().__init__(message)
        self.action = dict(action)


class BeforeImageFailed(SagaError):
    """A step whose policy has ``before`` was refused before anything was recorded or called: its
    before-image could not be taken (no reader registered for the read, a read that raised, or a
    result with no value at the policy's path). ``read_tool`` names the read and ``reason`` says
    why; ``do`` was not called.

    Also raised for a step that waited for approval (or was recorded ahead) when the read made
    again just before it starts gives no image or another value than the recorded one
    (``reason``: "the value changed while the step waited for approval"): the action
    (``action_id``) is left as it was (approved, or planned) and not started, its approval
    unspent, as ``saga-mcp`` leaves it."""

    code = "before_image_failed"

    def __init__(
        self, tool: str, read_tool: str, reason: str, *, action_id: str = "", message: str = ""
    ) -> None:
        self.tool, self.read_tool, self.reason, self.action_id = tool, read_tool, reason, action_id
        super().__init__(
            message
            or f"{tool} was not called: its policy takes a before-image through {read_tool}, and that "
            f"read failed ({reason}). No update without its before-image."
        )


class NoActiveRun(SagaError):
    """A ``@saga.tool`` function was called outside ``with saga.run(...)`` (or ``async with``)."""

    code = "no_active_run"


_CLASSES: dict[str, type[SagaAPIError]] = {
    cls.__name__: cls
    for cls in (
        RunCancelled,
        Paused,
        PolicyDenied,
        SagaAuthError,
        RunArchived,
        NotFound,
        Conflict,
        RateLimited,
        ServerError,
        InvalidRequest,
    )
}


def _class_for(status: int, code: str, details: Mapping[str, Any]) -> type[SagaAPIError]:
    """The first of the spec's rules (``clients/spec/errors.json``, generated into ``_codes``) that
    matches the answer."""
    for name, rule_code, statuses, min_status, current in CLASS_RULES:
        if rule_code is not None and code != rule_code:
            continue
        if statuses and status not in statuses:
            continue
        if min_status is not None and status < min_status:
            continue
        if current is not None and details.get("current") != current:
            continue
        return _CLASSES[name]
    return _CLASSES[DEFAULT_CLASS]


def error_from_response(response: httpx.Response) -> SagaAPIError:
    """The typed exception for an error answer: the API's ``{"error": {code, message, details}}``,
    or (from a proxy in front, say) the status and the start of the body."""
    try:
        body = response.json()["error"]
        code, message, details = str(body["code"]), str(body["message"]), body.get("details") or {}
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:500] or response.reason_phrase, {}
    if not isinstance(details, Mapping):
        details = {"details": details}
    return _class_for(response.status_code, code, details)(
        response.status_code, code, message, details, request_id=response.headers.get("X-Request-Id", "")
    )
