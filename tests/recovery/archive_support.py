"""What the retention tests share: the key, an allowed archive folder, a tenant's retention loaded
through the policy loader, and closed runs with something of every kind (actions, a checkpoint, a
decided approval, a resolved recovery item), aged past the window."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.utils import timezone

from ledger.audit import Actor
from ledger.models import Run, Tenant
from recovery.actions.approvals import action_record_gated, approval_reject
from recovery.actions.reports import run_fail_and_queue
from recovery.actions.resolutions import item_close
from tests.factories import load_onboarding_policies, load_policy_file, onboarding_saga

KEY = "test-archive-key-0123456789abcdef"
OPERATOR = Actor.system("tests")


def allow(settings: Any, *urls: str) -> None:
    settings.SAGA = {**settings.SAGA, "ARCHIVE_ALLOWED_URLS": list(urls)}


def retention(tenant: Tenant | None, archive: str, window: str = "1d", *, agent_safety: bool = False) -> None:
    if agent_safety:
        load_policy_file(
            {"agentSafety": {"audit": {"retention": {"closedRuns": window, "archive": archive}}}},
            tenant=tenant,
        )
    else:
        load_policy_file({"audit": {"retention": {"closed_runs": window, "archive": archive}}}, tenant=tenant)


def closed_run(tenant: Tenant, agent: Actor, *, email: str = "ashu@company.com") -> Run:
    """The onboarding saga (two actions done, a checkpoint, the welcome mail failed), a refund
    asked for and rejected, the run failed into the queue and its item closed: a closed run."""
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent, email=email, fail_run=False)
    refund = action_record_gated(
        run=saga.run,
        actor=agent,
        tool="payments.refund",
        idempotency_key=f"refund-{saga.run.pk}",
        target_type="order",
        target_id="order-7",
        args={"amount": 40, "currency": "EUR", "note": "ünïcode ✓", "ratio": 0.1, "big": 10**20},
        intent={"reasoning": "Customer was double charged.", "confidence": 0.91},
    ).action
    approval_reject(approval=refund.approvals.get(), actor=OPERATOR, reason="not this time")
    outcome = run_fail_and_queue(run=saga.run, actor=agent, error="email gateway rate-limited")
    assert outcome.item is not None
    item_close(item=outcome.item, actor=OPERATOR, reason="handled by hand")
    saga.run.refresh_from_db()
    assert saga.run.status == Run.Status.CLOSED
    return saga.run


def age(run: Run, days: float = 2) -> Run:
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=days))
    run.refresh_from_db()
    return run


def folder_url(path: Path) -> str:
    return f"file://{path}"


def verify_archive(url: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("verify_audit", archive=url, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()
