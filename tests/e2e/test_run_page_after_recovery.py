"""After an operator's decision, every part of the run page follows the run as it moves on, without
a reload: resumed and then succeeded, the red error becomes history, the "Resume sent, not picked
up" panel goes once the agent acknowledges, and the decision's notice gives way to the outcome;
compensated, the same for "Compensation started". The breadcrumb names the recovery queue the run
is reached from."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from ledger.models import Compensator, Run
from ledger.services import runs
from recovery.actions import commands
from recovery.models import AgentCommand
from tests.factories import onboarding_run
from tests.support.browser import WEBHOOK_SECRET, login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def _watch_console(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


def _open_failed_run(page: Any, run: Run) -> None:
    login(page, "alice")
    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("#run-breadcrumb")).to_contain_text("Recovery queue")
    expect(page.locator("#run-summary [data-run-error='current']")).to_contain_text(f"Error: {run.error}")


def test_resumed_and_then_succeeded_the_page_follows_without_a_reload(
    page, live_server, tenant, agent, alice
):
    run, _item = onboarding_run(tenant, agent)
    errors = _watch_console(page)
    _open_failed_run(page, run)

    page.get_by_role("link", name="Resume…").click()
    panel = page.locator("#decision-panel")
    panel.get_by_label(re.compile("Reason")).fill("The mail gateway's rate limit lifted")
    panel.get_by_role("button", name="Confirm resume").click()

    header = page.locator("#run-summary")
    notices = page.locator("#run-notices")
    wait_panel = page.locator("#resume-wait-slot")
    expect(header).to_have_attribute("data-run-status", "running")
    expect(notices).to_contain_text("Resume command issued")
    expect(wait_panel).to_contain_text("not picked up")
    # Resumed, the failure is history: no red "Error:" on a run that runs again.
    expect(header.locator("[data-run-error='current']")).to_have_count(0)
    expect(header.locator("[data-run-error='history']")).to_contain_text(
        f"Failed earlier: {run.error}, then resumed."
    )
    page.evaluate("window.__sagaNoReload = 'still here'")
    screenshot(page, "run-resume-sent")

    # The agent picks the resume up: the panel and the notice go, the run still runs.
    command = AgentCommand.objects.get(run=run, kind=AgentCommand.Kind.RESUME)
    commands.command_ack(command=command, actor=agent)
    expect(wait_panel.locator("[data-resume-wait]")).to_have_count(0, timeout=15_000)
    expect(notices.locator(".message")).to_have_count(0)
    expect(header).to_have_attribute("data-run-status", "running")

    # It succeeds: the header says so, the notice gives the outcome.
    runs.run_complete(run=Run.objects.get(pk=run.pk), actor=agent)
    expect(header).to_have_attribute("data-run-status", "succeeded", timeout=15_000)
    expect(notices.locator("[data-run-outcome='succeeded']")).to_contain_text("Now: the run succeeded at")
    expect(header.locator("[data-run-error='current']")).to_have_count(0)
    expect(header.locator("[data-run-error='history']")).to_contain_text("then resumed.")
    expect(page.locator("#run-breadcrumb")).to_contain_text("Recovery queue")
    # The correction trail tells the run's state too, and the decided item's error is no alarm.
    expect(page.locator("#trail")).to_contain_text("the run succeeded")
    expect(page.locator("#trail")).not_to_contain_text("the run is running")
    expect(page.locator("#item-summary [data-item-error]")).not_to_have_class("error-text")
    assert page.evaluate("window.__sagaNoReload") == "still here"
    screenshot(page, "run-resumed-succeeded")
    assert errors == [] and page.csp_violations == []


def test_compensated_the_notice_gives_way_to_the_outcome_without_a_reload(
    page, live_server, rq_worker, compensator_server, tenant, agent, alice
):
    for tool in ("workspace.cancel_license", "hr.delete_user"):
        Compensator.objects.create(
            tool=tool,
            kind="webhook",
            url=f"{compensator_server.url}/{tool}",
            secret=WEBHOOK_SECRET,
            source="tests/e2e",
        )
    run, _item = onboarding_run(tenant, agent)
    errors = _watch_console(page)
    _open_failed_run(page, run)

    page.get_by_role("link", name="Compensate…").click()
    panel = page.locator("#decision-panel")
    panel.get_by_label(re.compile("Reason")).fill("HR withdrew the offer; undo the onboarding")
    panel.get_by_role("button", name="Confirm compensation").click()

    header = page.locator("#run-summary")
    notices = page.locator("#run-notices")
    expect(notices).to_contain_text("Compensation started")
    page.evaluate("window.__sagaNoReload = 'still here'")

    # The worker undoes both steps; the page settles, still the same document.
    expect(header).to_have_attribute("data-run-status", "compensated", timeout=30_000)
    expect(notices.locator("[data-run-outcome='compensated']")).to_contain_text(
        "Now: the compensation finished at"
    )
    expect(notices).not_to_contain_text("Compensation started")
    expect(header.locator("[data-run-error='current']")).to_have_count(0)
    expect(header.locator("[data-run-error='history']")).to_contain_text(
        f"Failed earlier: {run.error}, then compensated."
    )
    expect(page.locator("#run-live")).to_have_attribute("data-live", "settled")
    assert page.evaluate("window.__sagaNoReload") == "still here"
    screenshot(page, "run-compensated-notice")
    assert errors == [] and page.csp_violations == []
