"""Someone covers for you (docs/OPERATIONS.md, "Away: someone covers for you"): an approver away
until a moment names a delegate; an approval escalated to them by name goes to the delegate with a
fresh deadline counted from the hand-over and says so, and the e-mail reaches the delegate; an
approval already escalated to them goes when they set it. A delegate is another active approver
or admin of the same tenant; loops are refused, chains end at the first person present; the
self-approval rule holds for the delegate; away ends by itself; everything is audited."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.utils import timezone

from infra import errors
from ledger import away as ledger_away
from ledger.audit import Actor
from ledger.models import Event, Membership, ToolPolicy
from recovery.actions import away as away_actions
from recovery.actions.approvals import approval_approve, approval_reject
from recovery.actions.periodic import approvals_expire
from recovery.models import Approval, Notification
from recovery.notifications.delivery import notification_deliver
from recovery.transitions.approvals import escalation_approver
from tests.factories import gated_run, issue_key, load_onboarding_policies, member

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT_S = 600


def _escalating_to(name: str, **fields: Any) -> None:
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(
        approval_timeout_s=TIMEOUT_S, on_timeout="escalate", escalate_to=name, **fields
    )


def _person(tenant, username: str, role: str = "approver", email: str = ""):
    user = member(tenant, username, role)
    user.email = email or f"{username}@acme.example"
    user.save(update_fields=["email"])
    return user


def _away(user, tenant, delegate, *, now=None, days: float = 3):
    now = now or timezone.now()
    return away_actions.away_set(
        user=user,
        tenant=tenant,
        until=now + timedelta(days=days),
        delegate=delegate,
        actor=Actor.for_user(user),
        now=now,
    )


def _events(kind: str, **filters: Any) -> list[Event]:
    return list(Event.objects.filter(kind=kind, **filters).order_by("id"))


def test_an_escalation_to_an_away_approver_goes_to_their_delegate_from_the_hand_over(tenant, agent):
    _escalating_to("ann")
    ann, ben, other = _person(tenant, "ann"), _person(tenant, "ben"), _person(tenant, "olga")
    _away(ann, tenant, ben)
    _run, _action, approval = gated_run(tenant, agent)
    handed_at = approval.expires_at + timedelta(seconds=7)

    approvals_expire(now=handed_at)
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.escalated_at == handed_at
    assert (approval.escalate_to, approval.delegated_from, approval.delegated_at) == ("ben", "ann", handed_at)
    # A fresh deadline of the approval's own length, counted from the hand-over; reminded half way.
    assert approval.expires_at == handed_at + timedelta(seconds=TIMEOUT_S)
    assert approval.remind_at == handed_at + timedelta(seconds=TIMEOUT_S / 2)
    [escalated] = _events("approval.escalated", subject_id=approval.pk)
    assert escalated.data["escalate_to"] == "ann"
    [delegated] = _events("approval.delegated", subject_id=approval.pk)
    assert delegated.data["from"] == "ann" and delegated.data["to"] == "ben"
    assert delegated.data["chain"] == ["ann", "ben"]
    assert delegated.data["expires_at"] == approval.expires_at.isoformat()

    # The e-mail goes to the delegate, not to the away person; the message says it was delegated.
    [told] = Notification.objects.filter(subject_id=approval.pk, env_target=Notification.PEOPLE)
    assert told.context["recipients"] == ["ben@acme.example"]
    assert told.body["summary"].startswith("Escalated to ben (delegate of ann, away until")
    assert any(line.startswith("Delegated from ann to ben at") for line in told.context["lines"])
    mail.outbox.clear()
    assert notification_deliver(notification_id=told.pk) == "delivered"
    [message] = mail.outbox
    assert message.to == ["ben@acme.example"] and "Delegated from ann to ben" in message.body

    # Who decides: the delegate, and the away person if they choose; nobody else.
    assert escalation_approver(approval, Actor.for_user(ben))
    assert escalation_approver(approval, Actor.for_user(ann))
    assert not escalation_approver(approval, Actor.for_user(other))
    with pytest.raises(errors.Forbidden) as refused:
        approval_approve(approval=approval, actor=Actor.for_user(other), reason="not mine")
    assert refused.value.code == "approval_escalated"
    decided = approval_approve(approval=approval, actor=Actor.for_user(ben), reason="covering for ann")
    assert decided.status == "approved"


def test_the_away_person_may_still_decide_what_went_to_their_delegate(tenant, agent):
    _escalating_to("ann")
    ann, ben = _person(tenant, "ann"), _person(tenant, "ben")
    _away(ann, tenant, ben)
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)
    decided = approval_reject(approval=approval, actor=Actor.for_user(ann), reason="looked at it anyway")
    assert decided.status == "rejected"


def test_an_approval_already_escalated_goes_when_its_person_sets_away(tenant, agent):
    _escalating_to("ann")
    ann, ben = _person(tenant, "ann"), _person(tenant, "ben")
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)
    approval.refresh_from_db()
    assert approval.escalate_to == "ann" and not approval.delegated_from
    old_deadline = approval.expires_at
    # The reminder of ann's window went out already.
    Approval.objects.filter(pk=approval.pk).update(reminded_at=timezone.now())

    assert approval.escalated_at is not None
    set_at = approval.escalated_at + timedelta(seconds=60)
    done = _away(ann, tenant, ben, now=set_at)
    assert done.handed_over == 1
    approval.refresh_from_db()
    assert (approval.escalate_to, approval.delegated_from, approval.delegated_at) == ("ben", "ann", set_at)
    assert approval.expires_at == set_at + timedelta(seconds=TIMEOUT_S) > old_deadline
    assert approval.reminded_at is None
    [delegated] = _events("approval.delegated", subject_id=approval.pk)
    assert delegated.actor_label == "ann" and delegated.data["to"] == "ben"
    [told] = [
        row
        for row in Notification.objects.filter(subject_id=approval.pk, env_target=Notification.PEOPLE)
        if row.body["summary"].startswith("Delegated")
    ]
    assert told.context["recipients"] == ["ben@acme.example"]
    assert told.body["summary"].startswith("Delegated to ben: ann is away until")

    # Setting away again hands over nothing more (it is ben's already).
    assert _away(ann, tenant, ben, now=set_at).handed_over == 0
    # ann back, ben away naming her: it goes back to ann, from ben.
    away_actions.away_clear(user=ann, tenant=tenant, actor=Actor.for_user(ann), now=set_at)
    assert _away(ben, tenant, ann, now=set_at + timedelta(seconds=5)).handed_over == 1
    approval.refresh_from_db()
    assert (approval.escalate_to, approval.delegated_from) == ("ann", "ben")
    # The old deadline is no deadline any more; the new one expires it.
    assert approvals_expire(now=old_deadline + timedelta(seconds=1)) == 0
    assert approvals_expire(now=approval.expires_at) == 1


def test_a_role_escalation_writes_to_an_away_member_through_their_delegate(tenant, agent):
    _escalating_to("admin")
    ann = _person(tenant, "ann", "admin")
    zed = _person(tenant, "zed", "admin")
    ben = _person(tenant, "ben", "approver")
    _person(tenant, "ada", "admin")
    _away(ann, tenant, zed)
    # ada is away too, but her delegate cannot decide what went to admins: she is still written to.
    ada = get_user_model().objects.get(username="ada")
    _away(ada, tenant, ben)
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)
    approval.refresh_from_db()
    # A role is nobody's in particular: nothing is handed over.
    assert approval.escalate_to == "admin" and not approval.delegated_from
    [told] = Notification.objects.filter(subject_id=approval.pk, env_target=Notification.PEOPLE)
    assert told.context["recipients"] == ["ada@acme.example", "zed@acme.example"]


def test_a_loop_is_refused_and_changes_nothing(tenant):
    ann, ben, cat = _person(tenant, "ann"), _person(tenant, "ben"), _person(tenant, "cat")
    _away(ann, tenant, ben)
    before = Event.objects.count()
    with pytest.raises(errors.ValidationFailed) as refused:
        _away(ben, tenant, ann)
    assert refused.value.code == "away_loop" and "loop" in refused.value.message
    assert "ben is away" not in refused.value.message and "ann is away and covered by ben" in (
        refused.value.message
    )
    # Three people: ann → ben → cat, and cat naming ann closes it.
    _away(ben, tenant, cat)
    with pytest.raises(errors.ValidationFailed) as refused:
        _away(cat, tenant, ann)
    assert refused.value.code == "away_loop" and "ben → cat" in refused.value.message
    assert Membership.objects.get(user=cat, tenant=tenant).away_until is None
    assert Event.objects.count() == before + 1  # ben's one away, audited; the refusals wrote nothing


def test_a_chain_goes_to_the_first_person_present_and_stops_at_its_limit(tenant, agent):
    _escalating_to("ann")
    ann, ben, cat = _person(tenant, "ann"), _person(tenant, "ben"), _person(tenant, "cat")
    _away(ben, tenant, cat)
    # ben is away, so his delegate covers: naming him is allowed.
    _away(ann, tenant, ben)
    cover = ledger_away.cover_for(tenant_id=tenant.pk, username="ann")
    assert cover is not None and cover.delegate == cat and cover.chain == ("ann", "ben", "cat")
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)
    approval.refresh_from_db()
    assert (approval.escalate_to, approval.delegated_from) == ("cat", "ann")
    assert _events("approval.delegated", subject_id=approval.pk)[0].data["chain"] == ["ann", "ben", "cat"]

    # A chain longer than CHAIN_MAX covers nobody: it stays with the person it was escalated to.
    people = [_person(tenant, f"p{i}") for i in range(ledger_away.CHAIN_MAX + 2)]
    for this, delegate in reversed(list(zip(people, people[1:], strict=False))):
        _away(this, tenant, delegate)
    assert ledger_away.cover_for(tenant_id=tenant.pk, username="p0") is None
    assert ledger_away.cover_for(tenant_id=tenant.pk, username="p2") is not None
    # However long, a chain back to the one setting it is a loop.
    with pytest.raises(errors.ValidationFailed) as refused:
        _away(people[-1], tenant, people[0])
    assert refused.value.code == "away_loop"
    # A delegate who no longer approves covers nobody either.
    Membership.objects.filter(user=cat, tenant=tenant).update(role="viewer")
    assert ledger_away.cover_for(tenant_id=tenant.pk, username="ann") is None


def test_a_delegate_never_grants_what_they_asked_for(tenant):
    _escalating_to("ann")
    ann, ben = _person(tenant, "ann"), _person(tenant, "ben")
    # ben owns the agent key that asks.
    key, _secret = issue_key(tenant, "bens-agent", "agent", owner=ben)
    _away(ann, tenant, ben)
    _run, _action, approval = gated_run(tenant, Actor.for_key(key))
    approvals_expire(now=approval.expires_at)
    approval.refresh_from_db()
    assert approval.escalate_to == "ben"
    with pytest.raises(errors.SelfApproval):
        approval_approve(approval=approval, actor=Actor.for_user(ben), reason="my own")
    # The away person still may.
    assert approval_approve(approval=approval, actor=Actor.for_user(ann), reason="ok").status == "approved"


def test_two_grants_through_a_delegation_are_two_people_and_one_person_counts_once(tenant, agent):
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(approvers=2)
    ann, ben = _person(tenant, "ann"), _person(tenant, "ben")
    _away(ann, tenant, ben)
    _run, _action, approval = gated_run(tenant, agent)
    assert approval.approvers_required == 2
    assert approval_approve(approval=approval, actor=Actor.for_user(ann), reason="one").status == "pending"
    with pytest.raises(errors.AlreadyGranted):
        approval_approve(approval=approval, actor=Actor.for_user(ann), reason="again")
    assert approval_approve(approval=approval, actor=Actor.for_user(ben), reason="two").status == "approved"


def test_away_ends_by_itself_at_its_time(tenant, agent):
    _escalating_to("ann")
    ann, ben = _person(tenant, "ann"), _person(tenant, "ben")
    now = timezone.now()
    _away(ann, tenant, ben, now=now, days=1 / 24)
    assert ledger_away.cover_for(tenant_id=tenant.pk, username="ann", now=now + timedelta(minutes=59))
    assert ledger_away.cover_for(tenant_id=tenant.pk, username="ann", now=now + timedelta(hours=1)) is None
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=now + timedelta(hours=2))
    approval.refresh_from_db()
    assert approval.escalate_to == "ann" and not approval.delegated_from
    assert not _events("approval.delegated", subject_id=approval.pk)


def test_setting_and_clearing_an_away_is_audited(tenant):
    ann, ben, cat = _person(tenant, "ann"), _person(tenant, "ben"), _person(tenant, "cat")
    now = timezone.now()
    _away(ann, tenant, ben, now=now, days=2)
    [first] = _events("membership.away_set")
    assert first.actor_label == "ann"
    assert first.data == {
        "user": "ann",
        "away_until": (now + timedelta(days=2)).isoformat(),
        "delegate": "ben",
    }
    _away(ann, tenant, cat, now=now, days=4)
    second = _events("membership.away_set")[1]
    assert second.data["delegate"] == "cat" and second.data["replaces"]["delegate"] == "ben"
    assert away_actions.away_clear(user=ann, tenant=tenant, actor=Actor.for_user(ann)) is True
    [cleared] = _events("membership.away_cleared")
    assert cleared.data["was"]["delegate"] == "cat"
    assert Membership.objects.get(user=ann, tenant=tenant).away_until is None
    # Not away: nothing to clear, nothing audited.
    assert away_actions.away_clear(user=ann, tenant=tenant, actor=Actor.for_user(ann)) is False
    assert len(_events("membership.away_cleared")) == 1


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("past", "away_past"),
        ("too_far", "away_too_far"),
        ("self", "away_self"),
        ("another_account", "away_self"),
        ("viewer", "away_not_approver"),
        ("operator", "away_not_approver"),
        ("other_tenant", "away_not_approver"),
        ("deactivated", "away_not_approver"),
    ],
)
def test_a_bad_away_is_refused_with_what_is_wrong(tenant, other_tenant, case, code):
    ann = _person(tenant, "ann", email="ann@acme.example")
    now = timezone.now()
    until, delegate = now + timedelta(days=1), _person(tenant, "ben")
    if case == "past":
        until = now - timedelta(minutes=1)
    elif case == "too_far":
        until = now + ledger_away.AWAY_MAX + timedelta(minutes=1)
    elif case == "self":
        delegate = ann
    elif case == "another_account":
        delegate = _person(tenant, "ann-sso", email="ANN@acme.example")
    elif case in ("viewer", "operator"):
        delegate = _person(tenant, f"a-{case}", case)
    elif case == "other_tenant":
        delegate = _person(other_tenant, "globex-approver")
    elif case == "deactivated":
        delegate.is_active = False
        delegate.save(update_fields=["is_active"])
    before = Event.objects.count()
    with pytest.raises(errors.ValidationFailed) as refused:
        away_actions.away_set(
            user=ann, tenant=tenant, until=until, delegate=delegate, actor=Actor.for_user(ann), now=now
        )
    assert refused.value.code == code and refused.value.status == 422
    assert Membership.objects.get(user=ann, tenant=tenant).away_until is None
    assert Event.objects.count() == before


def test_only_an_approver_sets_an_away(tenant, other_tenant):
    ben = _person(tenant, "ben")
    for role in ("viewer", "operator"):
        someone = _person(tenant, f"a-{role}", role)
        with pytest.raises(errors.Forbidden) as refused:
            _away(someone, tenant, ben)
        assert refused.value.code == "forbidden"
    # An admin of another tenant sets nothing here, not even naming one of its approvers.
    outsider = _person(other_tenant, "globex-admin", "admin")
    with pytest.raises(errors.Forbidden):
        _away(outsider, tenant, ben)
    assert not Membership.objects.filter(tenant=tenant, away_until__isnull=False).exists()
