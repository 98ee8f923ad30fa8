"""An operator decides hundreds of runs that failed the same way at once, from the queue's filter
bar: the preview, a typed confirmation past the threshold, the live progress bar to the end, an
abort, and the bulk in each run's trail."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from recovery.bulk.models import BulkOperation
from recovery.models import RecoveryItem
from tests.recovery.bulk_support import crm_policies, failing_runs
from tests.support.browser import login, screenshot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

COUNT = 55  # past the typed-confirmation threshold (SAGA_BULK_CONFIRM_THRESHOLD, 50)


def test_an_operator_previews_confirms_follows_and_aborts_a_bulk(page, request, tenant, agent, alice):
    crm_policies()
    updates = failing_runs(tenant, agent, COUNT)
    deletes = failing_runs(tenant, agent, 3, tool="crm.delete_contact", agent_name="cleaner")
    login(page, "alice")

    # Nothing narrows the queue yet: no bulk is offered.
    page.goto("/")
    expect(page.locator("#decide-all")).to_have_count(0)

    # 1. A bulk started while no worker runs, then aborted: nothing is decided.
    aborted = _start_and_abort(page)
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in deletes], status="open").count() == 3

    # 2. The tool's failures: the preview, the typed count, and the progress to the end.
    request.getfixturevalue("rq_worker")
    _preview_confirm_and_follow(page)
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in updates], resolution="closed").count() == COUNT
    # The aborted bulk decided nothing even with a worker running.
    assert BulkOperation.objects.get(pk=aborted.pk).done == 0

    # 3. Each run's trail names the bulk and links to it.
    bulk = BulkOperation.objects.get(filter__tool="crm.update_*")
    page.goto(f"/runs/{updates[0].run_id}/")
    link = page.locator("a.trail-bulk")
    expect(link).to_contain_text(bulk.pk)
    link.click()
    expect(page.locator("#bulk-progress")).to_have_attribute("data-bulk-status", "finished")


def _start_and_abort(page) -> BulkOperation:
    page.get_by_label("Agent").fill("cleaner")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#decide-all")).to_have_text("Decide all 3 matching…")
    page.locator("#decide-all").click()
    expect(page.get_by_role("heading", name="Decide all 3 matching items")).to_be_visible()
    page.get_by_label(re.compile("Reason")).fill("cleanup went wrong")
    page.get_by_role("button", name="Decide all 3").click()
    progress = page.locator("#bulk-progress")
    expect(progress).to_have_attribute("data-bulk-status", "running")
    progress.get_by_label(re.compile("Reason")).fill("wrong agent")
    progress.get_by_role("button", name="Abort").click()
    expect(page.locator(".message-success")).to_contain_text("Aborted")
    expect(page.locator("#bulk-progress")).to_have_attribute("data-bulk-status", "aborted")
    expect(page.locator(".bulk-aborted")).to_contain_text("wrong agent")
    return BulkOperation.objects.get(filter__agent="cleaner")


def _preview_confirm_and_follow(page) -> None:
    page.goto("/")
    page.get_by_label("Tool").fill("crm.update_*")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#decide-all")).to_have_text(f"Decide all {COUNT} matching…")
    page.locator("#decide-all").click()
    preview = page.locator(".bulk-preview")
    expect(preview).to_have_attribute("data-count", str(COUNT))
    expect(preview.locator("[data-risk=low]")).to_contain_text(str(COUNT))
    expect(preview.locator("[data-reason=failed]")).to_contain_text(str(COUNT))
    expect(preview.locator(".needs-approval")).to_have_attribute("data-needs-approval", "0")
    expect(preview.locator(".bulk-sample li")).to_have_count(10)
    screenshot(page, "bulk-preview")

    page.get_by_label("Decision").select_option("close")
    page.get_by_label(re.compile("Reason")).fill("the CRM API was down; the sync reruns tonight")
    page.get_by_label(re.compile("to confirm")).fill(str(COUNT - 1))
    page.get_by_role("button", name=f"Decide all {COUNT}").click()
    expect(page.locator(".field-error")).to_contain_text(f"Type {COUNT}")
    assert not BulkOperation.objects.filter(filter__tool="crm.update_*").exists()
    page.get_by_label(re.compile("to confirm")).fill(str(COUNT))
    page.get_by_role("button", name=f"Decide all {COUNT}").click()

    progress = page.locator("#bulk-progress")
    expect(progress).to_have_attribute("data-bulk-status", "finished", timeout=90_000)
    expect(progress.locator("[data-count=done]")).to_have_text(str(COUNT))
    expect(progress.locator("[data-count=skipped]")).to_have_text("0")
    expect(progress.locator(".bulk-decided li")).to_have_count(50)
    screenshot(page, "bulk-finished")
