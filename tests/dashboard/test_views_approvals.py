from __future__ import annotations

import json
import re

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from infra.hashing import sha256_hex
from ledger.audit import Actor
from ledger.models import Action
from recovery.actions.compensations import unwind_start
from recovery.models import Approval
from recovery.unwinds.advance import unwind_advance_move
from tests.factories import gated_run, onboarding_run

pytestmark = pytest.mark.django_db

INBOX = reverse("dashboard:approvals")


def _post(client, approval, decision, data, **kwargs):
    return client.post(reverse(f"dashboard:approval-{decision}", args=[approval.pk]), data, **kwargs)


def _approve_data(approval, reason="checked the order", args=None):
    return {
        f"{approval.pk}-reason": reason,
        f"{approval.pk}-shown_args_hash": approval.args_hash,
        f"{approval.pk}-args": json.dumps(approval.args if args is None else args),
    }


def test_the_inbox_shows_the_exact_preview(client, approval, bob):
    client.force_login(bob)
    response = client.get(INBOX)
    body = response.content.decode()
    assert response.status_code == 200
    for text in (
        "payments.refund",
        "order-7",
        "&quot;amount&quot;: 40",
        "Customer was double charged.",
        "91%",
        "expires in",
        "High",
        "Forward action",
        "Reason to approve",
        "Reason to reject",
    ):
        assert text in body, text
    assert approval.args_hash in body


def test_the_nav_badge_counts_pending_approvals(client, approval, carol):
    client.force_login(carol)
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert 'aria-label="1 pending"' in body


def test_viewers_and_operators_see_no_decision_forms(client, approval, alice, carol):
    for user in (alice, carol):
        client.force_login(user)
        body = client.get(INBOX).content.decode()
        assert "payments.refund" in body
        assert reverse("dashboard:approval-approve", args=[approval.pk]) not in body


def test_outsiders_see_nothing(client, approval, mallory):
    client.force_login(mallory)
    assert "payments.refund" not in client.get(INBOX).content.decode()
    assert _post(client, approval, "approve", _approve_data(approval)).status_code == 404


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_only_approvers_and_admins_decide(client, approval, decision, alice, carol):
    for user in (alice, carol):
        client.force_login(user)
        data = _approve_data(approval) if decision == "approve" else {f"{approval.pk}-reject-reason": "no"}
        assert _post(client, approval, decision, data).status_code == 403
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_an_approver_approves_with_a_reason(client, approval, bob):
    client.force_login(bob)
    response = _post(client, approval, "approve", _approve_data(approval))
    assert response.status_code == 303 and response["Location"] == INBOX
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by == bob
    assert approval.action.__class__.objects.get(pk=approval.action_id).status == Action.Status.APPROVED


def test_an_admin_approves_with_edited_args(client, approval, dave):
    client.force_login(dave)
    _post(client, approval, "approve", _approve_data(approval, args={"amount": 30, "currency": "EUR"}))
    approval.refresh_from_db()
    assert approval.approved_args == {"amount": 30, "currency": "EUR"}


def test_invalid_json_is_refused_with_a_message(client, approval, bob):
    client.force_login(bob)
    data = {**_approve_data(approval), f"{approval.pk}-args": "{amount: 30"}
    response = _post(client, approval, "approve", data)
    assert any("Not valid JSON" in str(m) for m in get_messages(response.wsgi_request))
    response = _post(client, approval, "approve", data, headers={"HX-Request": "true"})
    assert response.status_code == 409 and "Not valid JSON" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_changed_args_since_shown_are_refused(client, approval, bob):
    client.force_login(bob)
    data = {**_approve_data(approval), f"{approval.pk}-shown_args_hash": sha256_hex({"amount": 1})}
    response = _post(client, approval, "approve", data)
    assert any("changed since they were shown" in str(m) for m in get_messages(response.wsgi_request))


def test_the_reason_is_required(client, approval, bob):
    client.force_login(bob)
    response = _post(client, approval, "reject", {f"{approval.pk}-reject-reason": ""})
    assert any("A reason is required" in str(m) for m in get_messages(response.wsgi_request))
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING


def test_an_approver_rejects_over_htmx_and_gets_the_decided_card(client, approval, bob):
    client.force_login(bob)
    response = _post(
        client,
        approval,
        "reject",
        {f"{approval.pk}-reject-reason": "not a double charge"},
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert "Rejected" in body and "not a double charge" in body
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED


def test_deciding_twice_is_a_message(client, approval, bob, dave):
    client.force_login(bob)
    _post(client, approval, "reject", {f"{approval.pk}-reject-reason": "no"})
    client.force_login(dave)
    response = _post(client, approval, "approve", _approve_data(approval))
    assert response.status_code == 303
    assert any("rejected" in str(m) for m in get_messages(response.wsgi_request))


def test_whoever_asked_cannot_grant_it_and_is_told_so(client, tenant, agent, dave, settings):
    """Dave (admin) decided the compensation of a low-risk action; he cannot approve its step,
    whatever the risk: the inbox shows him why instead of an approve form, and a hand-made POST is
    refused with that message (and audited). He may still reject it."""
    from ledger.models import Event, ToolPolicy

    run, item = onboarding_run(tenant, agent)
    ToolPolicy.objects.filter(tool="workspace.cancel_license").update(risk="low", approval="manual")
    unwind = unwind_start(item=item, actor=Actor.for_user(dave), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)
    client.force_login(dave)
    page = client.get(INBOX).content.decode()
    assert "Compensation step" in page and "You asked for this, so a second person must approve it" in page
    assert reverse("dashboard:approval-approve", args=[approval.pk]) not in page
    assert reverse("dashboard:approval-reject", args=[approval.pk]) in page
    response = _post(client, approval, "approve", _approve_data(approval))
    assert any("second person" in str(m) for m in get_messages(response.wsgi_request))
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert Event.objects.filter(run=run, kind="decision.refused", data__code="self_approval").count() == 1
    _post(client, approval, "reject", {f"{approval.pk}-reject-reason": "wrong licence"})
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED


def test_the_inbox_query_count_is_flat(client, tenant, agent, bob, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    gated_run(tenant, agent)
    client.force_login(bob)
    client.get(INBOX)
    with CaptureQueriesContext(connection) as baseline:
        client.get(INBOX)
    for amount in range(5):
        gated_run(tenant, agent, amount=amount + 1)
    with django_assert_max_num_queries(len(baseline.captured_queries)):
        client.get(INBOX)


def test_the_inbox_shows_a_page_of_cards_and_the_rest_on_demand(client, tenant, agent, bob, monkeypatch):
    from dashboard.selectors import inbox

    monkeypatch.setattr(inbox, "APPROVALS_PAGE", 2)
    approvals = [gated_run(tenant, agent, amount=10 + i)[2] for i in range(5)]
    client.force_login(bob)
    seen: list[str] = []
    response = client.get(INBOX)
    seen += [card["approval"].pk for card in response.context["cards"]]
    cursor = response.context["next_cursor"]
    assert len(seen) == 2 and cursor and "Show more approvals" in response.content.decode()
    while cursor:
        # htmx fetches only the next cards, appended in place of the "show more" link.
        more = client.get(
            INBOX, {"cursor": cursor}, headers={"HX-Request": "true", "HX-Target": "approvals-more"}
        )
        body = more.content.decode()
        assert more.status_code == 200 and "<html" not in body and "data-approval" in body
        seen += re.findall(r'<article [^>]*id="approval-([^"]+)"', body)
        found = re.search(r'hx-get="[^"]*\?cursor=([^"]+)"', body)
        cursor = found.group(1) if found else ""
    # Oldest first, every pending approval exactly once.
    assert seen == [a.pk for a in approvals]
    # Without JavaScript the link is a whole page of the next cards.
    page_two = client.get(INBOX, {"cursor": response.context["next_cursor"]})
    assert "<html" in page_two.content.decode() and len(page_two.context["cards"]) == 2
    # A tampered cursor shows the first page rather than an error.
    assert client.get(INBOX, {"cursor": "not-a-cursor"}).status_code == 200
