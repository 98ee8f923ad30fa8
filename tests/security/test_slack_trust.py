"""Whose secret signs a Slack press decides what the press is.

The attack: a tenant admin sets a signing secret of their own choosing (or connected the app and
so knows the real one), reads off the notification settings which Slack user is which approver,
grants an ``approvers: 2`` approval once as themself and then signs a press as another approver's
Slack user — the approval used to become ``approved`` with two grants, though the other approver
did nothing. Now:

- a press counts as the linked person's decision only on the installation's own Slack app, whose
  secret only the operator holds (``SAGA_SLACK_SIGNING_SECRET``, ``manage.py slack_app
  --installation-app``);
- with a secret a tenant admin set, a press decides nothing: its answer links to a dashboard page
  where the linked person, signed in as themself, confirms it (and nobody else can);
- any change of secret unlinks everyone, audited;
- the settings page shows an admin who is linked, not as which Slack user.

Over real HTTP to the live server, with requests signed as Slack signs them, answers posted by a
real RQ job to a real receiver standing in for Slack's ``response_url``.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode, urlparse

import django_rq
import httpx
import pytest
from django.core.management import call_command
from rq import SimpleWorker

from ledger.audit import Actor
from ledger.models import Event
from ledger.services import runs
from ledger.staff import membership_set
from recovery.actions import channels
from recovery.actions.approvals import action_record_gated, approval_approve
from recovery.models import Approval, SlackUserLink
from tests.factories import charge_policy, gated_run, issue_key, load_policy_file
from tests.support.receivers import Receiver, serve_receiver
from tests.support.slack import clear_slack_counters, link_slack_user, sign

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]

ADMINS_SECRET = "chosen-by-dave-" + secrets.token_hex(12)  # a secret the tenant admin chose
OPERATORS_SECRET = "installation-" + secrets.token_hex(16)
TEAM = "T0ACME"
PASSWORD = "correct-horse-battery"  # tests/conftest.py's personas
INTERACTIONS = "/integrations/slack/interactions"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TWO_FOR_BIG = [{"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approvers": 2}}]


@pytest.fixture
def slack(settings) -> Iterator[Receiver]:
    """Slack's side (the response_url of presses); the installation has an app of its own."""
    with serve_receiver() as receiver:
        settings.SAGA = {
            **settings.SAGA,
            "OUTBOUND_ALLOWED_HOSTS": [receiver.host],
            "PUBLIC_URL": "https://saga.test",
            "SLACK_SIGNING_SECRET": OPERATORS_SECRET,
        }
        queue = django_rq.get_queue("notifications")
        queue.empty()
        clear_slack_counters()
        yield receiver
        queue.empty()
        clear_slack_counters()


def _big_charge(tenant, agent) -> Approval:
    """A 50,000 charge two people must approve."""
    load_policy_file({"policies": [charge_policy(rules=TWO_FOR_BIG)]})
    run = runs.run_create(tenant=tenant, actor=agent, agent="billing", request="Charge ACME-9")
    action = action_record_gated(
        run=run, actor=agent, tool="payments.charge", idempotency_key="big", args={"amount": 50000}
    ).action
    approval = action.approvals.get()
    assert approval.approvers_required == 2
    return approval


def _forged_press(
    live_server, approval: Approval, receiver: Receiver, *, secret: str, user: str, status: int = 200
) -> None:
    """A press as Slack user ``user`` on the approval's Approve button, signed with ``secret``."""
    payload = {
        "type": "block_actions",
        "team": {"id": TEAM, "domain": "acme"},
        "user": {"id": user, "username": user.lower(), "team_id": TEAM},
        "response_url": receiver.url("/respond"),
        "actions": [
            {
                "action_id": "saga_approve",
                "type": "button",
                "value": f"acme/{approval.pk}/{approval.args_hash}",
                "action_ts": "1.2",
            }
        ],
    }
    body = urlencode({"payload": json.dumps(payload)}).encode()
    response = httpx.post(
        f"{live_server.url}{INTERACTIONS}", content=body, headers={**FORM, **sign(body, secret=secret)}
    )
    assert response.status_code == status, response.text


def _answers(receiver: Receiver) -> list[dict[str, Any]]:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)
    return [r.json for r in receiver.received if r.path == "/respond"]


@contextmanager
def _browser(live_server, username: str) -> Iterator[httpx.Client]:
    """A person signed in to the dashboard over HTTP (the login form, CSRF and all)."""
    # The session and CSRF cookies are Secure with DEBUG off: let the test's plain-http jar send them.
    cookies = httpx.Cookies()
    cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(secure_protocols=("https", "wss", "http")))
    client = httpx.Client(base_url=live_server.url, cookies=cookies, timeout=30)
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    signed_in = client.post(
        "/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{client.base_url}login/"},
    )
    assert signed_in.status_code == 302, signed_in.text[:500]
    try:
        yield client
    finally:
        client.close()


def _csrf_post(client: httpx.Client, path: str, data: dict[str, Any]) -> httpx.Response:
    return client.post(
        path,
        data={**data, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{client.base_url}"},
    )


def test_a_tenant_admin_with_a_secret_of_their_own_cannot_grant_as_another_linked_approver(
    live_server, tenant, agent, dave, bob, slack
):
    """The attack, step by step: Dave (admin) sets a secret he chose; Bob linked his Slack account
    himself; Dave grants a two-person approval once as himself, then signs a press as Bob's Slack
    user. Before the fix: approved, with Bob's grant. Now: still pending with Dave's grant only,
    and the answer says the press counts only once Bob confirms it in the dashboard."""
    channels.slack_app_set(tenant=tenant, actor=Actor.for_user(dave), signing_secret=ADMINS_SECRET)
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    approval = _big_charge(tenant, agent)
    assert approval_approve(approval=approval, actor=Actor.for_user(dave), reason="mine").status == "pending"

    _forged_press(live_server, approval, slack, secret=ADMINS_SECRET, user="UBOB")

    current = Approval.objects.get(pk=approval.pk)
    assert current.status == Approval.Status.PENDING and current.decided_by_id is None
    assert list(current.grants.values_list("user__username", flat=True)) == ["dave"]
    [answer] = _answers(slack)
    assert answer["response_type"] == "ephemeral" and answer["replace_original"] is False
    assert "Not decided yet" in answer["text"] and "confirm" in answer["text"]
    assert "/account/slack/confirm/" in answer["text"]


def test_the_same_forgery_does_not_defeat_self_approval(live_server, tenant, dave, bob, slack):
    """Dave owns the agent key that asked; a press he signs as Bob would be the four eyes he
    lacks. It decides nothing."""
    key, _secret = issue_key(tenant, "billing", "agent", owner=dave)  # the admin stands behind the agent
    channels.slack_app_set(tenant=tenant, actor=Actor.for_user(dave), signing_secret=ADMINS_SECRET)
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    _run, _action, approval = gated_run(tenant, Actor.for_key(key))

    _forged_press(live_server, approval, slack, secret=ADMINS_SECRET, user="UBOB")

    current = Approval.objects.get(pk=approval.pk)
    assert current.status == Approval.Status.PENDING and not current.grants.exists()


def test_the_linked_person_confirms_their_press_in_the_dashboard_and_nobody_else_can(
    live_server, tenant, agent, dave, bob, slack
):
    """The press's answer links to a page only Bob, signed in, can use: Dave holding the link
    (he got the answer of the press he forged) is refused; Bob sees the exact arguments and
    confirms, and only then is the approval his."""
    channels.slack_app_set(tenant=tenant, actor=Actor.for_user(dave), signing_secret=ADMINS_SECRET)
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    _run, _action, approval = gated_run(tenant, agent)
    _forged_press(live_server, approval, slack, secret=ADMINS_SECRET, user="UBOB")
    [answer] = _answers(slack)
    link = re.search(r"<(https://saga\.test(/account/slack/confirm/[^|>]+))\|", answer["text"])
    assert link, answer["text"]
    path = urlparse(link.group(1)).path

    with _browser(live_server, "dave") as browser:
        assert browser.get(path).status_code == 403
        assert _csrf_post(browser, path, {}).status_code == 403
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING

    with _browser(live_server, "bob") as browser:
        shown = browser.get(path)
        assert (
            shown.status_code == 200 and "payments.refund" in shown.text and "&quot;EUR&quot;" in shown.text
        )
        confirmed = _csrf_post(browser, path, {})
        assert confirmed.status_code == 303, confirmed.text[:2000]
        # Once only: the approval is decided.
        assert _csrf_post(browser, path, {}).status_code == 409
        assert browser.get(path.replace("/confirm/", "/confirm/x")).status_code == 410  # forged
    decided = Approval.objects.get(pk=approval.pk)
    assert decided.status == Approval.Status.APPROVED and decided.decided_by == bob
    assert "confirmed in the dashboard" in decided.reason and "T0ACME/UBOB" in decided.reason


def test_a_press_on_the_installations_app_decides_at_once(live_server, tenant, agent, bob, slack):
    """The operator's secret: nobody in the tenant can sign with it, so a press is Bob's."""
    call_command("slack_app", tenant="acme", installation_app=True)
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    _run, _action, approval = gated_run(tenant, agent)
    _forged_press(live_server, approval, slack, secret=ADMINS_SECRET, user="UBOB", status=401)
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    _forged_press(live_server, approval, slack, secret=OPERATORS_SECRET, user="UBOB")
    decided = Approval.objects.get(pk=approval.pk)
    assert decided.status == Approval.Status.APPROVED and decided.decided_by == bob


def test_a_rekey_unlinks_everyone_and_audits_it(live_server, tenant, agent, dave, bob, slack):
    """Dave re-keys the installation's app to a secret of his own: Bob's link does not survive
    (nor does it through a disconnect and a reconnect), each change is audited, and a press
    signed with the new secret finds nobody linked."""
    call_command("slack_app", tenant="acme", installation_app=True)
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    with _browser(live_server, "dave") as browser:
        rekeyed = _csrf_post(browser, "/notifications/settings/acme/slack", {"signing_secret": ADMINS_SECRET})
        assert rekeyed.status_code == 303
    assert not SlackUserLink.objects.exists()
    unlinked = Event.objects.get(kind="slack_user.unlinked_all")
    assert unlinked.data["users"] == ["bob"] and unlinked.actor_label == "dave"

    _run, _action, approval = gated_run(tenant, agent)
    _forged_press(live_server, approval, slack, secret=ADMINS_SECRET, user="UBOB")
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    assert "not linked" in _answers(slack)[0]["text"]

    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    channels.slack_app_remove(tenant=tenant, actor=Actor.for_user(dave))
    channels.slack_app_set(tenant=tenant, actor=Actor.for_user(dave), signing_secret=ADMINS_SECRET)
    assert not SlackUserLink.objects.exists()
    assert Event.objects.filter(kind="slack_user.unlinked_all").count() == 2


def test_the_settings_page_shows_an_admin_who_is_linked_not_as_which_slack_user(
    live_server, tenant, dave, bob, slack
):
    channels.slack_app_set(tenant=tenant, actor=Actor.for_user(dave), signing_secret=ADMINS_SECRET)
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))  # staff too
    link = SlackUserLink.objects.get()
    with _browser(live_server, "dave") as browser:
        page = browser.get("/notifications/settings/?tenant=acme").text
        admin_list = browser.get("/admin/recovery/slackuserlink/")
        admin_page = browser.get(f"/admin/recovery/slackuserlink/{link.pk}/change/")
    assert "<td>bob</td>" in page
    assert "UBOB" not in page and TEAM not in page
    assert admin_list.status_code == 200 and "bob" in admin_list.text
    assert admin_page.status_code == 200 and "bob" in admin_page.text
    assert "UBOB" not in admin_list.text + admin_page.text and TEAM not in admin_list.text + admin_page.text
