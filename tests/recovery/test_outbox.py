"""Notifications through the outbox: rows written with their event,
delivered by RQ workers with retries and backoff, claimed by compare-and-set, re-enqueued by the
sweeper; tenant channels (signed webhook, Slack, e-mail) with their choice of events and minimum
risk; reminders at half an approval's expiry, once; links to the exact page."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import django_rq
import pytest
from django.core import mail
from django.db import connection, transaction
from django.utils import timezone
from rq import SimpleWorker
from saga_client.signing import verify_signature
from slack_sdk.models.blocks import Block

from infra import errors
from ledger.audit import Actor
from recovery import approval_deadlines, compensators, sweeper
from recovery.actions import channels
from recovery.actions.approvals import approval_reject
from recovery.actions.compensations import unwind_start
from recovery.models import Approval, Notification, NotificationChannel, Unwind, UnwindStep
from recovery.notifications.delivery import notification_deliver
from recovery.notifications.outbox import notify
from recovery.unwinds.advance import unwind_advance_move
from recovery.unwinds.claim import step_claim
from recovery.unwinds.runner import step_record_outcome
from tests.factories import gated_run, load_onboarding_policies, onboarding_run
from tests.support.processes import wait_for
from tests.support.receivers import Receiver, serve_receiver

PUBLIC = "https://saga.example.com"
BODY_KEYS = {"event", "tenant", "id", "run_id", "summary", "url", "created_at"}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve_receiver() as server:
        yield server


@pytest.fixture
def outbound_to(settings, receiver):
    """The receiver's host:port is allowed (it is on this machine), and links point at PUBLIC."""
    settings.SAGA = {
        **settings.SAGA,
        "OUTBOUND_ALLOWED_HOSTS": [receiver.host],
        "PUBLIC_URL": PUBLIC,
        "NOTIFY_EMAILS": [],
        "NOTIFY_WEBHOOKS": [],
        "RETRY_BACKOFF_BASE_S": 2.0,
        "RETRY_BACKOFF_MAX_S": 60.0,
    }
    queue = django_rq.get_queue("notifications")
    queue.empty()
    yield receiver
    queue.empty()


def _work() -> None:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def _dave(dave) -> Actor:
    return Actor.for_user(dave)


def _webhook(tenant, dave, url, **options) -> tuple[NotificationChannel, str]:
    saved = channels.channel_create(
        tenant=tenant,
        actor=_dave(dave),
        name=options.pop("name", "ops hook"),
        kind="webhook",
        target=url,
        **options,
    )
    return saved.channel, saved.generated_secret


def _due_now(row: Notification) -> None:
    Notification.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())


# --- Rows are written with their event -------------------------------------------------------


def test_it_writes_nothing_when_the_event_rolls_back(tenant, agent, dave, outbound_to):
    _webhook(tenant, dave, outbound_to.url())
    load_onboarding_policies()
    with pytest.raises(RuntimeError), transaction.atomic():
        onboarding_run(tenant, agent)
        assert Notification.objects.filter(event="recovery.opened").count() == 1
        raise RuntimeError("the request failed after the item was opened")
    assert not Notification.objects.exists()


def test_a_webhook_channel_gets_the_contract_body_signed_with_its_own_secret(
    tenant, agent, dave, outbound_to, django_capture_on_commit_callbacks
):
    channel, secret = _webhook(tenant, dave, outbound_to.url())
    assert len(secret) >= 32 and channel.secret == secret
    with django_capture_on_commit_callbacks(execute=True):
        run, item = onboarding_run(tenant, agent)
    assert outbound_to.received == []  # nothing inside the request: a job was queued

    _work()

    [call] = outbound_to.received
    assert verify_signature(secret, call.headers, call.raw)
    assert not verify_signature("another tenant's secret", call.headers, call.raw)
    body = call.json
    assert set(body) == BODY_KEYS
    assert (body["event"], body["tenant"], body["id"], body["run_id"]) == (
        "recovery.opened",
        "acme",
        item.pk,
        run.pk,
    )
    assert body["url"] == f"{PUBLIC}/runs/{run.pk}/"
    assert run.pk in body["summary"]
    row = Notification.objects.get()
    assert call.headers["Idempotency-Key"] == row.pk
    assert (row.status, row.attempts, row.last_error, row.channel_id) == ("delivered", 1, "", channel.pk)


def test_a_slack_channel_gets_a_valid_block_kit_message_with_the_link(
    tenant, agent, dave, outbound_to, django_capture_on_commit_callbacks
):
    channels.channel_create(
        tenant=tenant,
        actor=_dave(dave),
        name="#ops",
        kind="slack",
        target=outbound_to.url("/services/T1/B2/x"),
    )
    with django_capture_on_commit_callbacks(execute=True):
        run, _action, approval = gated_run(tenant, agent, amount=48200)
    _work()

    [call] = outbound_to.received
    assert call.path == "/services/T1/B2/x" and "X-Saga-Signature" not in call.headers
    message = call.json
    assert "Approval needed: payments.refund (high risk)" in message["text"]
    for block in message["blocks"]:
        Block.parse(block).validate_json()  # slack-sdk's own Block Kit checks
    link = f"{PUBLIC}/approvals/#approval-{approval.pk}"
    buttons = [e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert [b["text"]["text"] for b in buttons] == ["Open in Saga Admin"]  # no Slack app: no decisions
    assert buttons[0]["url"] == link
    fields = [f["text"] for b in message["blocks"] for f in b.get("fields", [])]
    assert any("high" in f for f in fields) and any(run.pk in f for f in fields)
    assert '"amount": 48200' in str(message["blocks"])


def test_an_email_channel_mails_its_addresses(
    tenant, agent, dave, outbound_to, django_capture_on_commit_callbacks
):
    channels.channel_create(
        tenant=tenant,
        actor=_dave(dave),
        name="on-call",
        kind="email",
        target="oncall@acme.test , cto@acme.test",
    )
    with django_capture_on_commit_callbacks(execute=True):
        run, _item = onboarding_run(tenant, agent)
    _work()
    [message] = mail.outbox
    assert message.to == ["oncall@acme.test", "cto@acme.test"] and run.pk in message.subject
    assert f"{PUBLIC}/runs/{run.pk}/" in message.body


# --- Retries, backoff, claims ----------------------------------------------------------------


def test_a_slack_4xx_fails_at_once_while_429_and_5xx_are_retried_with_backoff(
    tenant, agent, dave, outbound_to, django_capture_on_commit_callbacks
):
    channels.channel_create(
        tenant=tenant, actor=_dave(dave), name="#ops", kind="slack", target=outbound_to.url()
    )
    outbound_to.script = [404]
    with django_capture_on_commit_callbacks(execute=True):
        onboarding_run(tenant, agent)
    _work()
    row = Notification.objects.get()
    assert (row.status, row.attempts, row.last_status_code) == ("failed", 1, 404)
    assert "Slack answered 404" in row.last_error and row.next_attempt_at is None
    # A second job for it (a sweep, a duplicate) finds nothing to send: no retry storm.
    assert notification_deliver(notification_id=row.pk) == "skipped"
    assert len(outbound_to.received) == 1

    outbound_to.script = [429, 503]
    with django_capture_on_commit_callbacks(execute=True):
        second = notify(
            tenant=tenant,
            event="recovery.opened",
            subject_id="rec_x",
            run_id="run_x",
            summary="s",
            path="/",
            risk="low",
        )[0]
    before = timezone.now()
    assert notification_deliver(notification_id=second.pk) == "retry"
    second.refresh_from_db()
    assert (second.status, second.attempts, second.last_status_code) == ("pending", 1, 429)
    assert timedelta(seconds=1.5) < second.next_attempt_at - before < timedelta(seconds=3)
    # Not due yet: a job that comes early claims nothing.
    assert notification_deliver(notification_id=second.pk) == "skipped"
    _due_now(second)
    before = timezone.now()
    assert notification_deliver(notification_id=second.pk) == "retry"
    second.refresh_from_db()
    assert second.last_status_code == 503
    assert timedelta(seconds=3.5) < second.next_attempt_at - before < timedelta(seconds=5)  # doubled
    _due_now(second)
    assert notification_deliver(notification_id=second.pk) == "delivered"
    second.refresh_from_db()
    assert (second.status, second.attempts) == ("delivered", 3)
    assert [h["outcome"] for h in second.history] == ["retry", "retry", "delivered"]


def test_it_gives_up_after_its_attempts(tenant, dave, outbound_to, settings):
    settings.SAGA = {**settings.SAGA, "NOTIFY_MAX_ATTEMPTS": 2}
    _webhook(tenant, dave, outbound_to.url())
    outbound_to.script = [500, 500, 500]
    [row] = notify(
        tenant=tenant,
        event="recovery.opened",
        subject_id="rec_x",
        run_id="",
        summary="s",
        path="/",
        risk="low",
    )
    notification_deliver(notification_id=row.pk)
    _due_now(row)
    assert notification_deliver(notification_id=row.pk) == "failed"
    row.refresh_from_db()
    assert row.status == "failed" and row.last_error.startswith("Gave up after 2 attempts")


@pytest.mark.django_db(transaction=True)
def test_two_workers_never_send_one_notification_twice(tenant, dave, outbound_to):
    _webhook(tenant, dave, outbound_to.url())
    outbound_to.delay_s = 0.5
    with transaction.atomic():
        [row] = notify(
            tenant=tenant,
            event="recovery.opened",
            subject_id="rec_x",
            run_id="",
            summary="s",
            path="/",
            risk="low",
        )
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def deliver() -> None:
        barrier.wait()
        try:
            outcomes.append(notification_deliver(notification_id=row.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["delivered", "skipped", "skipped", "skipped"]
    assert len(outbound_to.received) == 1


# --- Channels choose; the guard checks -------------------------------------------------------


def test_channels_choose_their_events_and_minimum_risk(tenant, dave, outbound_to, settings):
    settings.SAGA = {**settings.SAGA, "NOTIFY_WEBHOOKS": [outbound_to.url("/env")]}
    _webhook(
        tenant, dave, outbound_to.url("/approvals"), name="approvals only", events=["approval.requested"]
    )
    _webhook(tenant, dave, outbound_to.url("/high"), name="high and up", min_risk="high")
    _webhook(tenant, dave, outbound_to.url("/off"), name="switched off", enabled=False)

    def destinations(event: str, risk: str) -> set[str]:
        rows = notify(tenant=tenant, event=event, subject_id="x", run_id="", summary="s", path="/", risk=risk)
        return {r.channel_name for r in rows}

    env = f"SAGA_NOTIFY_WEBHOOKS {outbound_to.url().split('//')[1].split(':')[0]}"
    assert destinations("approval.requested", "low") == {"approvals only", env}
    assert destinations("approval.requested", "critical") == {"approvals only", "high and up", env}
    assert destinations("recovery.opened", "medium") == {env}
    assert destinations("step.failed", "high") == {"high and up", env}


def test_a_channel_url_is_checked_when_saved_and_when_sent(tenant, dave, outbound_to, settings):
    with pytest.raises(errors.ValidationFailed) as refused:
        channels.channel_create(
            tenant=tenant,
            actor=_dave(dave),
            name="metadata",
            kind="webhook",
            target="http://169.254.169.254/latest",
        )
    assert "link-local" in refused.value.message and "target" in refused.value.details["fields"]
    with pytest.raises(errors.ValidationFailed):
        channels.channel_create(
            tenant=tenant, actor=_dave(dave), name="local", kind="slack", target="http://127.0.0.1:6379/"
        )
    assert not NotificationChannel.objects.exists()

    _webhook(tenant, dave, outbound_to.url())
    # The operator withdraws the exception after the channel was saved: the send is refused too.
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": []}
    [row] = notify(
        tenant=tenant, event="recovery.opened", subject_id="x", run_id="", summary="s", path="/", risk="low"
    )
    assert notification_deliver(notification_id=row.pk) == "failed"
    row.refresh_from_db()
    assert row.last_error.startswith("Refused: URL host 127.0.0.1 is a loopback address")
    assert outbound_to.received == []


# --- The events ------------------------------------------------------------------------------


def test_a_failed_step_and_the_finished_unwind_are_announced_with_links(
    tenant, agent, alice, dave, outbound_to
):
    _webhook(tenant, dave, outbound_to.url(), events=["step.failed", "unwind.finished"])
    run, item = onboarding_run(tenant, agent)
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the hire")
    outcomes = [compensators.Outcome.failed("licence API said no"), compensators.Outcome.done()]
    for outcome in outcomes:
        unwind_advance_move(unwind_id=unwind.pk)
        step = unwind.steps.get(status=UnwindStep.Status.QUEUED)
        claim = step_claim(step_id=step.pk)
        assert claim is not None
        step_record_outcome(step_id=step.pk, token=claim.token, outcome=outcome)
    unwind_advance_move(unwind_id=unwind.pk)  # nothing left: it finishes
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.FAILED

    rows = {r.event: r for r in Notification.objects.filter(channel__isnull=False)}
    assert set(rows) == {"step.failed", "unwind.finished"}
    failed_step = unwind.steps.get(status=UnwindStep.Status.FAILED)
    assert rows["step.failed"].body["id"] == failed_step.pk
    assert rows["step.failed"].body["url"] == f"{PUBLIC}/runs/{run.pk}/#unwind"
    assert "licence API said no" in "\n".join(rows["step.failed"].context["lines"])
    assert rows["unwind.finished"].body["id"] == unwind.pk
    assert "finished with steps left" in rows["unwind.finished"].body["summary"]


@pytest.mark.django_db(transaction=True)
def test_the_reminder_fires_once_at_half_the_expiry(tenant, agent, dave, outbound_to):
    _webhook(tenant, dave, outbound_to.url(), events=["approval.reminder"])
    _run, _action, approval = gated_run(tenant, agent)
    decided_run, _a, decided = gated_run(tenant, agent)
    now = timezone.now()
    # Not yet at half its time: no reminder.
    assert sweeper.notifications_sweep(now=now).reminders == 0
    # 13 h of a 24 h approval have passed (and of the decided one, which is never reminded).
    later = now + timedelta(hours=13)
    Approval.objects.filter(pk=decided.pk).update(status=Approval.Status.REJECTED)

    # Two sweepers at once: one reminds.
    counts: list[int] = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        barrier.wait()
        try:
            counts.append(sweeper.notifications_sweep(now=later).reminders)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(counts) == [0, 1]
    assert sweeper.notifications_sweep(now=later + timedelta(hours=1)).reminders == 0
    [row] = Notification.objects.filter(event="approval.reminder")
    assert row.subject_id == approval.pk and row.body["url"] == f"{PUBLIC}/approvals/#approval-{approval.pk}"
    assert "expires at" in row.body["summary"]
    assert Approval.objects.get(pk=approval.pk).reminded_at is not None
    assert approval_deadlines.approval_remind(approval_id=approval.pk, now=later) is None


def test_a_reminder_for_an_approval_decided_meanwhile_is_dropped(tenant, agent, dave, bob, outbound_to):
    _webhook(tenant, dave, outbound_to.url())
    _run, _action, approval = gated_run(tenant, agent)
    approval_deadlines.approval_remind(approval_id=approval.pk, now=timezone.now())
    approval_reject(approval=approval, actor=Actor.for_user(bob), reason="not today")
    row = Notification.objects.get(event="approval.reminder")
    assert notification_deliver(notification_id=row.pk) == "dropped"
    assert outbound_to.received == []


# --- Redis down: delayed, not lost (a real worker process) -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_notification_raised_while_redis_is_stopped_is_delivered_after_it_returns(
    tenant, agent, dave, own_redis, start_worker, settings
):
    with serve_receiver() as receiver:
        settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [receiver.host], "PUBLIC_URL": PUBLIC}
        _channel, secret = _webhook(tenant, dave, receiver.url())
        own_redis.stop()
        with transaction.atomic():
            run, item = onboarding_run(tenant, agent)  # the enqueue after commit finds no Redis
        row = Notification.objects.get()
        assert (row.status, row.job_id, row.attempts) == ("pending", "", 0)

        own_redis.start()
        worker = start_worker(SAGA_OUTBOUND_ALLOWED_HOSTS=receiver.host, SAGA_PUBLIC_URL=PUBLIC)
        wait_for(
            lambda: receiver.received, timeout=30, what=f"the sweeper's re-enqueue\n{worker.log()[-3000:]}"
        )
        [call] = receiver.received
        assert verify_signature(secret, call.headers, call.raw)
        assert call.json["id"] == item.pk and call.json["url"] == f"{PUBLIC}/runs/{run.pk}/"
        row = wait_for(lambda: Notification.objects.filter(pk=row.pk, status="delivered").first(), timeout=10)
        assert row.attempts == 1
