"""A tenant admin adds a signed webhook channel from the dashboard, keeps the secret it shows once,
and sends a test notification: a real worker delivers it, the receiver verifies the signature with
that secret, and the Notifications page shows it delivered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect
from saga_client.signing import verify_signature

from recovery.models import Notification, NotificationChannel
from tests.support.browser import login, screenshot
from tests.support.processes import wait_for
from tests.support.receivers import Receiver, serve_receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receiver(settings, monkeypatch) -> Iterator[Receiver]:
    """The tenant's webhook receiver, on this machine: its host:port allowed for the live server
    (this process) and for the worker (started after this fixture, from the environment)."""
    with serve_receiver() as server:
        settings.SAGA = {
            **settings.SAGA,
            "OUTBOUND_ALLOWED_HOSTS": [server.host],
            "PUBLIC_URL": "https://saga.test",
        }
        monkeypatch.setenv("SAGA_OUTBOUND_ALLOWED_HOSTS", server.host)
        monkeypatch.setenv("SAGA_PUBLIC_URL", "https://saga.test")
        yield server


def test_a_tenant_admin_adds_a_webhook_channel_and_sends_a_test(
    page, live_server, tenant, dave, receiver, rq_worker
):
    login(page, "dave")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Notifications").click()
    expect(page.get_by_role("heading", name="Notifications", exact=True)).to_be_visible()
    page.get_by_role("link", name="Notification settings").click()
    expect(page.get_by_text("No channel yet")).to_be_visible()

    # First a URL the guard refuses: the form says why and nothing is saved.
    page.get_by_label("Name").fill("ops webhook")
    page.get_by_label("Kind").select_option("webhook")
    page.get_by_label("Send to").fill("http://169.254.169.254/latest/meta-data")
    page.get_by_role("button", name="Add channel").click()
    expect(page.locator("#channel-target-error")).to_contain_text("link-local address")
    assert not NotificationChannel.objects.exists()

    page.get_by_label("Send to").fill(receiver.url("/saga"))
    page.get_by_label("Minimum risk").select_option("high")
    page.get_by_label("Approval requested").check()
    page.get_by_role("button", name="Add channel").click()
    secret = page.locator("#new-secret").inner_text()
    assert len(secret) >= 32
    expect(page.get_by_text("Done: Added channel ops webhook.")).to_be_visible()
    row = page.locator("tr[data-channel='ops webhook']")
    expect(row).to_contain_text("approval.requested")
    expect(row).to_contain_text("High")
    screenshot(page, "notification-channel-added")

    row.get_by_role("button", name="Send test notification to ops webhook").click()
    expect(page.locator(".message-success")).to_contain_text("queued for ops webhook")
    wait_for(lambda: receiver.received, timeout=30, what="the worker to deliver the test")
    [call] = receiver.received
    assert call.path == "/saga" and verify_signature(secret, call.headers, call.raw)
    body = call.json
    assert (body["event"], body["tenant"], body["url"]) == (
        "notification.test",
        "acme",
        "https://saga.test/notifications/",
    )

    notification = Notification.objects.get()
    wait_for(lambda: Notification.objects.filter(pk=notification.pk, status="delivered").exists(), timeout=10)
    page.reload()
    line = page.locator(f"#notification-{notification.pk}")
    expect(line).to_contain_text("Delivered")
    expect(line).to_contain_text("1 of 10")
    screenshot(page, "notifications-delivered")
