"""Builds realistic ledgers through the real services (never by writing state fields)."""

from __future__ import annotations

import itertools
from typing import Any

from ledger import services as ledger
from ledger.audit import Actor
from ledger.models import Run, Tenant, ToolPolicy
from recovery import services as recovery
from recovery.models import RecoveryItem

_keys = itertools.count(1)

ONBOARDING_POLICIES = [
    {
        "tool": "hr.create_user",
        "risk": "medium",
        "approval": "auto",
        "action_class": "internal_update",
        "compensation": "custom",
    },
    {
        "tool": "workspace.provision_license",
        "risk": "medium",
        "approval": "auto",
        "action_class": "external_reversible",
        "compensation": "custom",
    },
    {
        "tool": "email.send_welcome",
        "risk": "low",
        "approval": "auto",
        "action_class": "external_irreversible",
        "compensation": "none",
    },
    {
        "tool": "hr.delete_user",
        "risk": "medium",
        "approval": "auto",
        "action_class": "internal_update",
        "compensation": "none",
    },
    {
        "tool": "workspace.cancel_license",
        "risk": "medium",
        "approval": "auto",
        "action_class": "external_reversible",
        "compensation": "none",
    },
    {
        "tool": "crm.update_*",
        "risk": "low",
        "approval": "auto",
        "action_class": "internal_update",
        "compensation": "snapshot",
    },
    {
        "tool": "payments.refund",
        "risk": "high",
        "approval": "manual",
        "action_class": "external_irreversible",
        "compensation": "none",
    },
]


def load_policies() -> None:
    for row in ONBOARDING_POLICIES:
        ToolPolicy.objects.update_or_create(
            tenant=None, tool=row["tool"], defaults={**row, "source": "tests"}
        )


def _do(
    run: Run,
    agent: Actor,
    tool: str,
    *,
    target_id: str,
    args: dict[str, Any],
    compensation: Any = None,
    before: Any = None,
    after: Any = None,
    reasoning: str = "",
    fail: str = "",
    unknown: bool = False,
):
    action = recovery.action_record_gated(
        run=run,
        actor=agent,
        tool=tool,
        idempotency_key=f"{run.pk}-{tool}-{next(_keys)}",
        target_type="user",
        target_id=target_id,
        args=args,
        intent={"reasoning": reasoning or f"Step: {tool}", "confidence": 0.87},
        before_snapshot=before,
        compensation=compensation,
    ).action
    ledger.action_start(action=action, actor=agent)
    if fail or unknown:
        recovery.action_fail_and_queue(
            action=action,
            actor=agent,
            error=fail or "timed out",
            retryable=True,
            layer="tool",
            outcome_unknown=unknown,
        )
    else:
        ledger.action_succeed(action=action, actor=agent, result={"ok": True}, after_snapshot=after)
    action.refresh_from_db()
    return action


def onboarding_run(
    tenant: Tenant,
    agent: Actor,
    *,
    name: str = "Ashu Kumar",
    email: str = "ashu@company.com",
    extra_actions: int = 0,
) -> tuple[Run, RecoveryItem]:
    """The onboarding saga of the design notes, failing at step 3 (the welcome e-mail)."""
    load_policies()
    run = ledger.run_create(
        tenant=tenant,
        actor=agent,
        agent="onboarding-agent",
        request=f"Onboard new hire {name} ({email})",
        external_id=f"hire-{email}",
        user_id="hr-portal",
        goal="Account, licence and welcome mail",
        trace_url="https://traces.example.com/t/123",
    )
    _do(
        run,
        agent,
        "hr.create_user",
        target_id=email,
        args={"name": name, "email": email},
        compensation={"tool": "hr.delete_user", "args": {"email": email}},
        before=None,
        after={"email": email, "status": "active"},
        reasoning="The HR ticket asks for an account first.",
    )
    ledger.checkpoint_write(
        run=run,
        actor=agent,
        name="account-created",
        state={"step": 1, "email": email},
        recovery_instructions="Resume at licence provisioning.",
    )
    _do(
        run,
        agent,
        "workspace.provision_license",
        target_id=email,
        args={"sku": "business-standard"},
        compensation={"tool": "workspace.cancel_license", "args": {"email": email}},
        before={"license": None},
        after={"license": "business-standard"},
        reasoning="A paid licence is needed for mail.",
    )
    for i in range(extra_actions):
        _do(
            run,
            agent,
            f"crm.update_contact_{i}",
            target_id=f"contact-{i}",
            args={"field": "owner", "value": i},
            before={"owner": "nobody", "stage": "lead"},
            after={"owner": i, "stage": "lead"},
        )
    failed = _do(
        run,
        agent,
        "email.send_welcome",
        target_id=email,
        args={"template": "welcome"},
        fail="429 rate limited by mail gateway",
    )
    outcome = recovery.run_fail_and_queue(
        run=run, actor=agent, error="email gateway rate-limited", failed_action=failed
    )
    run.refresh_from_db()
    return run, outcome.item


def gated_run(tenant: Tenant, agent: Actor, *, amount: int = 40):
    """A run whose refund waits in the approval inbox."""
    load_policies()
    run = ledger.run_create(
        tenant=tenant, actor=agent, agent="support-agent", request=f"Refund order 7 ({amount} EUR)"
    )
    action = recovery.action_record_gated(
        run=run,
        actor=agent,
        tool="payments.refund",
        idempotency_key=f"refund-{next(_keys)}",
        target_type="order",
        target_id="order-7",
        args={"amount": amount, "currency": "EUR"},
        intent={"reasoning": "Customer was double charged.", "confidence": 0.91},
        before_snapshot={"refunded": 0},
    ).action
    return run, action, action.approvals.get()
