"""The one family of domain errors. Each carries a stable machine code and the HTTP status the API
maps it to; the dashboard shows ``message``. Services raise these and nothing else for anything a
client or operator can cause."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.db.models import Model


class SagaError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self, message: str, *, details: dict[str, Any] | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        if code:
            self.code = code


class NotFound(SagaError):
    status = 404
    code = "not_found"

    # An id is 30 characters; what a longer one holds beyond this is not echoed back.
    SHOWN_ID_LENGTH = 60

    @classmethod
    def for_id(cls, kind: str, pk: str) -> NotFound:
        """The one spelling of "no such object": ``<Kind> <id> not found.`` with ``details={"id": <id>}``.
        An object that exists but is not the caller's gets the very same answer."""
        shown = pk[: cls.SHOWN_ID_LENGTH]
        return cls(f"{kind} {shown} not found.", details={"id": shown})


class RunArchived(SagaError):
    """410 ``archived``: the run was moved to its archive by retention (``ledger.models.ArchivedRun``)
    and removed from the database; ``details``: ``archive`` (the URL of its manifest) and
    ``archived_at``. Only said to a caller who could have reached the run: anyone else gets the
    ``NotFound`` of a run that never existed (``ledger.selectors.archived_run_get``)."""

    status = 410
    code = "archived"

    @classmethod
    def for_run(cls, archived: Any) -> RunArchived:
        """The error for an ``ArchivedRun`` (typed ``Any``: this module imports no model)."""
        when = archived.archived_at.isoformat()
        return cls(
            f"Run {archived.run_id} was archived at {when}; its record is in the archive {archived.archive}.",
            details={"archive": archived.archive, "archived_at": when},
        )


class Forbidden(SagaError):
    status = 403
    code = "forbidden"


class ValidationFailed(SagaError):
    status = 422
    code = "invalid_request"


class Conflict(SagaError):
    status = 409
    code = "conflict"


class InvalidTransition(Conflict):
    """A state change the state machine does not allow from the current state."""

    code = "invalid_transition"

    def __init__(
        self, subject: Model, *, to: str, current: str | None = None, message: str | None = None
    ) -> None:
        current_state = current if current is not None else str(getattr(subject, "status", ""))
        label = f"{type(subject).__name__} {getattr(subject, 'pk', '')}".strip()
        super().__init__(
            message or f"{label} is {current_state!s}; it cannot become {to}.",
            details={"subject": getattr(subject, "pk", None), "current": current_state, "to": to},
        )
        self.current = current_state
        self.to = to
        # What a person is shown instead of the machine message (recovery.decisions.refusal_sentence)
        # reads these: which kind of object, and whether the raiser already worded it for people.
        self.subject_type = type(subject).__name__
        self.worded = message is not None


class RunNotAcceptingActions(Conflict):
    code = "run_not_accepting_actions"


class IdempotencyKeyReused(SagaError):
    status = 422
    code = "idempotency_key_reused"


class IdempotencyKeyInFlight(Conflict):
    code = "idempotency_key_in_flight"


class ApprovalPending(Conflict):
    code = "approval_pending"


class PendingApprovals(Conflict):
    """Completing or failing a run while actions of it still wait for a person's approval: the
    approval would stay in the inbox for a run that is over. The caller decides them first, or
    withdraws them (``withdraw_approvals``)."""

    code = "pending_approvals"


class ApprovalRejected(Conflict):
    code = "approval_rejected"


class ApprovalExpired(Conflict):
    code = "approval_expired"


class ServiceUnavailable(SagaError):
    status = 503
    code = "service_unavailable"


class SelfApproval(Forbidden):
    """Whoever asked for an approval (the recording agent key, the operator who decided the
    compensation) can never grant it, whatever the risk."""

    code = "self_approval"


class UnknownCompensator(ValidationFailed):
    code = "unknown_compensator"


class CompensationNotAllowed(ValidationFailed):
    code = "compensation_not_allowed"


class UrlNotAllowed(ValidationFailed):
    """An outbound URL a tenant or agent chose points where the installation does not allow.

    ``message`` and ``details`` are what the caller is told. Why the URL was refused is kept apart
    for the operator's audit log and never sent to the caller: ``reason`` (one of
    ``infra.outbound``'s reason constants), ``operator_message`` (the full sentence) and
    ``resolved_address`` (the refused address a name resolved to)."""

    code = "url_not_allowed"
    reason: str = ""
    operator_message: str = ""
    resolved_address: str = ""

    def audit_data(self) -> dict[str, str]:
        """What the operator's audit event records about the refusal."""
        return {
            "code": self.code,
            **{k: str(v) for k, v in self.details.items()},
            "reason": self.reason,
            "address": self.resolved_address,
        }


class PlanChanged(Conflict):
    """The compensation plan is not the one the operator confirmed (``plan_hash``): a late action,
    edited args or a policy change. ``details.plan_hash`` is the plan's hash now."""

    code = "plan_changed"


class Paused(Conflict):
    """An operator's pause (a kill switch, ``ledger.models.Pause``) covers this new run or action.
    ``details``: the pause's ``pause_id``, ``agent`` and ``tool`` patterns."""

    code = "paused"


class PolicyDenied(Forbidden):
    """A tool policy refuses this call: a rule on its args with ``effect: deny``, or a limit with
    ``on_exceed: deny`` that it would exceed. ``details`` name the policy and the rule or limit
    (index and plain words). Nothing is recorded."""

    code = "policy_denied"


class AlreadyGranted(Conflict):
    """The same person (a user, or approver keys of one name) granted an approval that needs
    several people once already: a second grant by them counts for nothing."""

    code = "already_granted"
