"""Handing an approval over to whoever covers for an away person (``ledger.away``).

What goes to a person in this codebase, and so what an away person's delegate gets instead: an
approval escalated to them by name (a policy's ``escalate_to: <username>``; only that person
decides it once it escalated), and the e-mail that tells them so. An approval escalated to a role
goes to no one person: its members decide it, and an away member's e-mail goes to their delegate
when the delegate holds that role (``recovery.transitions.approvals.escalation_emails``). Before
its deadline an approval is anyone's with the approver role, away or not, so nothing is handed over.

An approval is handed over when it reaches an away person — when it escalates to them while they
are away (``recovery.approval_deadlines.approval_escalate``), or, already escalated to them, at the
moment they set their away (``recovery.actions.away``). Away always begins when it is set, so no
sweep is needed to find approvals to hand over. Handed over, ``escalate_to`` names the delegate,
``delegated_from`` the person it was escalated to, ``delegated_at`` when; the deadline is a fresh
window of the approval's length from the hand-over, reminded half way through. It stays with the
delegate when the away ends; the person it was escalated to may still decide it, away or back.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from ledger.audit import Actor, audit_record
from ledger.away import Cover, cover_for
from ledger.policies.deadlines import is_role
from recovery.models import Approval
from recovery.notifications import outbox
from recovery.transitions.approvals import deadline_window


def _window(approval: Approval, now: datetime) -> None:
    """A fresh window of the approval's length from ``now``, reminded half way through it."""
    timeout_s = approval.timeout_s or int((approval.expires_at - approval.created_at).total_seconds())
    window = deadline_window(now=now, timeout_s=max(1, timeout_s))
    approval.expires_at, approval.remind_at, approval.reminded_at = (
        window["expires_at"],
        window["remind_at"],
        None,
    )


def approval_hand_over(approval: Approval, *, now: datetime, actor: Actor, tell: bool = True) -> Cover | None:
    """Hand a pending approval escalated to an away person over to who covers for them: it then
    waits for the delegate, with a fresh window from ``now``; audited (``approval.delegated``:
    from, to, the chain, until when the person is away, the new deadline) and, with ``tell``, the
    delegate is written to and the channels that take ``approval.escalated`` hear. None (nothing
    changed) when it is not escalated to a person, or that person is present or nobody covers.
    The caller holds the approval's row lock and the transaction."""
    if approval.status != Approval.Status.PENDING or approval.escalated_at is None:
        return None
    named = approval.escalate_to
    if not named or is_role(named):
        return None
    cover = cover_for(tenant_id=approval.tenant_id, username=named, now=now)
    if cover is None:
        return None
    delegate = cover.delegate.get_username()
    # The person it was first escalated to stays on record (and may decide it), unless it now goes
    # back to them: then it comes from whoever hands it over now.
    first = approval.delegated_from or named
    approval.delegated_from = named if first == delegate else first
    approval.escalate_to = delegate
    approval.delegated_at = now
    _window(approval, now)
    approval.save(
        update_fields=[
            "delegated_from",
            "escalate_to",
            "delegated_at",
            "expires_at",
            "remind_at",
            "reminded_at",
        ]
    )
    run = approval.run
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind="approval.delegated",
        subject=approval,
        from_state=approval.status,
        to_state=approval.status,
        reason=f"{named} is away until {cover.until.isoformat()}",
        data={
            "from": named,
            "to": delegate,
            "chain": list(cover.chain),
            "away_until": cover.until.isoformat(),
            "expires_at": approval.expires_at.isoformat(),
        },
    )
    approval.tenant = run.tenant
    if tell:
        email = (cover.delegate.email or "").strip()
        outbox.notify_approval_delegated(
            approval, named=named, until=cover.until, emails=[email] if email else []
        )
    return cover


def approvals_hand_over_for(
    *, tenant_id: int, username: str, actor: Actor, now: datetime | None = None
) -> int:
    """Hand over every pending approval escalated to ``username`` in the tenant (they just set
    their away). Each under its row lock; one decided meanwhile is left alone. How many went. The
    caller holds the transaction."""
    now = now or timezone.now()
    handed = 0
    ids = list(
        Approval.objects.filter(
            tenant_id=tenant_id,
            status=Approval.Status.PENDING,
            escalated_at__isnull=False,
            escalate_to=username,
            expires_at__gt=now,
        )
        .order_by("expires_at")
        .values_list("pk", flat=True)
    )
    for pk in ids:
        approval = (
            Approval.objects.select_for_update(of=("self",))
            .select_related("run__tenant")
            .filter(pk=pk, status=Approval.Status.PENDING, escalate_to=username)
            .first()
        )
        if approval is not None and approval_hand_over(approval, now=now, actor=actor) is not None:
            handed += 1
    return handed
