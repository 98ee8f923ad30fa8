"""PagerDuty channels (Events API v2) against a local receiver that checks the documented event
shape strictly (tests.support.pagerduty): an approval that escalates or nears its deadline, a
recovery item at or above the channel's minimum risk and undo that got stuck open an incident by a
stable dedup key; an unwind taking the item up, or the first grant of a two-person approval,
acknowledges it; the decision, the expiry or the item's resolution resolves it. 429 and 5xx are
retried, 400 fails with PagerDuty's reason; a test goes through the outbox like the rest; the
routing key is checked when saved and never shown back; the tenant's own endpoint goes through the
outbound guard; Redis down delays an event and loses nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import transaction
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.models import Event, ToolPolicy
from ledger.staff import membership_set
from recovery import approval_deadlines, compensators
from recovery.actions import channels
from recovery.actions.approvals import approval_approve, approval_reject
from recovery.actions.compensations import unwind_start
from recovery.actions.periodic import approvals_expire
from recovery.actions.resolutions import item_close
from recovery.models import Notification, NotificationChannel, UnwindStep
from recovery.notifications.delivery import notification_deliver
from recovery.notifications.outbox import notify
from recovery.unwinds.advance import unwind_advance_move
from recovery.unwinds.claim import step_claim
from recovery.unwinds.runner import step_record_outcome
from tests.factories import gated_run, load_onboarding_policies, onboarding_run, onboarding_saga
from tests.support.pagerduty import PagerDuty, problems, serve_pagerduty
from tests.support.processes import wait_for

pytestmark = pytest.mark.django_db

PUBLIC = "https://saga.example.com"
KEY = "R0123456789abcdefghijklmnopqrstu"  # 32 letters and digits, like an Integration Key
assert len(KEY) == 32


@pytest.fixture
def pagerduty(settings) -> Iterator[PagerDuty]:
    """The receiver as the installation's endpoint (SAGA_PAGERDUTY_EVENTS_URL), links to PUBLIC."""
    with serve_pagerduty() as service:
        settings.SAGA = {
            **settings.SAGA,
            "PAGERDUTY_EVENTS_URL": service.url(),
            "PUBLIC_URL": PUBLIC,
            "NOTIFY_EMAILS": [],
            "NOTIFY_WEBHOOKS": [],
            "RETRY_BACKOFF_BASE_S": 2.0,
            "RETRY_BACKOFF_MAX_S": 60.0,
        }
        yield service


def _admin(dave) -> Actor:
    return Actor.for_user(dave)


def _pd_channel(tenant, dave, **options: Any) -> NotificationChannel:
    return channels.channel_create(
        tenant=tenant,
        actor=_admin(dave),
        name=options.pop("name", "on call"),
        kind="pagerduty",
        target=options.pop("target", ""),
        secret=options.pop("secret", KEY),
        **options,
    ).channel


def _pd_rows(**filters: Any) -> list[Notification]:
    return list(Notification.objects.filter(kind="pagerduty", **filters).order_by("created_at", "id"))


def _deliver_all() -> list[str]:
    """Every PagerDuty row still to send, oldest first, as its worker job would: the outcomes."""
    outcomes = []
    for row in _pd_rows(status="pending"):
        Notification.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
        outcomes.append(notification_deliver(notification_id=row.pk))
    return outcomes


def _actions(service: PagerDuty, dedup_key: str) -> list[str]:
    return [event["event_action"] for event in service.alerts.get(dedup_key, [])]


def _refund_policy(**fields: Any) -> None:
    """The onboarding policies, payments.refund (high risk, manual) changed by ``fields``."""
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(**fields)


# --- The receiver itself: it refuses what the documentation does not allow --------------------


def test_the_receiver_checks_the_documented_shape(pagerduty):
    good = {
        "routing_key": KEY,
        "event_action": "trigger",
        "dedup_key": "saga:acme:item:rec_1",
        "payload": {"summary": "s", "source": "saga.example.com", "severity": "error"},
    }
    assert problems(good) == []
    assert problems({"routing_key": KEY, "event_action": "resolve", "dedup_key": "k"}) == []
    bad = [
        {**good, "routing_key": "short"},
        {**good, "event_action": "page"},
        {**good, "payload": {**good["payload"], "severity": "high"}},
        {**good, "payload": {**good["payload"], "summary": "x" * 1025}},
        {**good, "payload": {"summary": "s", "severity": "info"}},  # no source
        {**good, "payload": {**good["payload"], "timestamp": "yesterday"}},
        {**good, "links": [{"url": "https://x"}]},
        {**good, "surprise": 1},
        {"routing_key": KEY, "event_action": "trigger"},  # no payload
        {"routing_key": KEY, "event_action": "acknowledge"},  # no dedup key
        {"routing_key": KEY, "event_action": "resolve", "dedup_key": "k" * 256},
    ]
    assert all(problems(event) for event in bad)
    answer = httpx.post(pagerduty.url(), json={"routing_key": "short", "event_action": "trigger"})
    assert answer.status_code == 400
    assert answer.json()["status"] == "invalid event" and answer.json()["errors"]
    answer = httpx.post(pagerduty.url(), json=good)
    assert answer.status_code == 202
    assert answer.json() == {
        "status": "success",
        "message": "Event processed",
        "dedup_key": good["dedup_key"],
    }


# --- Approvals ---------------------------------------------------------------------------------


def test_an_escalating_approval_pages_and_resolves_when_it_is_decided(tenant, agent, dave, pagerduty):
    _refund_policy(approval_timeout_s=600, on_timeout="escalate", escalate_to="admin")
    _pd_channel(tenant, dave)
    _run, _action, approval = gated_run(tenant, agent)
    assert _pd_rows() == []  # asking for an approval pages nobody

    approvals_expire(now=approval.expires_at + timedelta(seconds=2))
    [trigger] = _pd_rows()
    assert _deliver_all() == ["delivered"]
    key = f"saga:acme:approval:{approval.pk}"
    assert pagerduty.incidents == {key: "triggered"}
    [event] = pagerduty.accepted()
    assert event["routing_key"] == KEY and event["dedup_key"] == key
    payload = event["payload"]
    assert payload["summary"].startswith("Escalated to admin: approval of payments.refund")
    assert (payload["severity"], payload["source"], payload["group"], payload["class"]) == (
        "error",  # high risk
        "saga.example.com",
        "acme",
        "approval.escalated",
    )
    assert payload["component"] == f"run {approval.run_id}"
    assert payload["custom_details"]["id"] == approval.pk
    assert event["links"] == [
        {"href": f"{PUBLIC}/approvals/#approval-{approval.pk}", "text": "Open in Saga Admin"}
    ]
    assert event["client"] == "Saga Admin" and event["client_url"] == event["links"][0]["href"]
    assert trigger.context["pagerduty"] == {"action": "trigger", "dedup_key": key}

    approval_approve(approval=approval, actor=_admin(dave), reason="fine, escalated to me")
    assert _deliver_all() == ["delivered"]
    assert pagerduty.incidents == {key: "resolved"}
    resolve = pagerduty.accepted()[-1]
    assert resolve == {"routing_key": KEY, "event_action": "resolve", "dedup_key": key}


def test_an_approval_near_its_deadline_pages_at_its_reminder_and_resolves_when_it_expires(
    tenant, agent, dave, pagerduty
):
    _refund_policy(approval_timeout_s=600, on_timeout="reject")
    _pd_channel(tenant, dave, events=["approval.reminder"])
    _run, _action, approval = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=approval.pk, now=approval.remind_at)
    approvals_expire(now=approval.expires_at + timedelta(seconds=1))
    # Written in order (trigger, resolve) and sent in order: the incident opens, then resolves.
    assert [r.context["pagerduty"]["action"] for r in _pd_rows()] == ["trigger", "resolve"]
    assert [r.event for r in _pd_rows()] == ["approval.reminder", "approval.expired"]
    assert _deliver_all() == ["dropped", "delivered"]
    # The reminder was still waiting when the approval expired: it never went out, so nothing
    # opened; the resolve of an incident PagerDuty never had changes nothing.
    key = f"saga:acme:approval:{approval.pk}"
    assert pagerduty.incidents == {} and _actions(pagerduty, key) == []


def test_the_reminder_sent_in_time_is_resolved_by_the_expiry(tenant, agent, dave, pagerduty):
    _refund_policy(approval_timeout_s=600, on_timeout="reject")
    _pd_channel(tenant, dave, events=["approval.reminder"])
    _run, _action, approval = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=approval.pk, now=approval.remind_at)
    assert _deliver_all() == ["delivered"]
    approvals_expire(now=approval.expires_at + timedelta(seconds=1))
    assert _deliver_all() == ["delivered"]
    key = f"saga:acme:approval:{approval.pk}"
    assert pagerduty.incidents == {key: "resolved"} and _actions(pagerduty, key) == ["trigger", "resolve"]


def test_the_first_grant_of_a_two_person_approval_acknowledges_and_the_second_resolves(
    tenant, agent, bob, dave, pagerduty
):
    _refund_policy(approvers=2)
    _pd_channel(tenant, dave)
    _run, _action, approval = gated_run(tenant, agent)
    assert approval.approvers_required == 2
    approval_deadlines.approval_remind(approval_id=approval.pk, now=approval.remind_at)
    assert _deliver_all() == ["delivered"]
    still = approval_approve(approval=approval, actor=Actor.for_user(bob), reason="one of two")
    assert still.status == "pending"
    assert _deliver_all() == ["delivered"]
    key = f"saga:acme:approval:{approval.pk}"
    assert pagerduty.incidents == {key: "acknowledged"}
    approval_approve(approval=approval, actor=_admin(dave), reason="two of two")
    assert _deliver_all() == ["delivered"]
    assert _actions(pagerduty, key) == ["trigger", "acknowledge", "resolve"]
    assert pagerduty.incidents == {key: "resolved"}


def test_a_rejection_resolves_and_an_approval_never_paged_sends_nothing(tenant, agent, bob, dave, pagerduty):
    _pd_channel(tenant, dave)
    _r, _a, paged = gated_run(tenant, agent)
    _r, _a, quiet = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=paged.pk, now=paged.remind_at)
    _deliver_all()
    approval_reject(approval=paged, actor=Actor.for_user(bob), reason="not this one")
    approval_reject(approval=quiet, actor=Actor.for_user(bob), reason="nor this one")
    assert _deliver_all() == ["delivered"]
    assert pagerduty.incidents == {f"saga:acme:approval:{paged.pk}": "resolved"}
    assert not _pd_rows(subject_id=quiet.pk)


# --- Recovery items and stuck undo ---------------------------------------------------------------


def test_a_high_risk_item_pages_is_acknowledged_by_its_unwind_and_resolves_when_closed(
    tenant, agent, alice, bob, dave, pagerduty
):
    _pd_channel(tenant, dave, min_risk="high")
    load_onboarding_policies(license_risk="high")
    saga = onboarding_saga(tenant, agent)
    run, item = saga.run, saga.item
    assert item is not None and item.risk == "high"
    assert _deliver_all() == ["delivered"]
    item_key, undo_key = f"saga:acme:item:{item.pk}", f"saga:acme:run:{run.pk}:undo"
    assert pagerduty.incidents == {item_key: "triggered"}
    [opened] = pagerduty.accepted()
    assert opened["payload"]["severity"] == "error" and opened["payload"]["class"] == "recovery.opened"
    assert opened["links"][0]["href"] == f"{PUBLIC}/runs/{run.pk}/"

    # An unwind takes the item up: acknowledged. Its licence step fails: stuck undo pages on its own.
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the hire")
    assert _deliver_all() == ["delivered"]
    assert pagerduty.incidents == {item_key: "acknowledged"}
    unwind_advance_move(unwind_id=unwind.pk)
    # Undoing a high-risk action needs a person: Bob grants it (an approval nobody was paged about).
    waiting = unwind.steps.get(status=UnwindStep.Status.AWAITING_APPROVAL)
    approval_approve(approval=waiting.approval, actor=Actor.for_user(bob), reason="cancel the licence")
    for outcome in (compensators.Outcome.failed("licence API said no"), compensators.Outcome.done()):
        if not unwind.steps.filter(status=UnwindStep.Status.QUEUED).exists():
            unwind_advance_move(unwind_id=unwind.pk)
        step = unwind.steps.get(status=UnwindStep.Status.QUEUED)
        claim = step_claim(step_id=step.pk)
        assert claim is not None
        step_record_outcome(step_id=step.pk, token=claim.token, outcome=outcome)
    unwind_advance_move(unwind_id=unwind.pk)  # finished with a step left: the item is open again
    _deliver_all()
    assert pagerduty.incidents == {item_key: "acknowledged", undo_key: "triggered"}
    [stuck] = pagerduty.alerts[undo_key]
    assert stuck["payload"]["class"] == "step.failed" and "licence API said no" in json.dumps(stuck)

    item_close(item=item, actor=Actor.for_user(alice), reason="cancelled the licence by hand")
    assert _deliver_all() == ["delivered", "delivered"]
    assert pagerduty.incidents == {item_key: "resolved", undo_key: "resolved"}
    assert _actions(pagerduty, item_key)[-1] == "resolve" and _actions(pagerduty, undo_key)[-1] == "resolve"


def test_an_item_below_the_channels_minimum_risk_pages_nobody(tenant, agent, alice, dave, pagerduty):
    _pd_channel(tenant, dave, min_risk="high")
    _run, item = onboarding_run(tenant, agent)
    assert item.risk == "medium"
    item_close(item=item, actor=Actor.for_user(alice), reason="handled elsewhere")
    assert _pd_rows() == [] and pagerduty.received == []


def test_other_channels_hear_nothing_new(tenant, agent, alice, bob, dave, pagerduty, settings):
    """Every channel that chose no events took every event before PagerDuty came; what follows an
    announced subject (granted, decided, claimed, resolved) is for PagerDuty channels alone."""
    settings.SAGA = {**settings.SAGA, "NOTIFY_WEBHOOKS": ["https://hooks.example/env"]}
    NotificationChannel.objects.create(
        tenant=tenant, name="everything", kind="webhook", target="https://hooks.example/saga"
    )
    run, item = onboarding_run(tenant, agent)
    unwind_start(item=item, actor=Actor.for_user(alice), reason="undo it")
    _r, _a, approval = gated_run(tenant, agent)
    approval_reject(approval=approval, actor=Actor.for_user(bob), reason="no")
    events = set(Notification.objects.values_list("event", flat=True))
    assert events == {"recovery.opened", "approval.requested"}


def test_a_summary_past_pagerdutys_limit_is_cut_and_control_characters_go(tenant, dave, pagerduty):
    _pd_channel(tenant, dave)
    notify(
        tenant=tenant,
        event="recovery.opened",
        subject_id="rec_long",
        run_id="run_long",
        summary="line one\nline two\t" + "x" * 5000,
        path="/runs/run_long/",
        risk="critical",
    )
    assert _deliver_all() == ["delivered"]
    [event] = pagerduty.accepted()
    summary = event["payload"]["summary"]
    assert len(summary) == 1024 and summary.startswith("line one line two xxx")
    assert event["payload"]["severity"] == "critical"


# --- Answers ------------------------------------------------------------------------------------


def test_429_and_500_are_retried_and_400_fails_with_pagerdutys_reason(
    tenant, agent, alice, dave, pagerduty, client
):
    _pd_channel(tenant, dave)
    _r, _a, approval = gated_run(tenant, agent)
    pagerduty.script = [429, 500]
    approval_deadlines.approval_remind(approval_id=approval.pk, now=approval.remind_at)
    [row] = _pd_rows()
    assert _deliver_all() == ["retry"]
    row.refresh_from_db()
    assert (row.status, row.last_status_code) == ("pending", 429)
    assert _deliver_all() == ["retry"]
    assert _deliver_all() == ["delivered"]
    row.refresh_from_db()
    assert [h["status_code"] for h in row.history] == [429, 500, 202]
    assert pagerduty.incidents == {f"saga:acme:approval:{approval.pk}": "triggered"}

    _r, _a, refused = gated_run(tenant, agent)
    pagerduty.script = [400]
    approval_deadlines.approval_remind(approval_id=refused.pk, now=refused.remind_at)
    assert _deliver_all() == ["failed"]
    [row] = _pd_rows(subject_id=refused.pk)
    assert (row.status, row.attempts, row.next_attempt_at) == ("failed", 1, None)
    assert row.last_error == "PagerDuty answered 400: Event object is invalid: scripted refusal"
    client.force_login(alice)
    assert "Event object is invalid: scripted refusal" in client.get("/notifications/").content.decode()


def test_send_a_test_pages_through_the_outbox(tenant, dave, pagerduty, client):
    channel = _pd_channel(tenant, dave)
    client.force_login(dave)
    assert client.post(f"/notifications/channels/{channel.pk}/test").status_code == 303
    [row] = _pd_rows(event="notification.test")
    assert _deliver_all() == ["delivered"]
    [event] = pagerduty.accepted()
    assert event["dedup_key"] == f"saga:acme:test:{channel.pk}"
    assert event["payload"]["severity"] == "info"
    assert event["payload"]["summary"].startswith(f"Test notification for channel {channel.name}")


# --- Settings: the routing key and the endpoint ---------------------------------------------------


def test_a_routing_key_in_a_bad_format_or_a_bad_choice_is_refused_on_save(tenant, dave, pagerduty, client):
    for secret in ("", "short", KEY + "x", KEY[:-1] + "!", f"{KEY[:16]} {KEY[17:]}"):
        with pytest.raises(errors.ValidationFailed) as refused:
            _pd_channel(tenant, dave, secret=secret)
        assert "secret" in refused.value.details["fields"]
        assert "32-character Integration Key" in refused.value.message
    with pytest.raises(errors.ValidationFailed) as refused:
        _pd_channel(tenant, dave, events=["unwind.finished"])
    assert "pages only about" in refused.value.message
    client.force_login(dave)
    page = client.post(
        "/notifications/settings/acme/channels",
        {"name": "on call", "kind": "pagerduty", "target": "", "secret": "not-a-key", "min_risk": "high"},
    )
    assert page.status_code == 422 and "32-character Integration Key" in page.content.decode()
    assert not NotificationChannel.objects.exists()


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("http://169.254.169.254/v2/enqueue", "link-local"),
        ("https://127.0.0.1:6379/", "loopback"),
        ("http://10.0.0.7/v2/enqueue", "private"),
        # A public address, but in clear text: the routing key would cross the network unencrypted.
        ("http://8.8.8.8/v2/enqueue", "clear text"),
        ("ftp://events.pagerduty.com/v2/enqueue", "http(s)"),
    ],
)
def test_a_tenants_own_endpoint_goes_only_where_the_guard_allows(tenant, dave, pagerduty, endpoint, why):
    with pytest.raises(errors.ValidationFailed) as refused:
        _pd_channel(tenant, dave, target=endpoint)
    assert why in refused.value.message and "target" in refused.value.details["fields"]
    assert not NotificationChannel.objects.exists()


def test_an_allowed_endpoint_is_checked_again_before_each_send(tenant, agent, dave, pagerduty, settings):
    settings.SAGA = {
        **settings.SAGA,
        "OUTBOUND_ALLOWED_HOSTS": [pagerduty.host],
        "PAGERDUTY_EVENTS_URL": "https://events.pagerduty.invalid/v2/enqueue",  # not used
    }
    _pd_channel(tenant, dave, target=pagerduty.url())
    _r, _a, approval = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=approval.pk, now=approval.remind_at)
    assert _deliver_all() == ["delivered"] and len(pagerduty.accepted()) == 1
    # The operator withdraws the exception: the next event is refused before it leaves.
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": []}
    approval_reject(approval=approval, actor=_admin(dave), reason="no")
    assert _deliver_all() == ["failed"]
    [row] = _pd_rows(event="approval.decided")
    assert row.last_error.startswith("Refused: URL host 127.0.0.1 is a loopback address")
    assert len(pagerduty.received) == 1


def test_the_routing_key_is_never_shown_back(tenant, dave, pagerduty, client):
    channel = _pd_channel(tenant, dave, min_risk="high")
    client.force_login(dave)
    pages = [
        client.get("/notifications/settings/").content.decode(),
        client.get(f"/notifications/channels/{channel.pk}/edit").content.decode(),
    ]
    assert all(KEY not in page for page in pages)
    assert "the installation&#x27;s endpoint" in pages[0] or "the installation's endpoint" in pages[0]
    # Saved again with the key left blank: kept.
    answer = client.post(
        f"/notifications/channels/{channel.pk}/edit",
        {
            "name": "on call",
            "kind": "pagerduty",
            "target": "",
            "secret": "",
            "min_risk": "critical",
            "enabled": "on",
        },
    )
    assert answer.status_code == 303
    channel.refresh_from_db()
    assert (channel.secret, channel.min_risk) == (KEY, "critical")
    audited = list(Event.objects.filter(kind__startswith="channel.").values_list("data", flat=True))
    assert len(audited) == 2 and KEY not in json.dumps(audited)
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))
    change = f"/admin/recovery/notificationchannel/{channel.pk}/change/"
    for url in ("/admin/recovery/notificationchannel/", change):
        page = client.get(url)
        assert page.status_code == 200 and KEY not in page.content.decode()
    # The Django admin's form, saved with the key left blank, keeps it too.
    saved = client.post(
        change,
        {
            "tenant": tenant.pk,
            "name": "on call",
            "kind": "pagerduty",
            "target": "",
            "secret": "",
            "events": '["recovery.opened"]',
            "min_risk": "high",
            "enabled": "on",
        },
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    channel.refresh_from_db()
    assert (channel.secret, channel.events) == (KEY, ["recovery.opened"])


# --- Redis down when the event happens: delivered after it returns (a real worker) --------------


@pytest.mark.django_db(transaction=True)
def test_an_event_raised_while_redis_is_stopped_pages_after_it_returns(
    tenant, agent, alice, dave, own_redis, start_worker, pagerduty
):
    _pd_channel(tenant, dave)
    own_redis.stop()
    with transaction.atomic():
        run, item = onboarding_run(tenant, agent)  # the enqueue after commit finds no Redis
    [row] = _pd_rows()
    assert (row.status, row.job_id) == ("pending", "")
    own_redis.start()
    worker = start_worker(SAGA_PAGERDUTY_EVENTS_URL=pagerduty.url(), SAGA_PUBLIC_URL=PUBLIC)
    key = f"saga:acme:item:{item.pk}"
    wait_for(
        lambda: pagerduty.incidents.get(key) == "triggered",
        timeout=30,
        what=f"the sweeper's re-enqueue\n{worker.log()[-3000:]}",
    )
    item_close(item=item, actor=Actor.for_user(alice), reason="handled")
    wait_for(lambda: pagerduty.incidents.get(key) == "resolved", timeout=30, what="the resolve")
