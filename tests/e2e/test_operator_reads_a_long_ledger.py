"""An operator reads a long run's ledger: the page opens on its newest actions, "Load more" (htmx)
brings each page before them in place, every action once and in order, until there is no more;
the correction trail arrives by a request of its own once the page is up."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.factories import onboarding_run
from tests.support.browser import login

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_loads_a_long_ledger_a_page_at_a_time(
    page, live_server, tenant, agent, alice, monkeypatch
):
    from dashboard.selectors import runs as run_selectors

    # The live server runs in this process: pages of three actions make a seven-action run long.
    monkeypatch.setattr(run_selectors, "RUN_PAGE_ACTIONS", 3)
    run, _item = onboarding_run(tenant, agent, name="Long", email="long@company.com", extra_actions=4)
    seqs = [f"action-{seq}" for seq in run.actions.order_by("seq").values_list("seq", flat=True)]
    assert len(seqs) == 7
    login(page, "alice")
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    actions = page.locator("ol.timeline > li.action")
    expect(actions).to_have_count(3)
    # The trail came by its own request.
    expect(page.locator("#trail")).to_contain_text("What changed")

    for shown in (6, 7):
        page.locator("#load-more").get_by_role("link", name="Load more").click()
        expect(actions).to_have_count(shown)
    expect(page.locator("#load-more")).to_have_count(0)
    # In place, oldest first, each once: the page did not navigate.
    assert [actions.nth(i).get_attribute("id") for i in range(7)] == seqs
    assert page.url.endswith(f"/runs/{run.pk}/")
