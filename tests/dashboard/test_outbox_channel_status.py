"""The outbox's per-channel status (``dashboard.selectors.outbox``): each channel's newest delivery,
its newest failure and why, and its backlog — for the tenant's channels and the installation's,
never another tenant's rows — in a fixed number of queries that read the channel indexes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.selectors.outbox import channel_statuses
from recovery.models import Notification, NotificationChannel

pytestmark = pytest.mark.django_db

OUTBOX = "/notifications/"
HOOK = "https://hooks.acme.test/saga"


@pytest.fixture
def installation_channels(settings):
    settings.SAGA = {**settings.SAGA, "NOTIFY_EMAILS": ["oncall@acme.test"], "NOTIFY_WEBHOOKS": [HOOK]}


def _row(tenant, channel, *, minutes_ago: int, status: str, event: str = "recovery.opened", **fields):
    name = channel.name if isinstance(channel, NotificationChannel) else channel
    row = Notification.objects.create(
        tenant=tenant,
        channel=channel if isinstance(channel, NotificationChannel) else None,
        channel_name=name,
        kind=channel.kind if isinstance(channel, NotificationChannel) else "email",
        env_target=fields.pop("env_target", ""),
        event=event,
        subject_id="itm_1",
        status=status,
        **fields,
    )
    at = timezone.now() - timedelta(minutes=minutes_ago)
    Notification.objects.filter(pk=row.pk).update(created_at=at, updated_at=at)
    return Notification.objects.get(pk=row.pk)


def _channel(tenant, name: str, kind: str = "email") -> NotificationChannel:
    target = "ops@acme.test" if kind == "email" else "https://hooks.example.test/x"
    return NotificationChannel.objects.create(tenant=tenant, name=name, kind=kind, target=target)


def _by_name(statuses):
    return {s.name: s for s in statuses}


def test_each_channel_shows_its_last_delivery_last_failure_and_backlog(
    tenant, other_tenant, installation_channels
):
    mail, hook = _channel(tenant, "ops-mail"), _channel(tenant, "ops-hook", "webhook")
    quiet = _channel(tenant, "quiet")
    _row(tenant, mail, minutes_ago=50, status="delivered", event="approval.requested")
    newest_delivery = _row(tenant, mail, minutes_ago=40, status="delivered", event="recovery.opened")
    mail_failure = _row(
        tenant, mail, minutes_ago=45, status="failed", event="unwind.failed", last_error="550 mailbox full"
    )
    _row(tenant, mail, minutes_ago=5, status="pending")
    _row(tenant, mail, minutes_ago=4, status="sending")
    _row(tenant, mail, minutes_ago=3, status="dropped")
    # The hook failed for good once, and its newest notification is being retried after a 503.
    _row(tenant, hook, minutes_ago=30, status="failed", last_error="refused", last_status_code=410)
    retrying = _row(
        tenant, hook, minutes_ago=10, status="pending", last_error="server error", last_status_code=503
    )
    env_delivery = _row(tenant, "SAGA_NOTIFY_EMAILS", minutes_ago=20, status="delivered", env_target="email")
    # A deleted channel's rows (channel NULL, no env_target) are no channel of today's.
    _row(tenant, "deleted-channel", minutes_ago=1, status="failed", last_error="gone")
    # Globex: its own channel, and newer rows on the installation's channels; none of them Acme's.
    globex = _channel(other_tenant, "globex-mail")
    _row(other_tenant, globex, minutes_ago=1, status="failed", last_error="globex error")
    _row(other_tenant, "SAGA_NOTIFY_EMAILS", minutes_ago=1, status="failed", env_target="email")
    _row(other_tenant, "SAGA_NOTIFY_EMAILS", minutes_ago=1, status="pending", env_target="email")

    statuses = channel_statuses(tenant_ids=[tenant.pk])

    assert [s.name for s in statuses] == [
        "ops-hook",
        "ops-mail",
        "quiet",
        "SAGA_NOTIFY_EMAILS",
        "SAGA_NOTIFY_WEBHOOKS hooks.acme.test",
    ]
    assert {s.tenant.pk for s in statuses} == {tenant.pk}
    by_name = _by_name(statuses)
    assert by_name["ops-mail"].last_delivered == newest_delivery
    assert by_name["ops-mail"].last_failed == mail_failure
    assert by_name["ops-mail"].pending == 2
    assert by_name["ops-hook"].last_delivered is None
    assert by_name["ops-hook"].last_failed == retrying
    assert by_name["ops-hook"].pending == 1
    assert (by_name["quiet"].last_delivered, by_name["quiet"].last_failed, by_name["quiet"].pending) == (
        None,
        None,
        0,
    )
    env = by_name["SAGA_NOTIFY_EMAILS"]
    assert (env.channel, env.last_delivered, env.last_failed, env.pending) == (None, env_delivery, None, 0)
    assert by_name["SAGA_NOTIFY_WEBHOOKS hooks.acme.test"].last_delivered is None
    assert quiet.pk in {s.key for s in statuses}

    # Both tenants at once (a superuser's view): each keeps its own figures.
    both = channel_statuses(tenant_ids=[tenant.pk, other_tenant.pk])
    globex_env = next(s for s in both if s.tenant.pk == other_tenant.pk and s.name == "SAGA_NOTIFY_EMAILS")
    assert globex_env.pending == 1 and globex_env.last_failed is not None
    assert _by_name(s for s in both if s.tenant.pk == tenant.pk)["SAGA_NOTIFY_EMAILS"].pending == 0


def test_the_page_shows_the_figures_of_the_users_tenant_only(client, tenant, other_tenant, alice, mallory):
    mail = _channel(tenant, "ops-mail")
    _row(tenant, mail, minutes_ago=9, status="delivered", event="approval.requested")
    _row(tenant, mail, minutes_ago=8, status="failed", last_error="550 mailbox full")
    globex = _channel(other_tenant, "globex-mail")
    _row(other_tenant, globex, minutes_ago=1, status="failed", last_error="globex secret error")

    client.force_login(alice)  # an Acme operator: the status, not the test button (an admin's)
    page = client.get(OUTBOX).content.decode()
    assert f'data-channel-status="{mail.pk}"' in page
    assert "550 mailbox full" in page and "approval.requested" in page
    assert "globex" not in page
    assert "Send a test" not in page

    client.force_login(mallory)
    page = client.get(OUTBOX).content.decode()
    assert f'data-channel-status="{globex.pk}"' in page and "globex secret error" in page
    assert "ops-mail" not in page and "550 mailbox full" not in page


def test_an_admin_sends_a_test_from_the_status(client, tenant, dave):
    mail = _channel(tenant, "ops-mail")
    client.force_login(dave)
    page = client.get(OUTBOX).content.decode()
    assert f'action="/notifications/channels/{mail.pk}/test"' in page
    client.post(f"/notifications/channels/{mail.pk}/test")
    [status] = [s for s in channel_statuses(tenant_ids=[tenant.pk]) if s.channel == mail]
    assert status.pending == 1


def _queries(tenant_ids):
    with CaptureQueriesContext(connection) as queries:
        channel_statuses(tenant_ids=tenant_ids)
    return [q["sql"] for q in queries.captured_queries]


def test_the_figures_take_three_queries_however_many_channels(tenant, other_tenant, installation_channels):
    _row(tenant, _channel(tenant, "one"), minutes_ago=1, status="delivered")
    few = len(_queries([tenant.pk]))
    for i in range(6):
        _row(tenant, _channel(tenant, f"more-{i}"), minutes_ago=i, status="delivered")
        _channel(other_tenant, f"globex-{i}")
    assert len(_queries([tenant.pk, other_tenant.pk])) == few == 3


def test_the_figures_read_the_channel_indexes_from_their_end(tenant, installation_channels):
    """Each figure is an index range read from its end (recovery/0019), not the tenant's outbox
    read and sorted: the plan names both indexes, and no step reads the table whole."""
    mail = _channel(tenant, "ops-mail")
    Notification.objects.bulk_create(
        Notification(
            tenant=tenant,
            channel=mail if i % 2 else None,
            channel_name=mail.name if i % 2 else "SAGA_NOTIFY_EMAILS",
            kind="email",
            env_target="" if i % 2 else "email",
            event="recovery.opened",
            subject_id=f"itm_{i}",
            status="delivered" if i % 50 else "failed",
        )
        for i in range(3000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE recovery_notification")
    plans = []
    with connection.cursor() as cursor:
        for sql in _queries([tenant.pk])[:2]:
            cursor.execute("EXPLAIN " + sql)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    plan = "\n".join(plans)
    assert "notification_channel_latest" in plans[0], plans[0]
    assert "notification_env_channel_latest" in plans[1], plans[1]
    assert "Seq Scan on recovery_notification" not in plan, plan
