"""Approval deadlines per policy: how long an approval a policy asks for may wait
(``approval_timeout``, a duration such as ``"30s"``, ``"15m"``, ``"2h"``, ``"1d"``; default
SAGA_APPROVAL_EXPIRY_H), what happens when nobody decided by then (``on_timeout``: ``reject``, the
default, or ``escalate`` — never approve), and to whom it escalates (``escalate_to``: a role that
approves, ``approver`` or ``admin``, or a username).

The checks of the values, one place for both layouts of a policy file and its default policy
(``ledger.policies.schema``); the check of an ``escalate_to`` username against the scope it is
loaded into (``escalation_problems``, which needs the database); and ``ApprovalDeadline``, what an
approval carries of its policy (``recovery.transitions.approvals``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from pydantic_core import PydanticCustomError

from infra.conf import saga
from infra.durations import duration_read
from ledger.models import Membership, Tenant

REJECT = "reject"
ESCALATE = "escalate"
ON_TIMEOUT_VALUES = (REJECT, ESCALATE)

# The shortest and longest deadline a policy may set: a second (tests and demos drive the sweep
# with it; in practice the sweep interval is the floor) and thirty days (an approval nobody
# decides for a month is a forgotten one).
MIN_TIMEOUT_S = 1
MAX_TIMEOUT_S = 30 * 86400
_TEXT_MAX = 32

# The roles an approval may escalate to: those that approve. ``approver`` means every approver
# and admin of the tenant (an admin may do what an approver does); ``admin`` only its admins.
ESCALATION_ROLES = (Membership.Role.APPROVER.value, Membership.Role.ADMIN.value)
_ROLES_THAT_DO_NOT_APPROVE = (Membership.Role.VIEWER.value, Membership.Role.OPERATOR.value)
# Django's username characters.
_USERNAME = re.compile(r"^[\w.@+-]{1,150}$")


def timeout_seconds(value: Any) -> int:
    """An ``approval_timeout`` → whole seconds, or ``PydanticCustomError`` saying what is wrong."""
    if not isinstance(value, str):
        raise PydanticCustomError(
            "approval_timeout",
            'must be a duration string such as "30s", "15m", "2h" or "1d", got {value}',
            {"value": repr(value)[:60]},
        )
    duration = duration_read(value) if len(value) <= _TEXT_MAX else None
    if duration is None:
        raise PydanticCustomError(
            "approval_timeout",
            'must be a duration such as "30s", "15m", "2h" or "1d" (a number and one of ms, s, m, h, d), got {value}',
            {"value": repr(value)[:60]},
        )
    total = float(duration.seconds)
    if total != int(total):
        raise PydanticCustomError(
            "approval_timeout", "must be a whole number of seconds, got {value}", {"value": repr(value)}
        )
    if not MIN_TIMEOUT_S <= total <= MAX_TIMEOUT_S:
        raise PydanticCustomError(
            "approval_timeout",
            "must be at least 1s and at most 30d, got {value}",
            {"value": repr(value)},
        )
    return int(total)


def on_timeout_value(value: Any) -> str:
    if value == "approve":
        raise PydanticCustomError(
            "on_timeout", "must be reject or escalate: a deadline never approves (a person does)"
        )
    if value not in ON_TIMEOUT_VALUES:
        raise PydanticCustomError(
            "on_timeout", "must be one of reject, escalate, got {value}", {"value": repr(value)[:60]}
        )
    return str(value)


def escalate_to_value(value: Any) -> str:
    if not isinstance(value, str) or not _USERNAME.match(value):
        raise PydanticCustomError(
            "escalate_to",
            "must be a role that approves (approver, admin) or a username (letters, digits and @ . + - _, "
            "at most 150), got {value}",
            {"value": repr(value)[:60]},
        )
    if value in _ROLES_THAT_DO_NOT_APPROVE:
        raise PydanticCustomError(
            "escalate_to",
            "the {role} role cannot approve; name approver, admin or a username",
            {"role": value},
        )
    return value


def is_role(escalate_to: str) -> bool:
    return escalate_to in ESCALATION_ROLES


def deadline_problem(*, on_timeout: str | None, escalate_to: str | None, approvers: int | None) -> str:
    """What is incoherent in one policy's deadline fields ("" when nothing): ``escalate`` needs
    ``escalate_to`` and ``escalate_to`` needs ``escalate``; one person cannot give several grants."""
    if on_timeout == ESCALATE and not escalate_to:
        return "escalate_to: is required with on_timeout escalate (a role such as admin, or a username)"
    if escalate_to and on_timeout != ESCALATE:
        return 'escalate_to: applies only with "on_timeout": "escalate"'
    if escalate_to and not is_role(escalate_to) and (approvers or 1) > 1:
        return (
            f"escalate_to: one person ({escalate_to}) cannot give the {approvers} grants this policy "
            "needs; name a role (approver or admin)"
        )
    return ""


def timeout_text(seconds: int | None) -> str:
    """A deadline in the policy file's words: 7200 → ``2h``, 90 → ``90s``; None → ``""``."""
    if seconds is None:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def approval_timeout_text(seconds: int | None) -> str:
    """The deadline a policy gives its approvals, as the file would write it: its own, else
    SAGA_APPROVAL_EXPIRY_H's."""
    return timeout_text(seconds if seconds is not None else int(saga().approval_expiry_h * 3600))


def deadline_summary(*, seconds: int | None, on_timeout: str, escalate_to: str) -> str:
    """A policy's approval deadline in words: ``decided within 2h, else rejected`` or ``decided
    within 15m, else escalated to admin (then rejected after another 15m)``."""
    text = approval_timeout_text(seconds)
    if on_timeout == ESCALATE and escalate_to:
        return f"decided within {text}, else escalated to {escalate_to} (rejected after another {text})"
    return f"decided within {text}, else rejected"


def default_policy_shown(default_policy: dict[str, Any]) -> dict[str, Any]:
    """A stored default policy as a reader sees it: its deadline written as in the file
    (``approval_timeout: "2h"``), with SAGA_APPROVAL_EXPIRY_H's when it sets none."""
    shown = {key: value for key, value in default_policy.items() if key != "approval_timeout_s"}
    shown["approval_timeout"] = approval_timeout_text(default_policy.get("approval_timeout_s"))
    shown.setdefault("on_timeout", REJECT)
    return shown


@dataclass(frozen=True)
class ApprovalDeadline:
    """What an approval carries of the policy that asked for it: its window, what a timeout does,
    and to whom it escalates."""

    timeout_s: int
    on_timeout: str = REJECT
    escalate_to: str = ""

    @classmethod
    def of(cls, policy: Any) -> ApprovalDeadline:
        """The deadline of a policy as an action or a plan froze it (``ResolvedPolicy.as_dict`` or
        ``recovery.planner.governing_policy``); a policy that sets none gets SAGA_APPROVAL_EXPIRY_H
        and ``reject``. Anything malformed (a row from before these fields) is read as unset."""
        policy = policy if isinstance(policy, dict) else {}
        timeout = policy.get("approval_timeout_s")
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < MIN_TIMEOUT_S:
            timeout = int(saga().approval_expiry_h * 3600)
        on_timeout = policy.get("on_timeout")
        escalate_to = policy.get("escalate_to")
        if on_timeout == ESCALATE and isinstance(escalate_to, str) and escalate_to:
            return cls(timeout_s=min(timeout, MAX_TIMEOUT_S), on_timeout=ESCALATE, escalate_to=escalate_to)
        return cls(timeout_s=min(timeout, MAX_TIMEOUT_S))


def _username_problem(username: str, tenant: Tenant | None) -> str:
    user_model = get_user_model()
    user = user_model.objects.filter(**{user_model.USERNAME_FIELD: username}, is_active=True).first()
    approving = Membership.objects.filter(user=user, role__in=ESCALATION_ROLES)
    if tenant is not None:
        if user is None or not approving.filter(tenant=tenant).exists():
            return (
                f"escalate_to: {username!r} is neither a role that approves (approver, admin) nor an "
                f"active approver or admin of tenant {tenant.slug}"
            )
        return ""
    if user is None or not approving.exists():
        return (
            f"escalate_to: {username!r} is neither a role that approves (approver, admin) nor an active "
            "approver or admin of any tenant"
        )
    return ""


def escalation_problems(
    *,
    default_policy: dict[str, Any],
    policies: list[dict[str, Any]],
    tenant: Tenant | None,
    agent_safety: bool,
) -> list[str]:
    """Every ``escalate_to`` naming a person who cannot decide in the scope being loaded (a tenant:
    an active approver or admin of it; global: of some tenant), each naming its entry."""
    problems = []
    named = [("agentSafety.defaultPolicy" if agent_safety else "default_policy", default_policy)]
    for index, policy in enumerate(policies):
        tool = policy.get("tool")
        named.append(
            (
                f'agentSafety.policies["{tool}"]' if agent_safety else f'policies[{index}] (tool "{tool}")',
                policy,
            )
        )
    for where, policy in named:
        escalate_to = policy.get("escalate_to") or ""
        if escalate_to and not is_role(escalate_to) and (problem := _username_problem(escalate_to, tenant)):
            problems.append(f"{where}: {problem}")
    return problems
