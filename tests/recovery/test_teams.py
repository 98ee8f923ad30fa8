"""Microsoft Teams channels (a Workflows webhook per tenant, through the outbound guard): each
notification is one Adaptive Card, posted to a local receiver that refuses (400) anything the
official Adaptive Card schema does not accept (``tests.support.teams``), so a broken card fails
its row and the test. An approval's card shows the tool, risk, run, who asked, the arguments and
the deadline, with Approve… / Reject… buttons that open the approval in the inbox with that
decision chosen (a GET decides nothing); reminders, escalations, expiry and the decision post
cards that follow it. The decision (``approval.decided``) goes to the Teams channels that took
the request's card, never to other kinds; "Send a test" works; a URL the guard refuses is refused on
save and before sending; Redis down delays a card and loses nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import django_rq
import httpx
import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from rq import SimpleWorker

from ledger.audit import Actor
from ledger.models import ToolPolicy
from ledger.services import runs
from recovery import approval_deadlines, teams
from recovery.actions import channels
from recovery.actions.approvals import action_record_gated, approval_reject
from recovery.actions.periodic import approvals_expire
from recovery.models import Approval, Notification, NotificationChannel
from tests.factories import gated_run, load_onboarding_policies, onboarding_run
from tests.support.processes import wait_for
from tests.support.receivers import Receiver
from tests.support.teams import buttons, card_problems, card_text, cards, serve_teams

pytestmark = pytest.mark.django_db

PUBLIC = "https://saga.example.com"
SETTINGS_FORM = "/notifications/settings/acme/channels"


@pytest.fixture
def teams_hook() -> Iterator[Receiver]:
    with serve_teams() as server:
        yield server


@pytest.fixture
def outbound_to(settings, teams_hook):
    """The receiver's host:port is allowed (it is on this machine), and links point at PUBLIC."""
    settings.SAGA = {
        **settings.SAGA,
        "OUTBOUND_ALLOWED_HOSTS": [teams_hook.host],
        "PUBLIC_URL": PUBLIC,
        "NOTIFY_EMAILS": [],
        "NOTIFY_WEBHOOKS": [],
    }
    queue = django_rq.get_queue("notifications")
    queue.empty()
    yield teams_hook
    queue.empty()


def _work() -> None:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def _teams(tenant, dave, url: str, **options) -> NotificationChannel:
    return channels.channel_create(
        tenant=tenant,
        actor=Actor.for_user(dave),
        name=options.pop("name", "approvers"),
        kind="teams",
        target=url,
        **options,
    ).channel


def _inbox(approval: Approval, decide: str = "") -> str:
    query = f"?approval={approval.pk}&decide={decide}" if decide else ""
    return f"{PUBLIC}/approvals/{query}#approval-{approval.pk}"


def _path(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


@pytest.mark.django_db(transaction=True)
def test_a_teams_channel_made_in_the_dashboard_gets_the_approval_card_and_its_buttons_open_the_confirmation(
    client, tenant, agent, bob, dave, outbound_to
):
    client.force_login(dave)
    saved = client.post(
        SETTINGS_FORM,
        {
            "name": "approvers",
            "kind": "teams",
            "target": outbound_to.url("/workflows/abc/triggers/manual/paths/invoke?sig=s3cret"),
            "min_risk": "low",
            "enabled": "on",
        },
    )
    assert saved.status_code == 303, saved.content.decode()[:500]
    channel = NotificationChannel.objects.get()
    assert (channel.kind, channel.secret, channel.events) == ("teams", "", [])

    _run, _action, approval = gated_run(tenant, agent)
    _work()

    [row] = Notification.objects.filter(event="approval.requested")
    assert (row.status, row.kind, row.last_status_code) == ("delivered", "teams", 200), row.last_error
    [call] = outbound_to.received
    assert call.path == "/workflows/abc/triggers/manual/paths/invoke?sig=s3cret"
    assert card_problems(call.raw) == ""
    message = call.json
    assert message["type"] == "message" and message["attachments"][0]["contentUrl"] is None
    card = message["attachments"][0]["content"]
    assert (
        card["version"] == "1.4" and card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    )
    text = card_text(card)
    for said in (
        "payments.refund",
        approval.risk,
        approval.run_id,
        f"agent key {agent.key.name}",  # who asked
        '"amount": 40',
        '"currency": "EUR"',
        "Decide by",
        "then it is rejected",
    ):
        assert said in text, said
    assert buttons(card) == {
        "Approve…": _inbox(approval, "approve"),
        "Reject…": _inbox(approval, "reject"),
        "Open in Saga Admin": _inbox(approval),
    }

    # Approve… opens the approval in the inbox with Approve chosen; the GET decides nothing.
    client.force_login(bob)
    page = client.get(_path(buttons(card)["Approve…"]))
    body = page.content.decode()
    assert page.status_code == 200
    assert "You chose Approve. Nothing is decided yet" in body
    assert f'action="/approvals/{approval.pk}/approve"' in body and "data-approve-reason autofocus" in body
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    reject_page = client.get(_path(buttons(card)["Reject…"])).content.decode()
    assert "You chose Reject." in reject_page and "data-reject-reason autofocus" in reject_page

    # Bob confirms on that page: the decision card follows, without decision buttons.
    confirmed = client.post(
        f"/approvals/{approval.pk}/approve",
        {
            f"{approval.pk}-reason": "checked the order",
            f"{approval.pk}-shown_args_hash": approval.args_hash,
            f"{approval.pk}-args": json.dumps(approval.args),
        },
    )
    assert confirmed.status_code == 303
    _work()
    [decided] = Notification.objects.filter(event="approval.decided")
    assert decided.status == "delivered", decided.last_error
    follow_up = cards(outbound_to)[-1]
    assert "Approved by bob" in card_text(follow_up) and "checked the order" in card_text(follow_up)
    assert buttons(follow_up) == {"Open in Saga Admin": f"{PUBLIC}/runs/{approval.run_id}/"}

    # The same link after the decision says there is nothing left to decide.
    late = client.get(_path(buttons(card)["Approve…"])).content.decode()
    assert "already approved: there is nothing left to decide" in late
    assert f'action="/approvals/{approval.pk}/approve"' not in late


@pytest.mark.django_db(transaction=True)
def test_reminder_escalation_and_expiry_follow_the_card(tenant, agent, dave, outbound_to):
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(
        approval_timeout_s=600, on_timeout="escalate", escalate_to="admin"
    )
    _teams(tenant, dave, outbound_to.url())
    _run, _action, approval = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=approval.pk, now=timezone.now())
    _work()
    assert approvals_expire(now=approval.expires_at + timedelta(seconds=2)) == 0  # escalated
    _work()
    approval.refresh_from_db()
    assert approvals_expire(now=approval.expires_at) == 1  # the escalated window passed too
    _work()

    rows = {row.event: row for row in Notification.objects.all()}
    assert sorted(rows) == [
        "approval.escalated",
        "approval.expired",
        "approval.reminder",
        "approval.requested",
    ]
    assert {row.status for row in rows.values()} == {"delivered"}, [r.last_error for r in rows.values()]
    requested, reminder, escalated, timed_out = cards(outbound_to)  # each valid, in order
    assert [c["fallbackText"].split(":")[0] for c in (requested, reminder, escalated, timed_out)] == [
        "Approval needed",
        "Reminder",
        "Escalated to admin",
        "Timed out",
    ]
    # Sent while it waits, the reminder and the escalation offer the decision; the expiry does not.
    for card in (reminder, escalated):
        assert buttons(card)["Approve…"] == _inbox(approval, "approve")
        assert buttons(card)["Reject…"] == _inbox(approval, "reject")
    assert "Now decided by an admin of the tenant only." in card_text(escalated)
    assert "escalated to admin at" in card_text(escalated).lower()
    assert "escalated to admin first" in card_text(timed_out)
    assert buttons(timed_out) == {"Open in Saga Admin": f"{PUBLIC}/runs/{approval.run_id}/"}


@pytest.mark.django_db(transaction=True)
def test_a_reminder_sent_after_the_decision_offers_no_decision(tenant, agent, bob, dave, outbound_to):
    _teams(tenant, dave, outbound_to.url(), events=["approval.requested", "approval.reminder"])
    _run, _action, approval = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=approval.pk, now=timezone.now())
    approval_reject(approval=approval, actor=Actor.for_user(bob), reason="wrong order")
    _work()  # everything goes out after the decision
    statuses = dict(Notification.objects.values_list("event", "status"))
    assert statuses == {
        "approval.requested": "delivered",
        "approval.reminder": "dropped",
        "approval.decided": "delivered",
    }
    requested, decided = cards(outbound_to)
    assert buttons(requested) == {"Open in Saga Admin": _inbox(approval)}  # no decision left to open
    assert decided["fallbackText"].startswith("Rejected by bob") and "Approve…" not in buttons(decided)


def test_a_decision_follows_the_request_card_to_teams_channels_only(tenant, agent, bob, dave, settings):
    """The decision goes to each Teams channel that took the request's card, and to no other
    channel (PagerDuty aside: tests/recovery/test_pagerduty.py), nor the environment's."""
    settings.SAGA = {
        **settings.SAGA,
        "NOTIFY_WEBHOOKS": ["https://ops.example/hook"],
        "NOTIFY_EMAILS": ["o@acme.test"],
    }
    make = NotificationChannel.objects.create
    make(tenant=tenant, name="all", kind="webhook", target="https://hooks.example/a")
    make(tenant=tenant, name="slack", kind="slack", target="https://hooks.example/b")
    teams_all = make(tenant=tenant, name="t-all", kind="teams", target="https://t.example/c")
    teams_requests = make(
        tenant=tenant,
        name="t-requests",
        kind="teams",
        target="https://t.example/d",
        events=["approval.requested"],
    )
    make(
        tenant=tenant, name="t-queue", kind="teams", target="https://t.example/e", events=["recovery.opened"]
    )
    make(tenant=tenant, name="t-critical", kind="teams", target="https://t.example/f", min_risk="critical")
    _run, _action, approval = gated_run(tenant, agent)
    assert approval.risk != "critical"

    approval_reject(approval=approval, actor=Actor.for_user(bob), reason="wrong order")

    decided = Notification.objects.filter(event="approval.decided").order_by("channel_name")
    assert [row.channel_id for row in decided] == [teams_all.pk, teams_requests.pk]
    row = decided[0]
    assert (
        row.body["summary"]
        == f"Rejected by bob: payments.refund ({approval.risk} risk) on run {approval.run_id}"
    )
    assert "Reason: wrong order" in row.context["lines"]
    assert ["Decision", "Rejected by bob"] in row.context["facts"]


def test_a_decision_that_rolls_back_announces_nothing(tenant, agent, bob):
    NotificationChannel.objects.create(tenant=tenant, name="t", kind="teams", target="https://t.example/c")
    _run, _action, approval = gated_run(tenant, agent)
    with pytest.raises(RuntimeError), transaction.atomic():
        approval_reject(approval=approval, actor=Actor.for_user(bob), reason="no")
        assert Notification.objects.filter(event="approval.decided").count() == 1
        raise RuntimeError("the request failed after the decision")
    assert not Notification.objects.filter(event="approval.decided").exists()


@pytest.mark.django_db(transaction=True)
def test_send_a_test_to_a_teams_channel(client, tenant, dave, outbound_to):
    channel = _teams(tenant, dave, outbound_to.url())
    client.force_login(dave)
    assert client.post(f"/notifications/channels/{channel.pk}/test").status_code == 303
    _work()
    row = Notification.objects.get(event="notification.test")
    assert row.status == "delivered", row.last_error
    [card] = cards(outbound_to)
    assert "Test notification for channel approvers, sent by dave" in card_text(card)
    assert "If you read this, Saga Admin can reach this channel." in card_text(card)
    assert buttons(card) == {"Open in Saga Admin": f"{PUBLIC}/notifications/"}


@pytest.mark.django_db(transaction=True)
def test_every_other_event_gets_a_simple_valid_card(tenant, agent, dave, outbound_to):
    _teams(tenant, dave, outbound_to.url())
    load_onboarding_policies()
    run, _item = onboarding_run(tenant, agent)
    _work()
    row = Notification.objects.get(event="recovery.opened")
    assert row.status == "delivered", row.last_error
    [card] = cards(outbound_to)
    assert run.pk in card["fallbackText"] and "Agent: " in card_text(card)
    assert buttons(card) == {"Open in Saga Admin": f"{PUBLIC}/runs/{run.pk}/"}


def test_a_url_the_guard_refuses_is_refused_on_save_with_why(client, tenant, dave, settings):
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": []}
    client.force_login(dave)
    response = client.post(
        SETTINGS_FORM,
        {"name": "t", "kind": "teams", "target": "http://127.0.0.1:9/workflows", "min_risk": "low"},
    )
    assert response.status_code == 422
    assert "host 127.0.0.1 is a loopback address" in response.content.decode()
    assert not NotificationChannel.objects.exists()
    unknown = client.post(
        SETTINGS_FORM,
        {
            "name": "t",
            "kind": "teams",
            "target": "https://no-such-host.invalid/workflows",
            "min_risk": "low",
        },
    )
    assert unknown.status_code == 422 and "does not resolve" in unknown.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_url_refused_at_send_time_fails_the_card_saying_why(tenant, agent, dave, outbound_to, settings):
    _teams(tenant, dave, outbound_to.url())
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": []}  # the operator withdrew it
    gated_run(tenant, agent)
    _work()
    row = Notification.objects.get(event="approval.requested")
    assert row.status == "failed" and "loopback address" in row.last_error
    assert outbound_to.received == []


@pytest.mark.django_db(transaction=True)
def test_hostile_arguments_are_data_on_a_valid_card_of_bounded_size(tenant, agent, dave, outbound_to):
    _teams(tenant, dave, outbound_to.url())
    load_onboarding_policies()
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="support-agent", request='"}]} [click](https://evil.example)'
    )
    hostile = {
        "note": '"}]},{"type":"Action.OpenUrl","title":"Approve now","url":"https://evil.example"}',
        "markdown": "**Approved** [click here](https://evil.example) <b>x</b>",
        "separators": "a\u2028b\u2029c\u0007d",
        "zz_long": "x" * 60_000,  # sorted last, so the others are shown before the cut
    }
    action = action_record_gated(
        run=run,
        actor=agent,
        tool="payments.refund",
        idempotency_key="hostile-1",
        target_type="order",
        target_id="order-7",
        args=hostile,
    ).action
    approval = action.approvals.get()
    _work()
    row = Notification.objects.get(event="approval.requested")
    assert row.status == "delivered", row.last_error
    [call] = outbound_to.received
    assert len(call.raw) < 28_000  # Teams refuses a larger message
    card = call.json["attachments"][0]["content"]
    assert set(buttons(card)) == {"Approve…", "Reject…", "Open in Saga Admin"}
    assert buttons(card)["Approve…"] == _inbox(approval, "approve")
    assert "cut here: the approval page shows them whole" in card_text(card)
    # The text is in TextRuns (never read as Markdown), exactly as the args say it.
    runs_text = [
        inline["text"]
        for block in card["body"]
        for item in [block, *block.get("items", [])]
        for inline in item.get("inlines", [])
    ]
    assert any(
        '\\"}]},{\\"type\\":\\"Action.OpenUrl\\"' in t and "**Approved** [click here]" in t for t in runs_text
    )


def test_facts_are_text_runs_and_long_values_are_cut():
    message = teams.message(
        summary="s",
        url="https://saga.example.com/",
        risk="high",
        run_id="run_1",
        lines=[],
        facts=[("Asked by", "agent key [x](https://evil.example) **b**"), ("Tool", "t" * 1000)],
    )
    assert card_problems(json.dumps(message).encode()) == ""
    facts = message["attachments"][0]["content"]["body"][1]["items"]
    assert all(block["type"] == "RichTextBlock" for block in facts)  # a FactSet would read Markdown
    assert [run["text"] for run in facts[2]["inlines"]] == [
        "Asked by: ",
        "agent key [x](https://evil.example) **b**",
    ]
    value = facts[3]["inlines"][1]["text"]
    assert value.startswith("t" * 300) and value.endswith("… (700 more characters)")


def test_the_receiver_refuses_an_invalid_card_and_a_broken_card_fails_its_row(
    tenant, dave, outbound_to, monkeypatch
):
    good = teams.message(summary="s", url="https://x.example/", risk="low", run_id="", lines=["a"])
    assert httpx.post(outbound_to.url(), content=json.dumps(good)).status_code == 200
    broken = json.loads(json.dumps(good))
    broken["attachments"][0]["content"]["body"].append({"type": "TextBlock"})  # text is required
    refused = httpx.post(outbound_to.url(), content=json.dumps(broken))
    assert refused.status_code == 400 and "attachment 0 at /body/3" in refused.text
    not_a_message = httpx.post(outbound_to.url(), content=json.dumps({"text": "hi"}))
    assert not_a_message.status_code == 400

    # A card the schema refuses (a colour Adaptive Cards do not have) fails its row at once.
    monkeypatch.setitem(teams._RISK_COLOR, "low", "Purple")
    channel = _teams(tenant, dave, outbound_to.url())
    row = channels.channel_send_test(channel=channel, actor=Actor.for_user(dave))
    from recovery.notifications.delivery import notification_deliver

    assert notification_deliver(notification_id=row.pk) == "failed"
    row.refresh_from_db()
    assert row.last_status_code == 400 and "Teams answered 400" in row.last_error


def test_an_approval_link_reaches_only_the_users_tenants(client, tenant, agent, mallory, bob):
    _run, _action, approval = gated_run(tenant, agent)
    client.force_login(mallory)
    assert client.get(f"/approvals/?approval={approval.pk}&decide=approve").status_code == 404
    client.force_login(bob)
    for value in ("apr_\u0000", "x" * 500, "../1", "", approval.pk + "'"):
        # A NUL is refused before any view (400); the rest are no approval (404).
        assert client.get("/approvals/", {"approval": value, "decide": "approve"}).status_code in (400, 404)
    page = client.get("/approvals/", {"approval": approval.pk, "decide": "approve<x>"}).content.decode()
    assert "You chose" not in page and "approve&lt;x&gt;" not in page and "approve<x>" not in page
    assert Approval.objects.get(pk=approval.pk).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_card_raised_while_redis_is_stopped_is_delivered_after_it_returns(
    tenant, agent, dave, own_redis, start_worker, settings
):
    with serve_teams() as receiver:
        settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [receiver.host], "PUBLIC_URL": PUBLIC}
        _teams(tenant, dave, receiver.url())
        own_redis.stop()
        with transaction.atomic():
            _run, _action, approval = gated_run(tenant, agent)  # the enqueue after commit finds no Redis
        row = Notification.objects.get(event="approval.requested")
        assert (row.status, row.job_id, row.attempts, row.kind) == ("pending", "", 0, "teams")

        own_redis.start()
        worker = start_worker(SAGA_OUTBOUND_ALLOWED_HOSTS=receiver.host, SAGA_PUBLIC_URL=PUBLIC)
        wait_for(
            lambda: receiver.received, timeout=30, what=f"the sweeper's re-enqueue\n{worker.log()[-3000:]}"
        )
        [card] = cards(receiver)
        assert buttons(card)["Approve…"] == _inbox(approval, "approve")
        row = wait_for(lambda: Notification.objects.filter(pk=row.pk, status="delivered").first(), timeout=10)
        assert row.attempts == 1


def test_events_that_are_not_a_list_are_refused(tenant):
    channel = NotificationChannel(tenant=tenant, name="t", kind="email", target="ops@acme.test")
    channel.events = "approval.requested"  # a string would match its own substrings in wants()
    with pytest.raises(ValidationError) as refused:
        channel.full_clean(exclude=["tenant", "created_by"])
    assert "Unknown events" in str(refused.value)
