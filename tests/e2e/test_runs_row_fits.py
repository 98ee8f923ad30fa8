"""A running run's row on the Runs page keeps its decisions (Cancel…, Flag…) inside the row and on
the screen, on a phone (390 px) and on a laptop (1280 px): no horizontal scrolling to reach them."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from ledger.services import runs
from tests.factories import load_reliability_policies, perform_action
from tests.support.browser import login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("width", [390, 1280])
def test_a_running_rows_decisions_fit_in_the_row(page, tenant, agent, alice, width):
    load_reliability_policies()
    running = runs.run_create(
        tenant=tenant,
        actor=agent,
        agent="crm-sync-agent-with-a-long-name",
        request="Update Bea's contact details in the CRM and tell the account team about the change",
        external_id="crm-contact-update-000912",
    )
    perform_action(running, agent, "rel.do_crm_update_contact", target_id="crm-9", args={"name": "Bea"})
    page.set_viewport_size({"width": width, "height": 900})
    login(page, "alice")
    page.goto("/runs/")
    row = page.locator(f"tr[data-run='{running.pk}']")
    cell = row.locator(".row-decisions")
    buttons = cell.locator(".btn")
    expect(buttons).to_have_count(2)
    screenshot(page, f"runs-row-{width}")

    # Nothing in the row or its decisions cell is wider than its box.
    for element in (row, cell, page.locator("#runs-results .table-wrap")):
        widths = element.evaluate("el => [el.scrollWidth, el.clientWidth]")
        assert 0 < widths[0] <= widths[1], widths
    # Each button lies inside the row, inside its cell, and on the screen.
    row_box, cell_box = row.bounding_box(), cell.bounding_box()
    assert row_box is not None and cell_box is not None
    for i in range(2):
        box = buttons.nth(i).bounding_box()
        assert box is not None
        for outer in (row_box, cell_box):
            assert outer["x"] <= box["x"] and box["x"] + box["width"] <= outer["x"] + outer["width"] + 0.5
            assert outer["y"] <= box["y"] and box["y"] + box["height"] <= outer["y"] + outer["height"] + 0.5
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
    # And the page itself does not scroll sideways.
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert page.csp_violations == []
