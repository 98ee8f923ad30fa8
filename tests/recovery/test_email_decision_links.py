"""Approval e-mails that decide: sent by Django's SMTP backend to a real SMTP server on this
machine, read as their recipients read them, their Approve and Reject links followed against the
live server as a person would (tests/support/email_links.py). The attacks on the links are in
tests/security/test_email_link_attacks.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.models import AgentKey, Event
from recovery.models import Approval, ApprovalGrant, EmailLinkUse
from recovery.notifications import outbox
from recovery.transitions.approvals import escalation_emails
from tests.support.email_links import (
    ask_approval,
    browser,
    confirm,
    decisions_recorded,
    deliver_mail,
    email_channel,
    give_address,
    link,
    mail_settings,
    nothing_decided,
    only_mail,
    sign_in,
)
from tests.support.smtp import smtp_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def smtp(settings, live_server):
    with smtp_server() as server:
        mail_settings(settings, server, live_server)
        yield server


def test_an_approver_approves_from_the_email_without_signing_in(smtp, live_server, tenant, agent, bob):
    """Pass: the channel's two addresses get two e-mails: Bob's (his account's address, case
    aside) with his Approve and Reject links, the on-call list's with the inbox's link only. Bob's
    Approve link opens a page with the exact arguments that decides nothing; its button approves,
    as Bob, via e-mail, on the record."""
    give_address(bob, "bob@acme.test")
    email_channel(tenant, "Bob@Acme.test", "oncall@acme.test")
    approval = ask_approval(tenant, agent, risk="medium")
    deliver_mail()

    oncall = only_mail(smtp, "oncall@acme.test")
    assert oncall.links("Approve") == [] and oncall.links("Reject") == []
    assert oncall.links("Open") and "payments.charge" in oncall.message["Subject"]
    mine = only_mail(smtp, "Bob@Acme.test")
    assert mine.recipients == ["Bob@Acme.test"]
    assert '"amount": 48200' in mine.text and "15 minutes" in mine.text
    approve = link(mine, "Approve")
    assert approve.startswith(f"{live_server.url}/approvals/email/") and link(mine, "Reject") != approve

    with browser() as client:
        page = client.get(approve)
        assert page.status_code == 200 and "Confirm: approve these arguments" in page.text
        assert "&quot;amount&quot;: 48200" in page.text and "Deciding as <strong>bob</strong>" in page.text
        nothing_decided(approval)  # opening it decided nothing

        done = confirm(client, approve, note="invoice checked")
    assert done.status_code == 200 and 'data-done="approved"' in done.text
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by == bob
    assert approval.approved_args == {"amount": 48200, "currency": "EUR"}
    event = Event.objects.get(subject_id=approval.pk, kind="approval.approved")
    assert (event.actor_type, event.actor_label) == ("user", "bob")
    assert event.reason == "Approved via e-mail by bob: invoice checked"
    assert event.data["via"] == "email"
    assert EmailLinkUse.objects.filter(approval=approval, user=bob, decision="approve").count() == 1


def test_above_the_risk_threshold_the_link_signs_in_first_and_comes_back(
    smtp, live_server, tenant, agent, bob
):
    """Pass: at high risk (above the default medium), Bob's Reject link sends him to sign in,
    with the page as where to go next; signed in, he is back on it, and its button rejects."""
    give_address(bob, "bob@acme.test")
    email_channel(tenant, "bob@acme.test")
    approval = ask_approval(tenant, agent, risk="high")
    deliver_mail()
    mine = only_mail(smtp, "bob@acme.test")
    assert "after you sign in" in mine.text
    reject = link(mine, "Reject")

    with browser() as client:
        first = client.get(reject)
        assert first.status_code == 302 and first.headers["Location"].startswith(
            "/login/?next=/approvals/email/"
        )
        nothing_decided(approval)
        back = sign_in(client, live_server.url, first, "bob")
        assert back.status_code == 302 and reject.endswith(back.headers["Location"])
        done = confirm(client, reject)
    assert done.status_code == 200 and 'data-done="rejected"' in done.text
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED and approval.decided_by == bob
    event = Event.objects.get(subject_id=approval.pk, kind="approval.rejected")
    assert event.reason == "Rejected via e-mail by bob" and event.data["via"] == "email"


def test_two_people_approve_from_their_own_emails_and_each_counts_once(smtp, tenant, agent, bob, dave):
    """Pass: an approval that needs two people: Bob's link grants (audited approval.granted, via
    e-mail) and leaves it pending; Dave's (an admin) approves it."""
    give_address(bob, "bob@acme.test")
    give_address(dave, "dave@acme.test")
    email_channel(tenant, "bob@acme.test", "dave@acme.test")
    approval = ask_approval(tenant, agent, risk="low", approvers=2)
    deliver_mail()

    with browser() as client:
        first = confirm(client, link(only_mail(smtp, "bob@acme.test"), "Approve"))
    assert first.status_code == 200 and "Your grant is recorded" in first.text
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    granted = Event.objects.get(subject_id=approval.pk, kind="approval.granted")
    assert granted.data["via"] == "email" and granted.actor_label == "bob"

    with browser() as client:
        second = confirm(client, link(only_mail(smtp, "dave@acme.test"), "Approve"))
    assert second.status_code == 200 and 'data-done="approved"' in second.text
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert sorted(ApprovalGrant.objects.filter(approval=approval).values_list("label", flat=True)) == [
        "bob",
        "dave",
    ]
    assert decisions_recorded(approval) == ["approval.granted", "approval.approved"]


def test_whoever_asked_may_reject_from_the_email_but_never_approve(smtp, tenant, agent, bob):
    """Pass: the agent's key belongs to Bob, so Bob asked: his Approve link is refused (403, self
    approval, audited as a refused decision via e-mail) and his Reject link rejects."""
    AgentKey.objects.filter(pk=agent.key.pk).update(owner=bob)
    give_address(bob, "bob@acme.test")
    email_channel(tenant, "bob@acme.test")
    approval = ask_approval(tenant, agent)
    deliver_mail()
    mine = only_mail(smtp, "bob@acme.test")

    with browser() as client:
        refused = confirm(client, link(mine, "Approve"))
        assert refused.status_code == 403 and "Not decided: You cannot grant approval" in refused.text
        approval.refresh_from_db()
        assert approval.status == Approval.Status.PENDING and decisions_recorded(approval) == []
        refusal = Event.objects.get(subject_id=approval.pk, kind="decision.refused")
        assert refusal.data["code"] == "self_approval" and refusal.data["via"] == "email"

        rejected = confirm(client, link(mine, "Reject"))
    assert rejected.status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED


def test_an_escalation_mails_its_new_approvers_links_and_only_they_decide(smtp, tenant, agent, bob, dave):
    """Pass: escalated to the tenant's admins, the approval's escalation e-mail goes to Dave (an
    admin) with links; his approves. Bob's link from the first e-mail is refused (403
    approval_escalated) and decides nothing."""
    give_address(bob, "bob@acme.test")
    give_address(dave, "dave@acme.test")
    email_channel(tenant, "bob@acme.test")
    approval = ask_approval(tenant, agent)
    deliver_mail()
    bobs = link(only_mail(smtp, "bob@acme.test"), "Approve")

    Approval.objects.filter(pk=approval.pk).update(
        escalate_to="admin", escalated_at=timezone.now(), expires_at=timezone.now() + timedelta(hours=1)
    )
    approval.refresh_from_db()
    assert escalation_emails(approval) == ["dave@acme.test"]
    outbox.notify_approval_escalated(approval, missed=timezone.now(), emails=escalation_emails(approval))
    deliver_mail()

    with browser() as client:
        refused = confirm(client, bobs)
    assert refused.status_code == 403 and "escalated" in refused.text
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and decisions_recorded(approval) == []

    with browser() as client:
        done = confirm(client, link(only_mail(smtp, "dave@acme.test"), "Approve"))
    assert done.status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by == dave


def test_links_off_and_people_who_may_not_decide_get_the_inbox_link_only(
    smtp, settings, tenant, agent, bob, carol
):
    """Pass: Carol (a viewer) gets no decision links for her address; with
    SAGA_EMAIL_LINK_TTL_MIN=0 nobody does, Bob included."""
    give_address(bob, "bob@acme.test")
    give_address(carol, "carol@acme.test")
    email_channel(tenant, "bob@acme.test", "carol@acme.test")
    ask_approval(tenant, agent, key="pay-1")
    deliver_mail()
    carols = only_mail(smtp, "carol@acme.test")
    assert carols.links("Approve") == [] and carols.links("Open")
    assert only_mail(smtp, "bob@acme.test").links("Approve")

    settings.SAGA = {**settings.SAGA, "EMAIL_LINK_TTL_MIN": 0}
    ask_approval(tenant, agent, key="pay-2")
    deliver_mail()
    (_, second) = smtp.wait_for_mail_to("bob@acme.test", count=2)
    assert second.links("Approve") == [] and second.links("Open")
    assert second.recipients == ["bob@acme.test", "carol@acme.test"]  # one e-mail, as before
    nothing_decided(Approval.objects.order_by("-expires_at").first())
