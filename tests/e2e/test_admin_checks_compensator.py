"""An admin checks a compensator from the policies page before the bad day: both compensators are
flagged as never checked, one is checked (only harmless calls reach it), its flag goes and its
result shows; the compensation plan preview of a failed run then flags only the other one."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from playwright.sync_api import expect
from saga_client.signing import verify_signature

from ledger.models import Compensator
from recovery.models import CompensatorCheck
from tests.factories import onboarding_run
from tests.support.browser import login, screenshot
from tests.support.reference_compensator import SECRET, Flaws, reference_compensator

pytestmark = pytest.mark.django_db(transaction=True)

NEVER = "This compensator has never been checked."


def test_an_admin_checks_a_compensator_and_the_plan_preview_flags_the_unchecked_one(
    page, live_server, tenant, agent, dave
) -> None:
    run, item = onboarding_run(tenant, agent)
    with reference_compensator(Flaws()) as (base, reference):
        for tool in ("hr.delete_user", "workspace.cancel_license"):
            Compensator.objects.create(
                tool=tool, kind="webhook", url=f"{base}/cancel", secret=SECRET, source="tests/e2e"
            )

        login(page, "dave")
        page.goto(reverse("dashboard:policies"))
        rows = page.locator("tr[data-compensator]")
        expect(rows).to_have_count(2)
        expect(page.locator("tr[data-check-flag]")).to_have_count(2)
        hr = page.locator('tr[data-compensator="hr.delete_user"]')
        expect(hr).to_contain_text(NEVER)
        hr.get_by_role("button", name="Check").click()

        expect(
            page.get_by_text("hr.delete_user: its compensator passed the harmless checks.")
        ).to_be_visible()
        hr = page.locator('tr[data-compensator="hr.delete_user"]')
        expect(hr.locator(".badge")).to_have_text("passed")
        expect(hr.locator('li[data-case="wrong_signature_refused"]')).to_have_attribute(
            "data-verdict", "pass"
        )
        expect(hr).not_to_contain_text(NEVER)
        expect(page.locator('tr[data-compensator="workspace.cancel_license"]')).to_contain_text(NEVER)
        screenshot(page, "policies-compensator-check")

    # What reached the compensator: three calls, none validly signed, nothing undone.
    assert len(reference.received) == 3
    assert not any(verify_signature(SECRET, headers, raw) for headers, raw in reference.received)
    assert reference.state() == {"active": True, "cancellations": 0}
    assert CompensatorCheck.objects.get().checked_by == dave

    page.goto(reverse("dashboard:item-compensate", args=[item.pk]))
    plan = page.locator("table.plan tbody tr")
    expect(plan).to_have_count(2)
    licence = plan.filter(has_text="workspace.cancel_license")
    expect(licence.locator("[data-check-flag]")).to_have_text(re.compile(re.escape(NEVER)))
    expect(plan.filter(has_text="hr.delete_user").locator("[data-check-flag]")).to_have_count(0)
    assert page.csp_violations == []
