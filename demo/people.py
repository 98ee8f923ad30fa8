"""What people do while the demo agents work: an approver releasing a charge from the inbox, a
support lead editing a ticket in the CRM by hand, the COO correcting a job title in the HR system.
The agents only speak HTTP; people act where people act (the dashboard's services, the CRM's and
the HR system's own screens), so these call services directly.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import close_old_connections, transaction

from demo import services as world
from ledger.audit import Actor
from recovery.actions.approvals import approval_approve
from recovery.models import Approval
from recovery.transitions.approvals import pending_q


def approve_when_asked(
    *, run_id: str, username: str, reason: str, timeout_s: float = 30.0
) -> threading.Thread:
    """In the background, approve the run's first pending approval as ``username`` (the approver
    working the inbox while the agent waits on it)."""

    def work() -> None:
        try:
            approver = get_user_model().objects.get(username=username)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                approval = Approval.objects.filter(pending_q(), run_id=run_id).first()
                if approval is not None:
                    approval_approve(approval=approval, actor=Actor.for_user(approver), reason=reason)
                    return
                time.sleep(0.2)
        finally:
            # This thread opened its own database connection; leave none behind.
            close_old_connections()

    thread = threading.Thread(target=work, name=f"approver-{username}", daemon=True)
    thread.start()
    return thread


@transaction.atomic
def person_edits_ticket(*, ticket_id: str, by: str, changes: dict[str, Any]) -> None:
    """Someone changes a ticket in the CRM's own screen, outside any agent run."""
    result = world.ticket_update(ticket_id=ticket_id, changes=changes, by=by)
    if not result.ok:
        raise RuntimeError(f"{by} could not edit {ticket_id}: {result.body}")


@transaction.atomic
def person_edits_hr_record(*, email: str, by: str, changes: dict[str, Any]) -> None:
    """Someone changes a person's record in the HR system's own screen, outside any agent run."""
    result = world.hr_user_edit_by_person(email=email, who=by, **changes)
    if not result.ok:
        raise RuntimeError(f"{by} could not edit {email}: {result.body}")
