"""An operator finds runs that are not in the recovery queue: a succeeded run by its id (the queue
says it names a run it does not list and leads to the Runs page, which opens it), flagged for
review from its page; and a running run by a filter on the Runs page, cancelled from its row."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from ledger.models import Run
from ledger.services import runs
from recovery.models import RecoveryItem
from tests.factories import load_reliability_policies, perform_action
from tests.support.browser import login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_runs(tenant, agent):
    """A welcome e-mail sent (the run succeeded), and a CRM update still running."""
    load_reliability_policies()
    done = runs.run_create(tenant=tenant, actor=agent, agent="mailer", request="Welcome Ashu Kumar")
    perform_action(done, agent, "rel.do_send_welcome", target_id="ashu", args={"to": "ashu"})
    runs.run_complete(run=done, actor=agent)
    running = runs.run_create(tenant=tenant, actor=agent, agent="crm-sync", request="Update Bea's contact")
    perform_action(running, agent, "rel.do_crm_update_contact", target_id="crm-9", args={"name": "Bea"})
    return done, running


def test_an_operator_finds_a_succeeded_run_by_id_and_flags_it(page, two_runs, alice):
    done, _running = two_runs
    login(page, "alice")
    # The queue's search knows the id even though nothing about that run waits for a decision.
    page.get_by_label("Search").fill(done.pk)
    page.get_by_label("Search").press("Enter")
    hint = page.locator(".run-outside-queue")
    expect(hint).to_contain_text("names a run this list does not show")
    expect(hint).to_contain_text("succeeded")
    hint.get_by_role("link", name="Find it on the Runs page").click()
    # The Runs page opens the run an id names.
    expect(page.get_by_role("heading", name="Welcome Ashu Kumar")).to_be_visible()
    assert page.url.endswith(f"/runs/{done.pk}/")
    # Never in the recovery queue: its page is reached from the Runs list, and says so.
    expect(page.get_by_role("navigation", name="Breadcrumb")).to_contain_text("Runs")

    # Or from the Runs page itself, by the nav link and its search box.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs", exact=True).click()
    expect(page.locator(f"tr[data-run='{done.pk}']")).to_be_visible()
    page.get_by_label("Run, action or target id, or text").fill(done.pk)
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_role("heading", name="Welcome Ashu Kumar")).to_be_visible()

    page.get_by_role("link", name="Flag for review…").click()
    panel = page.locator("#flag-panel")
    panel.get_by_label(re.compile("Reason")).fill("Ashu's hire was withdrawn")
    panel.get_by_role("button", name="Confirm: flag for review").click()
    expect(page.locator(".message-success")).to_contain_text("Flagged for review")
    screenshot(page, "runs-flagged")
    item = RecoveryItem.objects.get(run=done)
    assert item.reason == RecoveryItem.Reason.MANUAL and item.status == RecoveryItem.Status.OPEN
    assert Run.objects.get(pk=done.pk).status == Run.Status.SUCCEEDED
    assert page.csp_violations == []


def test_an_operator_finds_a_running_run_by_filter_and_cancels_it_from_its_row(page, two_runs, alice):
    done, running = two_runs
    login(page, "alice")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs", exact=True).click()
    page.get_by_label("Status").select_option("running")
    page.get_by_label("Tool").fill("rel.do_crm_*")
    page.get_by_role("button", name="Find").click()
    row = page.locator(f"tr[data-run='{running.pk}']")
    expect(row).to_be_visible()
    expect(page.locator(f"tr[data-run='{done.pk}']")).to_have_count(0)
    # The filters are in the address, so the list can be shared and reloaded.
    assert "status=running" in page.url and "tool=rel.do_crm_" in page.url
    screenshot(page, "runs-filtered")

    row.get_by_role("link", name=re.compile("Cancel…")).click()
    expect(page.get_by_role("heading", name="Cancel this run")).to_be_visible()
    page.get_by_label(re.compile("Reason")).fill("Bea asked us to stop")
    page.get_by_role("button", name="Confirm: cancel the run").click()
    expect(page.locator(".message-success")).to_contain_text("Run cancelled")
    assert page.url.endswith(f"/runs/{running.pk}/")
    assert Run.objects.get(pk=running.pk).status == Run.Status.CANCELLED

    # Back on the list, the cancelled run offers no Cancel any more.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs", exact=True).click()
    cancelled = page.locator(f"tr[data-run='{running.pk}']")
    expect(cancelled).to_contain_text("Cancelled")
    expect(cancelled.get_by_role("link", name=re.compile("Cancel…"))).to_have_count(0)
    assert page.csp_violations == []
