"""An operator finds the failed onboarding run, previews and confirms Compensate with a reason,
and watches both steps finish, newest action first, carried out by a real worker."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from ledger.models import Compensator
from ledger.services import runs
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.factories import gated_run, load_onboarding_policies, onboarding_run, perform_action
from tests.support.browser import WEBHOOK_SECRET, login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def _other_work(tenant, agent):
    """A realistic queue around the onboarding run: other reasons, risks and ages."""
    load_onboarding_policies()
    crm = runs.run_create(
        tenant=tenant,
        actor=agent,
        agent="crm-agent",
        request="Move Globex deal to stage 3",
        external_id="deal-88",
    )
    perform_action(
        crm,
        agent,
        "crm.update_deal",
        target_id="deal-88",
        args={"stage": 3},
        before={"stage": 2},
        unknown=True,
    )
    for name in ("Lee Wong", "Priya Rao"):
        onboarding_run(tenant, agent, name=name, email=f"{name.split()[0].lower()}@company.com")
    RecoveryItem.objects.filter(run__request__contains="Lee").update(
        opened_at=timezone.now() - timedelta(hours=3)
    )
    gated_run(tenant, agent, amount=120)


def test_an_operator_compensates_the_failed_onboarding_run(
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
    _other_work(tenant, agent)
    run, item = onboarding_run(tenant, agent)

    login(page, "alice")
    expect(page.get_by_role("heading", name="Recovery queue")).to_be_visible()
    expect(page.locator(".sla-flag")).to_have_count(1)
    page.get_by_label("Search").fill("ashu@company.com")
    page.get_by_role("button", name="Apply").click()
    link = page.get_by_role("link", name=re.compile("Onboard new hire Ashu Kumar"))
    expect(link).to_be_visible()
    expect(page.get_by_role("link", name=re.compile("Lee Wong"))).to_have_count(0)
    page.get_by_role("link", name="Reset").click()
    expect(page.get_by_role("link", name=re.compile("Lee Wong"))).to_be_visible()
    screenshot(page, "queue")

    page.get_by_role("link", name=re.compile("Onboard new hire Ashu Kumar")).click()
    expect(page.get_by_role("heading", name=re.compile("Onboard new hire Ashu Kumar"))).to_be_visible()
    page.get_by_role("link", name="Compensate…").click()
    preview = page.locator("#decision-panel")
    expect(preview.get_by_text("Dry run")).to_be_visible()
    rows = preview.locator("table.plan tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("workspace.cancel_license")
    expect(rows.nth(1)).to_contain_text("hr.delete_user")

    preview.get_by_label(re.compile("Reason")).fill("HR withdrew the offer; undo the onboarding")
    preview.get_by_role("button", name="Confirm compensation").click()
    expect(page.get_by_text("Compensation started")).to_be_visible()

    steps = page.locator("#unwind li.step")
    expect(steps).to_have_count(2)
    expect(page.locator("#unwind")).to_have_attribute("data-unwind-status", "completed", timeout=30_000)
    expect(steps.nth(0)).to_have_attribute("data-step-status", "done")
    expect(steps.nth(1)).to_have_attribute("data-step-status", "done")
    expect(steps.nth(0)).to_contain_text("workspace.cancel_license")
    page.reload()
    expect(page.locator("#trail")).to_contain_text("Put back")
    screenshot(page, "run")

    # LIFO: the licence (newest) was cancelled before the account was deleted, each exactly once,
    # every call signed, each step with its own stable idempotency key.
    assert [call.tool for call in compensator_server.calls] == ["workspace.cancel_license", "hr.delete_user"]
    assert compensator_server.rejected == 0
    unwind = Unwind.objects.get(run=run)
    done = list(unwind.steps.order_by("position"))
    assert [s.status for s in done] == [UnwindStep.Status.DONE, UnwindStep.Status.DONE]
    assert done[0].finished_at < done[1].finished_at
    assert [c.idempotency_key for c in compensator_server.calls] == [s.idempotency_key for s in done]
    item.refresh_from_db()
    assert item.resolution == RecoveryItem.Resolution.COMPENSATED
    page.get_by_role("link", name="Insights").click()
    expect(page.get_by_text("100%")).to_be_visible()
    screenshot(page, "insights")
    assert page.csp_violations == []
