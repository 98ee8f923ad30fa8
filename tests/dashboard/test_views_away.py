"""The away page and what the inbox shows of aways: an approver sets until when they are away and
who covers (the tenant's other approvers to choose from), comes back; the inbox says so to them and
to their delegate, and a delegated card says from whom. Bad input is the page again with what is
wrong (422 or 403), nothing changed; another tenant is never reached."""

from __future__ import annotations

import json
from datetime import UTC, timedelta

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger.models import Event, Membership, ToolPolicy
from recovery.actions.periodic import approvals_expire
from tests.factories import gated_run, load_onboarding_policies, member

pytestmark = pytest.mark.django_db

URL = "/away/"


def _until(**delta: float) -> str:
    return (timezone.now() + timedelta(**delta)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_an_approver_sets_away_and_the_inbox_says_so_to_them_and_their_delegate(client, tenant, bob, carol):
    assert reverse("dashboard:away") == URL
    erin = member(tenant, "erin", "approver")
    member(tenant, "adam", "admin")
    client.force_login(bob)
    page = client.get(URL).content.decode()
    # The tenant's other approvers and admins to choose from; not a viewer, not bob himself.
    assert '<option value="erin">' in page and '<option value="adam">' in page
    assert 'value="carol"' not in page and 'value="bob"' not in page
    assert "Away? Choose who covers for you" in client.get("/approvals/").content.decode()

    until = _until(days=2)
    done = client.post(URL, {"tenant": tenant.pk, "away_until": until, "delegate": "erin"})
    assert done.status_code == 303 and done["Location"] == "/approvals/"
    shown = until.replace("T", " ")
    assert any(
        f"You are away from acme until {shown} UTC; approvals escalated to you go to erin." in m
        for m in _messages(done)
    )
    membership = Membership.objects.get(user=bob, tenant=tenant)
    assert membership.away_delegate == erin and membership.away_until is not None
    [event] = Event.objects.filter(kind="membership.away_set")
    assert event.actor_label == "bob" and event.data["delegate"] == "erin"

    inbox = client.get("/approvals/").content.decode()
    assert f"You are away from acme until {shown} UTC; approvals escalated to you go to erin." in inbox
    client.force_login(erin)
    inbox = client.get("/approvals/").content.decode()
    assert f"You cover for bob in acme until {shown} UTC" in inbox
    client.force_login(carol)
    assert "data-away-note" not in client.get("/approvals/").content.decode()

    # Back early: the banner goes, audited.
    client.force_login(bob)
    back = client.post(URL, {"tenant": tenant.pk, "back": "1"})
    assert back.status_code == 303
    assert Membership.objects.get(user=bob, tenant=tenant).away_until is None
    assert Event.objects.filter(kind="membership.away_cleared", actor_label="bob").count() == 1
    assert "data-away-note" not in client.get("/approvals/").content.decode()


def test_a_delegated_card_says_from_whom_and_the_delegate_decides_it(client, tenant, agent, bob, dave):
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(
        approval_timeout_s=600, on_timeout="escalate", escalate_to="bob"
    )
    erin = member(tenant, "erin", "approver")
    client.force_login(bob)
    until = _until(days=1)
    assert client.post(URL, {"tenant": tenant.pk, "away_until": until, "delegate": "erin"}).status_code == 303
    _run, _action, approval = gated_run(tenant, agent)
    approvals_expire(now=approval.expires_at)

    client.force_login(erin)
    page = client.get("/approvals/").content.decode()
    assert f"Delegated from bob (away until {until.replace('T', ' ')} UTC) to erin at" in page
    assert f'action="/approvals/{approval.pk}/approve"' in page
    # Dave (an admin, neither bob nor his delegate) reads it and cannot decide it.
    client.force_login(dave)
    page = client.get("/approvals/").content.decode()
    assert "it went to erin (covering for bob, who may decide it too): only they decide it now." in page
    assert f'action="/approvals/{approval.pk}/approve"' not in page
    client.force_login(erin)
    decided = client.post(
        f"/approvals/{approval.pk}/approve",
        {
            f"{approval.pk}-reason": "covering for bob",
            f"{approval.pk}-shown_args_hash": approval.args_hash,
            f"{approval.pk}-args": json.dumps(approval.args),
        },
    )
    assert decided.status_code == 303
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == erin


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("past", "away until must be in the future."),
        ("too_far", "away until may be at most 90 days ahead"),
        ("self", "you cannot cover for yourself"),
        ("viewer", "carol is not an active approver or admin of acme"),
        ("other_tenant", "globex-approver is not an active approver or admin of acme"),
        ("nobody", "no-such-user is not an active approver or admin of acme"),
        ("bad_date", "Away until: not a date and time."),
        ("no_delegate", "Choose who covers for you."),
        ("other_tenant_id", "Choose one of the tenants you approve in."),
    ],
)
def test_bad_input_is_the_page_again_with_what_is_wrong(client, tenant, other_tenant, bob, carol, case, said):
    member(tenant, "erin", "approver")
    member(other_tenant, "globex-approver", "approver")
    body = {"tenant": tenant.pk, "away_until": _until(days=1), "delegate": "erin"}
    if case == "past":
        body["away_until"] = _until(minutes=-5)
    elif case == "too_far":
        body["away_until"] = _until(days=91)
    elif case == "self":
        body["delegate"] = "bob"
    elif case == "viewer":
        body["delegate"] = "carol"
    elif case == "other_tenant":
        body["delegate"] = "globex-approver"
    elif case == "nobody":
        body["delegate"] = "no-such-user"
    elif case == "bad_date":
        body["away_until"] = "next tuesday"
    elif case == "no_delegate":
        body["delegate"] = ""
    elif case == "other_tenant_id":
        body["tenant"] = other_tenant.pk
    client.force_login(bob)
    before = Event.objects.count()
    refused = client.post(URL, body)
    assert refused.status_code == 422
    assert said in refused.content.decode()
    assert not Membership.objects.filter(away_until__isnull=False).exists()
    assert Event.objects.count() == before


@pytest.mark.parametrize("hostile", ["<script>x</script>", "x" * 5000, "' OR 1=1 --", "\x00"])
def test_hostile_values_are_refused_never_a_500(client, tenant, bob, hostile):
    client.force_login(bob)
    for body in (
        {"tenant": hostile, "away_until": _until(days=1), "delegate": "erin"},
        {"tenant": tenant.pk, "away_until": hostile, "delegate": "erin"},
        {"tenant": tenant.pk, "away_until": _until(days=1), "delegate": hostile},
        {"tenant": hostile, "back": "1"},
    ):
        response = client.post(URL, body)
        assert response.status_code == 422, body
        assert "<script>x</script>" not in response.content.decode()


def test_who_may_not_set_an_away(client, tenant, other_tenant, alice, carol):
    member(tenant, "erin", "approver")
    body = {"tenant": tenant.pk, "away_until": _until(days=1), "delegate": "erin"}
    # A viewer or an operator approves nothing: 403.
    for person in (carol, alice):
        client.force_login(person)
        assert client.post(URL, body).status_code == 403
        assert "does not approve in any tenant" in client.get(URL).content.decode()
    # An admin of another tenant reaches no tenant of Acme's: neither set there, nor naming Acme's people.
    outsider = member(other_tenant, "globex-admin", "admin")
    member(other_tenant, "globex-approver", "approver")
    client.force_login(outsider)
    refused = client.post(URL, body)
    assert (
        refused.status_code == 422 and "Choose one of the tenants you approve in." in refused.content.decode()
    )
    refused = client.post(URL, {**body, "tenant": other_tenant.pk})
    assert refused.status_code == 422
    assert "erin is not an active approver or admin of globex" in refused.content.decode()
    assert client.post(URL, {"tenant": tenant.pk, "back": "1"}).status_code == 422
    assert not Membership.objects.filter(away_until__isnull=False).exists()
    # Signed out: the login page.
    client.logout()
    assert client.post(URL, body).status_code == 302


def test_the_form_needs_its_csrf_token(tenant, bob):
    member(tenant, "erin", "approver")
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    body = {"tenant": tenant.pk, "away_until": _until(days=1), "delegate": "erin"}
    assert client.post(URL, body).status_code == 403
    assert not Membership.objects.filter(away_until__isnull=False).exists()
    page = client.get(URL).content.decode()
    token = page.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    assert client.post(URL, {**body, "csrfmiddlewaretoken": token}).status_code == 303


def test_the_django_admin_shows_an_away_and_never_edits_it(admin_client, tenant, bob):
    member(tenant, "erin", "approver")
    membership = Membership.objects.get(user=bob, tenant=tenant)
    page = admin_client.get(f"/admin/ledger/membership/{membership.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Away until" in html and 'name="away_until"' not in html and 'name="away_delegate"' not in html
