"""An operator starts compensating the failed onboarding run, then, while its first step's call is
in flight, stops the unwind from the run page (keyboard, reason, confirmation that lists what each
step will do). The step in flight finishes, the next one never starts, and the run is back in the
recovery queue saying what was undone and what was not."""

from __future__ import annotations

import re
import threading
import time

import pytest
from playwright.sync_api import expect

from ledger.models import Action, Compensator
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.factories import onboarding_run
from tests.support.browser import WEBHOOK_SECRET, login, screenshot
from tests.support.processes import Reply, serve_webhooks, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

LICENSE, USER = "/workspace/cancel_license", "/hr/delete_user"


def test_an_operator_stops_a_running_unwind_between_steps(page, live_server, rq_worker, tenant, agent, alice):
    held = threading.Event()
    with serve_webhooks({LICENSE: WEBHOOK_SECRET, USER: WEBHOOK_SECRET}) as tools:
        tools.script[LICENSE] = [Reply(200, {"state": {"license": None}}, block=held)]
        for tool, path in (("workspace.cancel_license", LICENSE), ("hr.delete_user", USER)):
            Compensator.objects.create(
                tool=tool, kind="webhook", url=tools.url(path), secret=WEBHOOK_SECRET, source="tests/e2e"
            )
        run, item = onboarding_run(tenant, agent)

        login(page, "alice")
        page.goto(f"/runs/{run.pk}/")
        page.get_by_role("link", name="Compensate…").click()
        preview = page.locator("#decision-panel")
        preview.get_by_label(re.compile("Reason")).fill("HR withdrew the offer")
        preview.get_by_role("button", name="Confirm compensation").click()
        steps = page.locator("#unwind li.step")
        expect(steps.nth(0)).to_have_attribute("data-step-status", "running", timeout=30_000)
        wait_for(lambda: tools.calls_to(LICENSE), timeout=20, what="the licence step's call")

        # Keyboard: focus the lever and press Enter; the confirmation says what each step will do.
        stop = page.get_by_role("link", name="Stop unwind…")
        stop.focus()
        stop.press("Enter")
        panel = page.locator("#stop-panel")
        expect(panel.get_by_role("heading", name="Stop this compensation")).to_be_visible(timeout=15_000)
        expect(panel.locator('[data-effect="finishes"]')).to_contain_text("workspace.cancel_license")
        expect(panel.locator('[data-effect="not-started"]')).to_contain_text("hr.delete_user")
        panel.get_by_label(re.compile("Reason")).fill("The hire is back on: keep the account")
        screenshot(page, "stop-unwind")
        panel.get_by_role("button", name="Confirm: stop the compensation").click()

        expect(page.locator(".message-success")).to_contain_text("Compensation stopped", timeout=15_000)
        expect(page.locator("#unwind")).to_have_attribute("data-unwind-status", "cancelled")
        expect(page.locator("#unwind-title")).to_contain_text("Stopped")
        # The call in flight finishes and is recorded; nothing starts after it.
        held.set()
        unwind = Unwind.objects.get(run=run)
        wait_for(
            lambda: unwind.steps.get(position=0).status == UnwindStep.Status.DONE,
            timeout=20,
            what="the step in flight to finish",
        )
        time.sleep(1.5)
        page.reload()
        expect(steps.nth(0)).to_have_attribute("data-step-status", "done")
        expect(steps.nth(1)).to_have_attribute("data-step-status", "pending")
        expect(steps.nth(1)).to_contain_text("Not started")
        # The item is back in the queue, open, with what was undone and what was not.
        expect(page.locator(".item-panel")).to_contain_text("Compensation stopped by alice")
        expect(page.locator(".item-panel")).to_contain_text("Not undone: hr.create_user")
        expect(page.get_by_role("link", name="Compensate…")).to_be_visible()
        page.get_by_role("link", name="Recovery queue").first.click()
        expect(page.get_by_role("link", name=re.compile("Onboard new hire Ashu Kumar"))).to_be_visible()
        assert tools.calls_to(USER) == []

    assert unwind.steps.get(position=1).status == UnwindStep.Status.PENDING
    item.refresh_from_db()
    assert item.status == RecoveryItem.Status.OPEN and "stopped" in item.details
    assert Action.objects.get(run=run, tool="hr.create_user").status == Action.Status.SUCCEEDED
    assert Action.objects.get(run=run, tool="workspace.provision_license").status == Action.Status.COMPENSATED
    assert page.csp_violations == []
