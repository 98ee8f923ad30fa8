"""Approval deadlines per policy (API.md, "Approval deadlines per policy"), driven by the sweep with
an explicit ``now``: a timeout rejects (the approval ``expired`` with reason ``timed_out``, the action
``rejected``), or escalates once to ``escalate_to`` with a fresh deadline and then rejects; the
reminder goes out once per window, the escalation once, however many sweepers run at once; an
approval decided just as it times out is decided or timed out, never both; a compensation step's
approval keeps the deadline of the compensating tool's policy. Each step is audited and announced,
and shown on the inbox card, in the API and in the Slack message's lines."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Event, ToolPolicy
from recovery import approval_deadlines, slack, sweeper
from recovery.actions.approvals import approval_approve, approval_reject
from recovery.actions.compensations import unwind_start
from recovery.actions.periodic import approvals_expire
from recovery.models import Approval, Notification, NotificationChannel, UnwindStep
from recovery.unwinds.advance import unwind_advance_move
from tests.factories import gated_run, load_onboarding_policies, onboarding_saga
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db(transaction=True)


def _refund_deadline(**fields: Any) -> None:
    """The onboarding policies, payments.refund with this deadline (as load_policies stores it)."""
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(**fields)


def _channel(tenant) -> NotificationChannel:
    return NotificationChannel.objects.create(
        tenant=tenant,
        name="approvers",
        kind=NotificationChannel.Kind.WEBHOOK,
        target="https://hooks.example/saga",
    )


def _together(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once, each in its own thread and connection; their results (or errors)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[index] = call()
        except Exception as exc:  # the outcome under test
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _events(approval: Approval, kind: str) -> list[Event]:
    return list(Event.objects.filter(subject_id=approval.pk, kind=kind))


def test_a_timeout_rejects_the_action_and_the_agent_sees_timed_out(tenant, agent, agent_key):
    _refund_deadline(approval_timeout_s=30)
    channel = _channel(tenant)
    _run, action, approval = gated_run(tenant, agent)
    assert (approval.timeout_s, approval.on_timeout, approval.escalate_to) == (30, "reject", "")
    assert approval.expires_at - approval.created_at == pytest.approx(
        timedelta(seconds=30), abs=timedelta(seconds=1)
    )

    # Not yet due: nothing happens.
    assert approvals_expire(now=approval.expires_at - timedelta(seconds=1)) == 0
    assert approvals_expire(now=approval.expires_at) == 1
    approval.refresh_from_db()
    action.refresh_from_db()
    assert (approval.status, approval.reason) == ("expired", "timed_out")
    assert action.status == Action.Status.REJECTED and action.error.startswith("timed_out")
    [expired] = _events(approval, "approval.expired")
    assert expired.actor_label.endswith("approval-deadline") and expired.data["reason"] == "timed_out"
    [announced] = Notification.objects.filter(channel=channel, event="approval.expired")
    assert "Timed out" in announced.body["summary"] and announced.subject_id == approval.pk
    # A second sweep finds nothing more to do, and a late decision is refused.
    assert approvals_expire(now=approval.expires_at + timedelta(minutes=1)) == 0
    with pytest.raises(errors.InvalidTransition):
        approval_reject(approval=approval, actor=Actor.for_user(_approver(tenant)), reason="late")

    shown = Api(agent_key[1]).get(f"/actions/{action.pk}").json()
    assert shown["status"] == "rejected"
    assert {
        k: shown["approval"][k] for k in ("status", "reason", "on_timeout", "escalate_to", "escalated_at")
    } == {
        "status": "expired",
        "reason": "timed_out",
        "on_timeout": "reject",
        "escalate_to": None,
        "escalated_at": None,
    }
    # Starting it is refused as any rejection is.
    refused = Api(agent_key[1]).post(
        f"/actions/{action.pk}/start", {}, headers={"Idempotency-Key": "start-after-timeout"}
    )
    assert refused.status_code == 409 and error_of(refused)["code"] == "approval_rejected"


def _approver(tenant):
    from tests.factories import member

    return member(tenant, "approver-on-call", "approver")


def test_escalation_goes_once_to_the_named_role_and_a_second_timeout_rejects(
    tenant, agent, bob, dave, client
):
    _refund_deadline(approval_timeout_s=600, on_timeout="escalate", escalate_to="admin")
    channel = _channel(tenant)
    _run, action, approval = gated_run(tenant, agent)
    deadline = approval.expires_at

    # Two sweepers reach the deadline together: one escalates, and the new approvers hear once.
    results = _together(*[lambda: approvals_expire(now=deadline + timedelta(seconds=2))] * 2)
    assert results == [0, 0]
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.escalated_at is not None
    assert approval.expires_at == pytest.approx(
        deadline + timedelta(seconds=602), abs=timedelta(milliseconds=1)
    )
    assert len(_events(approval, "approval.escalated")) == 1
    [told] = Notification.objects.filter(channel=channel, event="approval.escalated")
    assert told.body["summary"].startswith("Escalated to admin")
    assert "Now decided by an admin of the tenant only." in told.context["lines"]

    # Only the role it went to decides now: Bob (approver) is refused, in the inbox too.
    with pytest.raises(errors.Forbidden) as refused:
        approval_approve(approval=approval, actor=Actor.for_user(bob), reason="fine by me")
    assert refused.value.code == "approval_escalated"
    with pytest.raises(errors.Forbidden):
        approval_reject(approval=approval, actor=Actor.for_user(bob), reason="no")
    client.force_login(bob)
    page = client.get("/approvals/").content.decode()
    assert "Escalated to admin" in page and "only they decide it now" in page
    assert f'action="/approvals/{approval.pk}/approve"' not in page
    client.force_login(dave)
    page = client.get("/approvals/").content.decode()
    assert f'action="/approvals/{approval.pk}/approve"' in page
    assert "Escalated to admin" in page and "then it is rejected." in page

    # A later sweep before the fresh deadline changes nothing; at it, the approval expires.
    assert approvals_expire(now=approval.expires_at - timedelta(seconds=1)) == 0
    assert approvals_expire(now=approval.expires_at) == 1
    approval.refresh_from_db()
    action.refresh_from_db()
    assert (approval.status, approval.reason, action.status) == ("expired", "timed_out", "rejected")
    assert len(_events(approval, "approval.escalated")) == 1
    assert _events(approval, "approval.expired")[0].data == {"reason": "timed_out", "escalated_to": "admin"}
    assert Notification.objects.filter(channel=channel, event="approval.escalated").count() == 1
    [expired] = Notification.objects.filter(channel=channel, event="approval.expired")
    assert "escalated to admin first" in expired.body["summary"]


def test_an_escalated_approval_is_granted_by_the_person_it_went_to(tenant, agent, bob, dave):
    _refund_deadline(approval_timeout_s=60, on_timeout="escalate", escalate_to="dave")
    _run, action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)
    with pytest.raises(errors.Forbidden):
        approval_approve(approval=approval, actor=Actor.for_user(bob), reason="ok")
    decided = approval_approve(approval=approval, actor=Actor.for_user(dave), reason="ok, escalated to me")
    action.refresh_from_db()
    assert decided.status == "approved" and action.status == Action.Status.APPROVED
    # Decided: its deadline is over, whatever the sweep says later.
    assert approvals_expire(now=decided.expires_at + timedelta(hours=1)) == 0


def test_the_reminder_goes_once_in_each_window(tenant, agent):
    _refund_deadline(approval_timeout_s=3600, on_timeout="escalate", escalate_to="admin")
    channel = _channel(tenant)
    _run, _action, approval = gated_run(tenant, agent)
    start = approval.created_at

    assert sweeper.notifications_sweep(now=start + timedelta(minutes=29)).reminders == 0
    # Half way through: two sweepers at once, one reminds; a third later finds it done.
    results = _together(
        *[lambda: sweeper.notifications_sweep(now=start + timedelta(minutes=31)).reminders] * 2
    )
    assert sorted(results) == [0, 1]
    assert sweeper.notifications_sweep(now=start + timedelta(minutes=50)).reminders == 0
    assert Notification.objects.filter(channel=channel, event="approval.reminder").count() == 1
    assert len(_events(approval, "approval.reminded")) == 1

    # Escalated at the deadline: the new approvers get a reminder of their own, once.
    approvals_expire(now=start + timedelta(minutes=61))
    approval.refresh_from_db()
    assert approval.reminded_at is None
    assert sweeper.notifications_sweep(now=start + timedelta(minutes=80)).reminders == 0
    assert sweeper.notifications_sweep(now=start + timedelta(minutes=92)).reminders == 1
    assert sweeper.notifications_sweep(now=start + timedelta(minutes=100)).reminders == 0
    reminders = list(
        Notification.objects.filter(channel=channel, event="approval.reminder").order_by("created_at")
    )
    assert len(reminders) == 2 and "(escalated to admin)" in reminders[1].body["summary"]
    # Past the deadline, no reminder: the sweep expires it instead.
    assert sweeper.notifications_sweep(now=start + timedelta(minutes=125)).reminders == 0


def test_an_approval_decided_just_as_it_times_out_is_never_both(tenant, agent, bob):
    _refund_deadline(approval_timeout_s=60)
    outcomes = set()
    for _ in range(6):
        _run, action, approval = gated_run(tenant, agent)
        # The deadline lands between the two callers' clocks, whichever runs first.
        Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() + timedelta(milliseconds=30))
        approval.refresh_from_db()
        decided, swept = _together(
            lambda approval=approval: approval_approve(
                approval=approval, actor=Actor.for_user(bob), reason="ok"
            ),
            # The sweep's clock just past the deadline: it expires whatever is still pending. (At
            # exactly the deadline it is not yet due, and an approver whose own clock had passed
            # it on a loaded machine is refused too: neither, until the next sweep.)
            lambda approval=approval: approvals_expire(now=approval.expires_at + timedelta(milliseconds=1)),
        )
        approval.refresh_from_db()
        if approval.status == "pending":
            # Neither, yet: the sweep skipped the row the approver had locked (SKIP LOCKED), and
            # the approver, its own clock past the deadline by then, was refused. The next sweep
            # expires it; still never both.
            assert isinstance(decided, errors.ApprovalExpired | errors.InvalidTransition) and swept == 0
            swept = approvals_expire(now=approval.expires_at + timedelta(milliseconds=1))
            approval.refresh_from_db()
        action.refresh_from_db()
        if approval.status == "approved":
            assert isinstance(decided, Approval) and swept == 0
            assert action.status == Action.Status.APPROVED and not _events(approval, "approval.expired")
        else:
            assert approval.status == "expired" and approval.reason == "timed_out" and swept == 1
            assert isinstance(decided, errors.ApprovalExpired | errors.InvalidTransition)
            assert action.status == Action.Status.REJECTED and not _events(approval, "approval.approved")
        outcomes.add(approval.status)
    assert outcomes <= {"approved", "expired"}


def test_a_compensation_steps_approval_keeps_the_compensating_tools_deadline(tenant, agent, alice):
    load_onboarding_policies(license_risk="critical")
    ToolPolicy.objects.filter(tenant=None, tool="workspace.cancel_license").update(approval_timeout_s=120)
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)
    assert approval.tool == "workspace.cancel_license" and approval.timeout_s == 120
    assert approvals_expire(now=approval.created_at + timedelta(seconds=121)) == 1
    step = UnwindStep.objects.get(pk=approval.step_id)
    assert step.status == UnwindStep.Status.FAILED and "timed_out" in step.error


def test_the_deadline_is_shown_in_the_inbox_and_the_slack_message(tenant, agent, bob, client):
    _refund_deadline(approval_timeout_s=720, on_timeout="escalate", escalate_to="admin")
    channel = _channel(tenant)
    _run, _action, approval = gated_run(tenant, agent)
    client.force_login(bob)
    page = client.get("/approvals/").content.decode()
    words = (
        f"Decide by {approval.expires_at.astimezone(UTC):%H:%M} UTC (in 12 minutes); then it goes to admin."
    )
    assert words in page
    [requested] = Notification.objects.filter(channel=channel, event="approval.requested")
    lines = requested.context["lines"]
    assert words in lines
    message = slack.message(
        summary=requested.body["summary"],
        url=requested.body["url"],
        risk=requested.risk,
        run_id=requested.run_id,
        lines=lines,
        tenant_slug=tenant.slug,
        approval_id=approval.pk,
        args_hash=approval.args_hash,
    )
    assert "then it goes to admin" in str(message["blocks"])


def test_the_reminder_due_list_reads_approvals_asked_before_reminders_were_stored(tenant, agent):
    _refund_deadline(approval_timeout_s=600)
    _run, _action, approval = gated_run(tenant, agent)
    # An approval written by the release before this one: no remind_at.
    Approval.objects.filter(pk=approval.pk).update(remind_at=None)
    assert (
        approval_deadlines.approvals_due_for_reminder(now=approval.created_at + timedelta(seconds=299)) == []
    )
    assert approval_deadlines.approvals_due_for_reminder(
        now=approval.created_at + timedelta(seconds=301)
    ) == [approval.pk]


def test_the_people_an_approval_is_escalated_to_are_written_to_themselves(tenant, agent, bob, dave):
    """Escalated to a role: its active members with an e-mail address get one e-mail (besides the
    channels); a person of another role, one without an address or a deactivated one, none."""
    from django.contrib.auth import get_user_model
    from django.core import mail

    from recovery.notifications.delivery import notification_deliver

    _refund_deadline(approval_timeout_s=60, on_timeout="escalate", escalate_to="admin")
    dave.email, bob.email = "dave@acme.example", "bob@acme.example"
    dave.save(update_fields=["email"])
    bob.save(update_fields=["email"])
    gone = get_user_model().objects.create_user("gone", email="gone@acme.example", is_active=False)
    gone.memberships.create(tenant=tenant, role="admin")
    nameless = get_user_model().objects.create_user("nameless", email="")
    nameless.memberships.create(tenant=tenant, role="admin")
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)

    [told] = Notification.objects.filter(event="approval.escalated", env_target=Notification.PEOPLE)
    assert told.context["recipients"] == ["dave@acme.example"]
    assert told.channel_name == "to an admin of the tenant" and told.kind == "email"
    mail.outbox.clear()
    assert notification_deliver(notification_id=told.pk) == "delivered"
    [message] = mail.outbox
    assert message.to == ["dave@acme.example"] and message.subject.startswith(
        "[Saga Admin] Escalated to admin"
    )
    assert "Now decided by an admin of the tenant only." in message.body

    # Escalated to a person without an address: no e-mail row (the channels still hear).
    _refund_deadline(approval_timeout_s=60, on_timeout="escalate", escalate_to="nameless")
    _run, _action, second = gated_run(tenant, agent)
    approvals_expire(now=second.expires_at)
    second.refresh_from_db()
    assert second.escalated_at is not None
    assert not Notification.objects.filter(subject_id=second.pk, env_target=Notification.PEOPLE).exists()
