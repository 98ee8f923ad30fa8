"""An operator works the recovery queue with the keyboard, with the approvers' key handling
(dashboard/static/js/app.js): j/k move a visible selection between items, Enter opens the selected
one, and keys typed into the search field stay in it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.factories import onboarding_run
from tests.support.browser import login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_moves_through_the_queue_and_opens_an_item_with_the_keyboard(
    page, live_server, tenant, agent, alice
):
    first, _ = onboarding_run(tenant, agent, name="Ashu Kumar", email="ashu@company.com")
    second, _ = onboarding_run(tenant, agent, name="Bea Lind", email="bea@company.com")

    login(page, "alice")
    rows = page.locator("[data-keyboard-entry]")
    expect(rows).to_have_count(2)
    # Newest first: Bea's run, then Ashu's.
    expect(rows.nth(0)).to_contain_text("Bea Lind")

    # Typing j into the search field is text, not a move.
    search = page.get_by_label("Search")
    search.click()
    page.keyboard.type("jk")
    expect(search).to_have_value("jk")
    expect(page.locator(".queue-row.is-current")).to_have_count(0)
    page.keyboard.press("Escape")
    search.fill("")
    search.evaluate("el => el.blur()")

    page.keyboard.press("j")
    expect(rows.nth(0)).to_be_focused()
    expect(page.locator(".queue-row.is-current")).to_have_count(1)
    page.keyboard.press("j")
    page.keyboard.press("j")  # past the end stays on the last
    expect(rows.nth(1)).to_be_focused()
    page.keyboard.press("k")
    expect(rows.nth(0)).to_be_focused()
    expect(page.locator(".queue-row.is-current")).to_contain_text("Bea Lind")
    screenshot(page, "queue-keyboard")

    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live_server.url}/runs/{second.pk}/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Bea Lind")
    assert first.pk != second.pk
    assert page.csp_violations == []
