"""The Notifications page (the outbox, for operators and admins) and a tenant's notification
settings (for its admins): channels with a secret shown once, a URL the guard refuses as a form
error, the test notification, the Slack app and Slack users; the Django admin's form checks the
same; nobody reaches another tenant's settings."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from ledger.audit import Actor
from ledger.models import Event
from ledger.staff import membership_set
from recovery.actions import channels
from recovery.models import Notification, NotificationChannel, SlackApp, SlackUserLink
from recovery.notifications.delivery import notification_deliver
from tests.support.slack import link_slack_user

pytestmark = pytest.mark.django_db

SETTINGS = "/notifications/settings/"
OUTBOX = "/notifications/"


@pytest.fixture
def allowed(settings):
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1:9"]}


def _channel(**fields) -> dict:
    return {
        "name": "ops hook",
        "kind": "webhook",
        "target": "http://127.0.0.1:9/hook",
        "secret": "",
        "min_risk": "high",
        "events": ["approval.requested", "recovery.opened"],
        "enabled": "on",
        **fields,
    }


def test_who_sees_what(client, alice, bob, carol, dave):
    client.force_login(carol)  # viewer
    assert client.get(OUTBOX).status_code == 403
    assert client.get(SETTINGS).status_code == 403
    client.force_login(bob)  # approver
    assert client.get(OUTBOX).status_code == 403
    client.force_login(alice)  # operator: the outbox, not the settings
    page = client.get(OUTBOX)
    assert page.status_code == 200 and b"Notification settings" not in page.content
    assert b'href="/notifications/"' in page.content  # in the nav
    assert client.get(SETTINGS).status_code == 403
    client.force_login(dave)  # admin: both
    assert b"Notification settings" in client.get(OUTBOX).content
    assert client.get(SETTINGS).status_code == 200


def test_an_admin_adds_a_webhook_channel_and_sees_its_secret_once(client, tenant, dave, allowed):
    client.force_login(dave)
    response = client.post("/notifications/settings/acme/channels", _channel())
    assert response.status_code == 200
    channel = NotificationChannel.objects.get()
    assert (channel.kind, channel.min_risk, channel.events) == (
        "webhook",
        "high",
        ["approval.requested", "recovery.opened"],
    )
    assert len(channel.secret) >= 32 and channel.secret in response.content.decode()
    assert channel.created_by == dave
    # Not on the next page view, nor in the audit log.
    assert channel.secret not in client.get(SETTINGS).content.decode()
    event = Event.objects.get(kind="channel.created")
    assert channel.secret not in str(event.data) and event.actor_label == "dave"


def test_a_url_the_guard_refuses_is_a_form_error(client, tenant, dave):
    client.force_login(dave)
    response = client.post(
        "/notifications/settings/acme/channels", _channel(target="http://169.254.169.254/latest/meta-data")
    )
    assert response.status_code == 422
    assert "link-local address" in response.content.decode()
    assert not NotificationChannel.objects.exists()
    bad_mail = client.post(
        "/notifications/settings/acme/channels", _channel(kind="email", target="oncall, x@")
    )
    assert bad_mail.status_code == 422 and "is not an e-mail address" in bad_mail.content.decode()


def test_a_chosen_secret_is_kept_and_a_duplicate_name_is_refused(client, tenant, dave, allowed):
    client.force_login(dave)
    response = client.post(
        "/notifications/settings/acme/channels", _channel(secret="my-own-secret-1234567890")
    )
    assert response.status_code == 303
    assert NotificationChannel.objects.get().secret == "my-own-secret-1234567890"
    again = client.post("/notifications/settings/acme/channels", _channel())
    assert again.status_code == 422 and "already has a channel named" in again.content.decode()


def test_an_admin_edits_tests_and_deletes_a_channel(
    client, tenant, dave, allowed, django_capture_on_commit_callbacks
):
    saved = channels.channel_create(
        tenant=tenant, actor=Actor.for_user(dave), name="ops", kind="webhook", target="http://127.0.0.1:9/a"
    )
    client.force_login(dave)
    edit = f"/notifications/channels/{saved.channel.pk}/edit"
    assert client.get(edit).status_code == 200
    response = client.post(
        edit, _channel(name="ops", kind="slack", target="http://127.0.0.1:9/slack", min_risk="low")
    )
    assert response.status_code == 303
    channel = NotificationChannel.objects.get()
    assert (channel.kind, channel.target, channel.secret) == ("slack", "http://127.0.0.1:9/slack", "")

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(f"/notifications/channels/{channel.pk}/test")
    assert response.status_code == 303 and len(callbacks) == 1
    row = Notification.objects.get()
    assert (row.event, row.channel_id, row.status) == ("notification.test", channel.pk, "pending")
    assert f"notification-{row.pk}" in response["Location"]
    outbox = client.get(OUTBOX).content.decode()
    assert f'id="notification-{row.pk}"' in outbox and "Test notification for channel ops" in outbox

    assert client.post(f"/notifications/channels/{channel.pk}/delete").status_code == 303
    assert not NotificationChannel.objects.exists()
    row.refresh_from_db()
    assert row.channel_id is None and row.channel_name == "ops"
    assert notification_deliver(notification_id=row.pk) == "failed"
    row.refresh_from_db()
    assert "deleted" in row.last_error
    assert "deleted" in client.get(OUTBOX).content.decode()


def test_the_outbox_shows_each_attempt(client, tenant, alice, dave, allowed):
    saved = channels.channel_create(
        tenant=tenant, actor=Actor.for_user(dave), name="ops", kind="webhook", target="http://127.0.0.1:9/a"
    )
    row = channels.channel_send_test(channel=saved.channel, actor=Actor.for_user(dave))
    # Nothing listens on port 9: the attempt fails and is retried later.
    assert notification_deliver(notification_id=row.pk) == "retry"
    client.force_login(alice)
    page = client.get(OUTBOX).content.decode()
    assert "1 of 10" in page and "ConnectError" in page and 'data-status="pending"' in page
    filtered = client.get(OUTBOX, {"status": "delivered"}).content.decode()
    assert f"notification-{row.pk}" not in filtered
    assert client.get(OUTBOX, {"status": "<script>"}).status_code == 200


def test_nobody_reaches_another_tenants_settings(client, tenant, other_tenant, dave, mallory, allowed):
    saved = channels.channel_create(
        tenant=tenant, actor=Actor.for_user(dave), name="ops", kind="webhook", target="http://127.0.0.1:9/a"
    )
    membership_set(user=mallory, tenant=other_tenant, role="admin", actor=Actor.system("tests"))
    client.force_login(mallory)
    pk = saved.channel.pk
    assert client.post(f"/notifications/channels/{pk}/test").status_code == 404
    assert client.post(f"/notifications/channels/{pk}/delete").status_code == 404
    assert client.get(f"/notifications/channels/{pk}/edit").status_code == 404
    assert client.post("/notifications/settings/acme/channels", _channel()).status_code == 404
    assert client.post("/notifications/settings/acme/slack", {"signing_secret": "x" * 32}).status_code == 404
    assert "ops" not in client.get(SETTINGS).content.decode()
    assert "globex" in client.get(SETTINGS).content.decode().lower()
    assert client.get("/notifications/channels/not-an-id/edit").status_code == 404
    assert NotificationChannel.objects.count() == 1 and not Notification.objects.exists()


def test_an_operator_cannot_post_settings(client, tenant, alice, dave, allowed):
    saved = channels.channel_create(
        tenant=tenant, actor=Actor.for_user(dave), name="ops", kind="webhook", target="http://127.0.0.1:9/a"
    )
    client.force_login(alice)
    assert client.post(f"/notifications/channels/{saved.channel.pk}/test").status_code == 403
    assert client.post("/notifications/settings/acme/channels", _channel(name="x")).status_code == 403
    assert client.post("/notifications/settings/acme/slack", {"signing_secret": "s" * 32}).status_code == 403
    assert not SlackApp.objects.exists() and NotificationChannel.objects.count() == 1


def test_an_admin_connects_slack_and_removes_slack_links_but_cannot_make_one(client, tenant, dave, bob):
    client.force_login(dave)
    too_short = client.post("/notifications/settings/acme/slack", {"signing_secret": "short"})
    assert too_short.status_code == 422 and not SlackApp.objects.exists()
    assert client.post("/notifications/settings/acme/slack", {"signing_secret": "s" * 32}).status_code == 303
    assert SlackApp.objects.get(tenant=tenant).signing_secret == "s" * 32
    page = client.get(SETTINGS).content.decode()
    assert "s" * 32 not in page and "/integrations/slack/interactions" in page
    assert "/integrations/slack/commands" in page and "Map Slack user" not in page

    # The form that let an admin type someone's Slack id is gone: nothing to post to.
    typed = client.post(
        "/notifications/settings/acme/slack-users",
        {"team_id": "T0ACME", "slack_user_id": "UBOB", "user": bob.pk},
    )
    assert typed.status_code == 404 and not SlackUserLink.objects.exists()

    link = link_slack_user(tenant=tenant, user=bob, team_id="T0ACME", slack_user_id="UBOB")
    # Who is linked, not as which Slack user.
    listed = client.get(SETTINGS).content.decode()
    assert f"<td>{bob.get_username()}</td>" in listed and "UBOB" not in listed
    removed = client.post(f"/notifications/slack-users/{link.pk}/remove", {"next": "settings"})
    assert removed.status_code == 303 and removed["Location"] == "/notifications/settings/?tenant=acme"
    assert not SlackUserLink.objects.exists()
    assert client.post("/notifications/settings/acme/slack", {"remove": "yes"}).status_code == 303
    assert not SlackApp.objects.exists()
    kinds = set(Event.objects.values_list("kind", flat=True))
    assert {
        "slack_app.connected",
        "slack_user.link_code_issued",
        "slack_user.linked",
        "slack_user.unlinked",
        "slack_app.disconnected",
    } <= kinds


def test_the_django_admin_checks_a_channel_url_the_same_way(client, tenant, dave):
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))
    client.force_login(dave)
    response = client.post(
        "/admin/recovery/notificationchannel/add/",
        {
            "tenant": tenant.pk,
            "name": "metadata",
            "kind": "webhook",
            "target": "http://169.254.169.254/",
            "secret": "",
            "events": "[]",
            "min_risk": "low",
            "enabled": "on",
        },
    )
    assert response.status_code == 200 and "link-local address" in response.content.decode()
    assert not NotificationChannel.objects.exists()
    ok = client.post(
        "/admin/recovery/notificationchannel/add/",
        {
            "tenant": tenant.pk,
            "name": "on-call",
            "kind": "email",
            "target": "oncall@acme.test",
            "secret": "",
            "events": '["recovery.opened"]',
            "min_risk": "low",
            "enabled": "on",
        },
    )
    assert ok.status_code == 302, ok.content.decode()[:2000]
    assert NotificationChannel.objects.get().events == ["recovery.opened"]
    assert Event.objects.filter(kind="channel.created").exists()
    assert [str(m) for m in get_messages(ok.wsgi_request)]
