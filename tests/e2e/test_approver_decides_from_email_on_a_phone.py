"""An approver opens the Approve link of an approval e-mail on a phone (390 px wide): the
confirmation page shows the exact arguments without scrolling sideways, every control is a tap
target of at least 44 px, and its button decides. The e-mail comes through a real SMTP server
(tests/support/smtp.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from recovery.models import Approval
from tests.support.browser import login, screenshot
from tests.support.email_links import (
    ask_approval,
    deliver_mail,
    email_channel,
    give_address,
    link,
    mail_settings,
    only_mail,
)
from tests.support.smtp import smtp_server

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = 390
TAP_MIN = 44


@pytest.fixture
def smtp(settings, live_server):
    with smtp_server() as server:
        mail_settings(settings, server, live_server)
        yield server


def _fits_a_phone(page, *, controls_shown: int) -> None:
    """No sideways scrolling, and each of the page's ``controls_shown`` controls is a tap target
    of at least 44 px inside the screen."""
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    controls = page.locator(".email-decision .btn, .email-decision textarea")
    assert controls.count() == controls_shown
    for i in range(controls.count()):
        box = controls.nth(i).bounding_box()
        assert box is not None
        assert box["height"] >= TAP_MIN and box["width"] >= TAP_MIN, (i, box)
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE + 0.5, (i, box)
    assert page.csp_violations == []


@pytest.mark.parametrize("signed_in", [False, True], ids=["without-session", "signed-in"])
def test_the_confirmation_page_fits_a_phone_and_decides(page, smtp, tenant, agent, bob, signed_in):
    give_address(bob, "bob@acme.test")
    email_channel(tenant, "bob@acme.test")
    # Arguments a phone must wrap: a long unbroken value and a nested object.
    long_args = {
        "amount": 48200,
        "reference": "INV-" + "7" * 120,
        "payee": {"iban": "DE89370400440532013000"},
    }
    approval = ask_approval(tenant, agent, risk="high" if signed_in else "medium", args=long_args)
    deliver_mail()
    approve = link(only_mail(smtp, "bob@acme.test"), "Approve")

    page.set_viewport_size({"width": PHONE, "height": 844})
    if signed_in:
        login(page, "bob")
    page.goto(approve)
    expect(page.locator("[data-confirm-page]")).to_be_visible()
    expect(page.locator("[data-args]")).to_contain_text("INV-777")
    screenshot(page, f"email-decision-{PHONE}-{'signed-in' if signed_in else 'without-session'}")
    _fits_a_phone(page, controls_shown=3)  # the note, the confirmation, the inbox

    page.get_by_role("button", name="Confirm: approve these arguments").click()
    expect(page.locator("[data-done='approved']")).to_be_visible()
    _fits_a_phone(page, controls_shown=1)  # the inbox
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by == bob
