"""Approve where people are: Approve / Reject pressed in Slack, answered at
``POST /integrations/slack/interactions``. Signed requests from a mapped approver decide, through
the dashboard's own services; everything else is refused and changes nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from urllib.parse import urlencode

import django_rq
import pytest
from django.test import Client
from rq import SimpleWorker
from slack_sdk.models.blocks import Block

from ledger.audit import Actor
from ledger.models import Action, Event
from recovery.actions import channels
from recovery.models import Approval, Notification
from recovery.notifications.delivery import slack_respond
from tests.factories import gated_run
from tests.support.receivers import Receiver, serve_receiver
from tests.support.slack import clear_slack_counters, link_slack_user

URL = "/integrations/slack/interactions"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0ACME"


@pytest.fixture
def response_url() -> Iterator[Receiver]:
    """Slack's side: the response_url the message updates and refusals are posted to."""
    with serve_receiver() as server:
        yield server


@pytest.fixture
def slack_acme(tenant, dave, bob, alice, response_url, settings):
    """Acme uses the installation's Slack app (its secret the operator's, so a press decides);
    Bob (approver) and Alice (operator) are mapped Slack users."""
    settings.SAGA = {
        **settings.SAGA,
        "OUTBOUND_ALLOWED_HOSTS": [response_url.host],
        "PUBLIC_URL": "https://saga.test",
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
    }
    channels.slack_app_use_installation(tenant=tenant, actor=Actor.system("manage.py slack_app"))
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    link_slack_user(tenant=tenant, user=alice, team_id=TEAM, slack_user_id="UALICE")
    queue = django_rq.get_queue("notifications")
    queue.empty()
    clear_slack_counters()
    yield response_url
    queue.empty()
    clear_slack_counters()


def _payload(
    approval: Approval, *, user: str = "UBOB", action: str = "saga_approve", tenant: str = "acme", **extra
):
    # What the message's buttons carry: Approve is bound to the hash of the arguments shown.
    value = (
        f"{tenant}/{approval.pk}/{approval.args_hash}"
        if action == "saga_approve"
        else f"{tenant}/{approval.pk}"
    )
    payload = {
        "type": "block_actions",
        "team": {"id": TEAM, "domain": "acme"},
        "user": {"id": user, "username": user.lower(), "team_id": TEAM},
        "response_url": extra.pop("response_url"),
        "actions": [{"action_id": action, "type": "button", "value": value, "action_ts": "1.2"}],
    }
    payload.update(extra)
    return payload


def _sign(body: bytes, *, secret: str = SIGNING_SECRET, at: int | None = None) -> dict[str, str]:
    # Slack's v0 scheme, written out here rather than borrowed from the code under test.
    timestamp = str(at if at is not None else int(time.time()))
    digest = hmac.new(secret.encode(), b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": f"v0={digest}"}


def _press(payload: object, *, headers: dict[str, str] | None = None, raw: bytes | None = None, **sign):
    body = raw if raw is not None else urlencode({"payload": json.dumps(payload)}).encode()
    return Client().post(
        URL,
        data=body,
        content_type="application/x-www-form-urlencoded",
        headers=headers if headers is not None else _sign(body, **sign),
    )


def _answers(receiver: Receiver) -> list[dict]:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)
    return [r.json for r in receiver.received]


def _unchanged(approval: Approval) -> None:
    current = Approval.objects.get(pk=approval.pk)
    assert current.status == Approval.Status.PENDING and current.decided_by_id is None
    assert Action.objects.get(pk=current.action_id).status == Action.Status.AWAITING_APPROVAL


# --- Decisions -------------------------------------------------------------------------------


def test_a_signed_press_by_a_mapped_approver_approves_and_updates_the_message(tenant, agent, bob, slack_acme):
    _run, action, approval = gated_run(tenant, agent)
    response = _press(_payload(approval, response_url=slack_acme.url("/actions/1")))
    assert response.status_code == 200

    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by == bob
    assert "in Slack by bob" in approval.reason
    assert Action.objects.get(pk=action.pk).status == Action.Status.APPROVED
    assert (
        Event.objects.filter(kind="approval.approved", subject_id=approval.pk, actor_label="bob").count() == 1
    )
    [answer] = _answers(slack_acme)
    assert answer["replace_original"] is True and "Approved by bob" in answer["text"]
    assert "payments.refund" in answer["text"]
    assert not any(b["type"] == "actions" for b in answer["blocks"])  # the buttons are gone


def test_one_press_of_two_needed_keeps_the_buttons_for_the_second_approver(
    tenant, agent, bob, dave, slack_acme
):
    _run, action, approval = gated_run(tenant, agent)
    Approval.objects.filter(pk=approval.pk).update(approvers_required=2)
    link_slack_user(tenant=tenant, user=dave, team_id=TEAM, slack_user_id="UDAVE")
    assert _press(_payload(approval, response_url=slack_acme.url())).status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and approval.grants.count() == 1
    [answer] = _answers(slack_acme)
    assert answer["replace_original"] is True
    assert "1 of 2 approvers (bob) so far" in json.dumps(answer["blocks"])
    [buttons] = [b for b in answer["blocks"] if b["type"] == "actions"]
    assert {e.get("action_id") for e in buttons["elements"]} >= {"saga_approve", "saga_reject"}

    # Bob again counts once; Dave is the second person.
    assert _press(_payload(approval, response_url=slack_acme.url())).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    assert _press(_payload(approval, user="UDAVE", response_url=slack_acme.url())).status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert Action.objects.get(pk=action.pk).status == Action.Status.APPROVED


def test_reject_in_slack_rejects(tenant, agent, bob, slack_acme):
    _run, action, approval = gated_run(tenant, agent)
    assert _press(_payload(approval, action="saga_reject", response_url=slack_acme.url())).status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED and approval.decided_by == bob
    assert Action.objects.get(pk=action.pk).status == Action.Status.REJECTED
    [answer] = _answers(slack_acme)
    assert "Rejected by bob" in answer["text"]


def test_the_approval_message_carries_buttons_once_a_slack_app_is_connected(
    tenant, agent, dave, slack_acme, django_capture_on_commit_callbacks
):
    channels.channel_create(
        tenant=tenant,
        actor=Actor.for_user(dave),
        name="#approvals",
        kind="slack",
        target=slack_acme.url("/hook"),
    )
    with django_capture_on_commit_callbacks(execute=True):
        _run, _action, approval = gated_run(tenant, agent)
    [message] = _answers(slack_acme)
    for block in message["blocks"]:
        Block.parse(block).validate_json()
    buttons = {
        e.get("action_id", "link"): e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
    }
    assert buttons["saga_approve"]["value"] == f"acme/{approval.pk}/{approval.args_hash}"
    assert buttons["saga_reject"]["value"] == f"acme/{approval.pk}"
    assert buttons["link"]["url"] == f"https://saga.test/approvals/#approval-{approval.pk}"
    assert "To edit them" in json.dumps(message["blocks"])  # args editing stays in the dashboard
    assert Notification.objects.get(event="approval.requested").status == "delivered"


# --- Refused: nothing changes ----------------------------------------------------------------


@pytest.mark.parametrize(
    "tamper",
    [
        "bad signature",
        "stale timestamp",
        "future timestamp",
        "another secret",
        "no headers",
        "unknown tenant",
    ],
)
def test_an_unverified_press_is_refused_with_401(tenant, agent, slack_acme, tamper):
    _run, _action, approval = gated_run(tenant, agent)
    payload = _payload(
        approval, response_url=slack_acme.url(), tenant="nope" if tamper == "unknown tenant" else "acme"
    )
    body = urlencode({"payload": json.dumps(payload)}).encode()
    headers = _sign(body)
    if tamper == "bad signature":
        headers["X-Slack-Signature"] = "v0=" + "0" * 64
    elif tamper == "stale timestamp":
        headers = _sign(body, at=int(time.time()) - 6 * 60)
    elif tamper == "future timestamp":
        headers = _sign(body, at=int(time.time()) + 6 * 60)
    elif tamper == "another secret":
        headers = _sign(body, secret="globex-signing-secret-0000000000")
    elif tamper == "no headers":
        headers = {}
    response = _press(None, raw=body, headers=headers)
    assert response.status_code == 401
    _unchanged(approval)
    assert _answers(slack_acme) == []


def test_a_tampered_body_fails_the_signature(tenant, agent, slack_acme):
    _run, _action, approval = gated_run(tenant, agent)
    body = urlencode({"payload": json.dumps(_payload(approval, response_url=slack_acme.url()))}).encode()
    headers = _sign(body)
    forged = body.replace(b"UBOB", b"UALI")  # who pressed, changed in transit
    assert _press(None, raw=forged, headers=headers).status_code == 401
    _unchanged(approval)


@pytest.mark.parametrize(
    ("user", "refusal"),
    [
        ("UNOBODY", "not linked to a Saga Admin user of Acme Corp"),
        ("UALICE", "alice does not hold the approver role"),
    ],
)
def test_an_unmapped_or_non_approver_slack_user_is_refused(tenant, agent, slack_acme, user, refusal):
    _run, _action, approval = gated_run(tenant, agent)
    assert _press(_payload(approval, user=user, response_url=slack_acme.url())).status_code == 200
    _unchanged(approval)
    [answer] = _answers(slack_acme)
    assert answer["response_type"] == "ephemeral" and answer["replace_original"] is False
    assert refusal in answer["text"] and "nothing was decided" in answer["text"]


def test_whoever_asked_cannot_grant_it_from_slack(tenant, agent, bob, slack_acme):
    _run, _action, approval = gated_run(tenant, agent)
    # Bob asked for it (as an operator deciding a compensation would): four eyes hold in Slack too.
    Approval.objects.filter(pk=approval.pk).update(requested_by=bob)
    assert _press(_payload(approval, response_url=slack_acme.url())).status_code == 200
    _unchanged(approval)
    [answer] = _answers(slack_acme)
    assert "cannot grant" in answer["text"] and answer["response_type"] == "ephemeral"


def test_a_replayed_press_decides_nothing_twice(tenant, agent, slack_acme):
    _run, _action, approval = gated_run(tenant, agent)
    body = urlencode({"payload": json.dumps(_payload(approval, response_url=slack_acme.url()))}).encode()
    headers = _sign(body)
    assert _press(None, raw=body, headers=headers).status_code == 200
    # The same signed request again, and then as a reject: the approval is decided once.
    assert _press(None, raw=body, headers=headers).status_code == 200
    reject = urlencode(
        {"payload": json.dumps(_payload(approval, action="saga_reject", response_url=slack_acme.url()))}
    ).encode()
    assert _press(None, raw=reject).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.APPROVED
    assert Event.objects.filter(kind="approval.approved", subject_id=approval.pk).count() == 1
    first, *refusals = _answers(slack_acme)
    assert "Approved by bob" in first["text"]
    assert len(refusals) == 2 and all(r["response_type"] == "ephemeral" for r in refusals)


def test_another_tenants_approval_is_not_found(tenant, other_tenant, agent, outsider_key, slack_acme):
    _run, _action, theirs = gated_run(other_tenant, Actor.for_key(outsider_key[0]))
    # Signed with Acme's secret, naming Acme, carrying Globex's approval id.
    assert _press(_payload(theirs, response_url=slack_acme.url())).status_code == 200
    assert Approval.objects.get(pk=theirs.pk).status == Approval.Status.PENDING
    [answer] = _answers(slack_acme)
    assert "no such approval" in answer["text"]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"payload=not-json",
        b"payload=%5B1%2C2%5D",
        b"payload=%7B%22type%22%3A%22view_submission%22%7D",
        urlencode(
            {"payload": json.dumps({"type": "block_actions", "actions": [{"action_id": "x"}]})}
        ).encode(),
        urlencode(
            {"payload": json.dumps({"type": "block_actions", "team": {"id": 1}, "user": {}, "actions": []})}
        ).encode(),
        b"\xff\xfe\x00garbage",
    ],
)
def test_a_malformed_request_is_a_400_never_a_500(tenant, slack_acme, raw):
    response = _press(None, raw=raw, headers=_sign(raw))
    assert response.status_code == 400


def test_odd_headers_and_methods_are_refused_cleanly(tenant, agent, slack_acme):
    _run, _action, approval = gated_run(tenant, agent)
    body = urlencode({"payload": json.dumps(_payload(approval, response_url=slack_acme.url()))}).encode()
    for timestamp in ("abc", "1" * 40, "-5", ""):
        headers = {**_sign(body), "X-Slack-Request-Timestamp": timestamp}
        assert _press(None, raw=body, headers=headers).status_code == 401
    assert Client().get(URL).status_code == 405
    _unchanged(approval)


def test_a_response_url_that_is_not_allowed_is_not_called(tenant, agent, bob, slack_acme, settings):
    _run, _action, approval = gated_run(tenant, agent)
    assert (
        _press(_payload(approval, response_url="http://169.254.169.254/latest/meta-data")).status_code == 200
    )
    # The decision stands (the signature checked out); the answer goes nowhere internal.
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.APPROVED
    assert slack_respond(response_url="http://169.254.169.254/x", message={}) is False
