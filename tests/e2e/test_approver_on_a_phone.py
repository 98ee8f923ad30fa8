"""A phone is enough: on a 390 px screen an approver approves, rejects, and edits the arguments
before approving, from the inbox; confirms a Slack press; an operator compensates a failed run;
and the outbox shows each channel's last delivery. Every page on the way fits the screen — no
sideways scrolling, every control at least 44 px to tap (``tests.support.fit``) — and the same
pages still fit a laptop's screen."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from ledger.models import Action, Compensator
from recovery import slack
from recovery.models import Approval, Notification, NotificationChannel
from tests.factories import gated_run, onboarding_run
from tests.support.browser import WEBHOOK_SECRET, login, screenshot
from tests.support.fit import misfits

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1280, "height": 900}


def _fits(page, name: str, *, full_page: bool = True) -> None:
    expect(page.locator("main")).to_be_visible()
    screenshot(page, name, full_page=full_page)
    problems = misfits(page)
    assert problems == [], (name, problems)


@pytest.fixture
def phone(browser, live_server):
    context = browser.new_context(
        base_url=live_server.url, viewport=PHONE, device_scale_factor=1, is_mobile=True, has_touch=True
    )
    page = context.new_page()
    yield page
    context.close()


def _slack_press_page(phone, pressed: Approval, user) -> str:
    """A Slack press's confirmation page, as the link in Slack opens it on the phone; its token."""
    token = slack.press_token(
        slack.PressRequest(
            approval_id=pressed.pk,
            user_id=user.pk,
            approve=True,
            args_hash=pressed.args_hash,
            slack_user="T0ACME/UDAVE",
        )
    )
    phone.goto(f"/account/slack/confirm/{token}/")
    expect(phone.get_by_role("button", name=re.compile("Confirm: approve"))).to_be_visible()
    _fits(phone, "phone-slack-confirm")
    pressed.refresh_from_db()
    assert pressed.status == Approval.Status.PENDING
    return token


def test_an_approver_decides_from_a_phone(phone, tenant, agent, dave):
    _r1, approved_action, to_approve = gated_run(tenant, agent, amount=40)
    _r2, _rejected_action, to_reject = gated_run(tenant, agent, amount=75)
    edited_run, edited_action, to_edit = gated_run(tenant, agent, amount=120)
    _r4, _a4, pressed = gated_run(tenant, agent, amount=15)

    login(phone, "dave")
    phone.goto("/approvals/")
    expect(phone.locator("[data-approval]")).to_have_count(4)
    _fits(phone, "phone-inbox", full_page=False)
    _fits(phone, "phone-inbox-full")
    # The run's own page shows its approval too.
    phone.goto(f"/runs/{edited_run.pk}/")
    expect(phone.locator("#run-approvals-slot")).to_contain_text("payments.refund")
    _fits(phone, "phone-run-approval")
    # One approval's page, as a Teams card's Approve… opens it: the decision chosen, to confirm.
    phone.goto(f"/approvals/?approval={pressed.pk}&decide=approve")
    expect(phone.locator("[data-approval]")).to_have_count(1)
    _fits(phone, "phone-one-approval")
    phone.goto("/approvals/")

    card = phone.locator(f"#approval-{to_approve.pk}")
    card.get_by_label("Reason to approve").fill("Double charge confirmed")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_contain_text("Approved by dave")
    _fits(phone, "phone-approved")

    card = phone.locator(f"#approval-{to_reject.pk}")
    card.get_by_label("Reason to reject").fill("Not a double charge")
    card.get_by_role("button", name="Reject").click()
    expect(card).to_contain_text("Rejected by dave")
    _fits(phone, "phone-rejected")

    card = phone.locator(f"#approval-{to_edit.pk}")
    card.get_by_text("Edit arguments before approving").click()
    arguments = card.locator("textarea")
    expect(arguments).to_be_visible()
    _fits(phone, "phone-edit-open")
    arguments.fill('{"amount": 100, "currency": "EUR"}')
    card.get_by_label("Reason to approve").fill("Refund the ticket price only")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_contain_text("Approved by dave")
    _fits(phone, "phone-edited")

    for approval, status in ((to_approve, "approved"), (to_reject, "rejected"), (to_edit, "approved")):
        approval.refresh_from_db()
        assert approval.status == status
    edited_action.refresh_from_db()
    assert edited_action.args == {"amount": 100, "currency": "EUR"}
    approved_action.refresh_from_db()
    assert approved_action.status == Action.Status.APPROVED

    token = _slack_press_page(phone, pressed, dave)

    # The approval pages fit a laptop too.
    phone.set_viewport_size(LAPTOP)
    phone.goto("/approvals/")
    phone.locator(f"#approval-{pressed.pk}").get_by_text("Edit arguments before approving").click()
    _fits(phone, "laptop-inbox")
    phone.goto(f"/account/slack/confirm/{token}/")
    _fits(phone, "laptop-slack-confirm")


def test_an_operator_compensates_from_a_phone(phone, compensator_server, tenant, agent, dave):
    for tool in ("workspace.cancel_license", "hr.delete_user"):
        Compensator.objects.create(
            tool=tool,
            kind="webhook",
            url=f"{compensator_server.url}/{tool}",
            secret=WEBHOOK_SECRET,
            source="tests/e2e",
        )
    run, item = onboarding_run(tenant, agent)
    # The outbox: a delivery to one channel and a failure on the installation's webhook.
    channel = NotificationChannel.objects.create(
        tenant=tenant, name="ops-mail", kind="email", target="ops@example.com"
    )
    Notification.objects.create(
        tenant=tenant,
        channel=channel,
        channel_name=channel.name,
        kind="email",
        event="item.opened",
        subject_id=item.pk,
        status="delivered",
    )

    login(phone, "dave")
    phone.goto(f"/runs/{run.pk}/")
    expect(phone.get_by_role("heading", name=re.compile("Onboard new hire"))).to_be_visible()
    _fits(phone, "phone-run")

    phone.goto(f"/items/{item.pk}/compensate")
    rows = phone.locator("table.plan tbody tr")
    expect(rows).to_have_count(2)
    _fits(phone, "phone-compensate")
    # Keep the account (untick it, by its label: the tap target): a partial undo is reviewed first.
    keep = rows.nth(1).locator("label")
    keep.click()
    expect(rows.nth(1).locator("input[type=checkbox]")).not_to_be_checked()
    phone.get_by_label(re.compile("Reason")).fill("HR withdrew the offer; keep the account")
    phone.get_by_role("button", name="Confirm compensation").click()
    expect(phone.get_by_role("heading", name=re.compile("Confirm: undo 1 action, keep 1"))).to_be_visible()
    _fits(phone, "phone-compensate-review")
    phone.get_by_label(re.compile("Reason")).fill("HR withdrew the offer; keep the account")
    phone.get_by_role("button", name="Confirm compensation").click()
    expect(phone.get_by_text("Compensation started")).to_be_visible()
    _fits(phone, "phone-run-compensating")

    phone.goto("/notifications/")
    status = phone.locator(f"[data-channel-status='{channel.pk}']")
    expect(status).to_contain_text("item.opened")
    _fits(phone, "phone-outbox")
    # Where a channel is set up and tested, too.
    phone.goto("/notifications/settings/")
    expect(phone.get_by_role("button", name="Send test notification to ops-mail")).to_be_visible()
    _fits(phone, "phone-notification-settings")

    phone.set_viewport_size(LAPTOP)
    for path, name in (
        (f"/runs/{run.pk}/", "laptop-run"),
        (f"/items/{item.pk}/compensate", "laptop-compensate"),
        ("/notifications/", "laptop-outbox"),
        ("/notifications/settings/", "laptop-notification-settings"),
    ):
        phone.goto(path)
        _fits(phone, name)
