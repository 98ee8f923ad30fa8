"""An approver works the inbox with the keyboard: j moves, a goes to the reason (never past it),
Enter submits the approval."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from ledger.models import Action
from recovery.models import Approval
from tests.factories import gated_run
from tests.support.browser import login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_approver_approves_a_gated_action_with_the_keyboard(page, live_server, tenant, agent, bob):
    _run, first_action, first = gated_run(tenant, agent, amount=40)
    _run, second_action, second = gated_run(tenant, agent, amount=75)

    login(page, "bob")
    expect(page.get_by_role("link", name="Approvals 2 pending")).to_be_visible()
    page.get_by_role("link", name="Approvals 2 pending").click()
    cards = page.locator("[data-approval]")
    expect(cards).to_have_count(2)
    screenshot(page, "approvals")

    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(cards.nth(1)).to_be_focused()
    page.keyboard.press("k")
    expect(cards.nth(0)).to_be_focused()

    # "a" lands in the reason field; it does not approve anything by itself.
    page.keyboard.press("a")
    reason = cards.nth(0).get_by_label("Reason to approve")
    expect(reason).to_be_focused()
    first.refresh_from_db()
    assert first.status == Approval.Status.PENDING

    # Enter with an empty reason is stopped by the browser (required); nothing is sent.
    page.keyboard.press("Enter")
    first.refresh_from_db()
    assert first.status == Approval.Status.PENDING

    page.keyboard.type("Double charge confirmed in the ledger")
    page.keyboard.press("Enter")
    expect(page.locator(f"#approval-{first.pk}")).to_contain_text("Approved by bob")

    first.refresh_from_db()
    first_action.refresh_from_db()
    assert (
        first.status == Approval.Status.APPROVED and first.reason == "Double charge confirmed in the ledger"
    )
    assert first_action.status == Action.Status.APPROVED
    second.refresh_from_db()
    assert second.status == Approval.Status.PENDING

    # Escape leaves the field; r then goes to the reject reason of the current card.
    page.keyboard.press("Escape")
    page.keyboard.press("j")
    page.keyboard.press("r")
    expect(page.locator(f"#approval-{second.pk}").get_by_label("Reason to reject")).to_be_focused()
    assert page.csp_violations == []
