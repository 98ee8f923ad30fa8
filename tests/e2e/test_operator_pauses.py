"""An operator pulls the kill switch on a misbehaving tool from the dashboard, by keyboard: the
agent's next call of that tool is refused with 409 paused (over real HTTP), the affected run shows
the pause, and once the operator lifts it the agent's retry goes through."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from ledger.models import Action, Event, Pause
from tests.factories import load_onboarding_policies
from tests.support.browser import login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def _hire(key: str, email: str) -> dict:
    return {
        "tool": "hr.create_user",
        "target_type": "user",
        "target_id": email,
        "args": {"email": email},
        "idempotency_key": key,
    }


def test_an_operator_pauses_a_tool_and_lifts_it(page, live_server, tenant, agent_key, alice):
    load_onboarding_policies()
    agent = httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {agent_key[1]}"}
    )
    run = agent.post("/runs", json={"agent": "onboarding", "request": "Onboard the spring interns"}).json()
    assert (
        agent.post(f"/runs/{run['id']}/actions", json=_hire("hire-1", "ana@company.com")).status_code == 201
    )

    pause = _pause_the_hr_tools(page)

    # The agent's next call of that tool is refused, naming the pause; nothing is recorded.
    refused = agent.post(f"/runs/{run['id']}/actions", json=_hire("hire-2", "ben@company.com"))
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert (error["code"], error["details"]["pause_id"]) == ("paused", pause.pk)
    assert "HR API creates duplicate users, INC-7" in error["message"]
    assert not Action.objects.filter(idempotency_key="hire-2").exists()

    # The affected run says so.
    page.goto(f"/runs/{run['id']}/")
    banner = page.locator("[data-pause-banner]")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Tool hr.* is paused by alice")
    expect(banner).to_contain_text("HR API creates duplicate users, INC-7")
    expect(page.locator("#audit")).to_contain_text("action.refused")
    screenshot(page, "pause-banner")

    _lift_the_pause(banner, page)

    # The agent retries and proceeds; the run no longer shows the banner.
    retried = agent.post(f"/runs/{run['id']}/actions", json=_hire("hire-2", "ben@company.com"))
    assert retried.status_code == 201, retried.text
    page.goto(f"/runs/{run['id']}/")
    expect(page.locator("[data-pause-banner]")).to_have_count(0)
    kinds = list(Event.objects.filter(tenant=tenant, run__isnull=True).values_list("kind", "actor_label"))
    assert ("pause.created", "alice") in kinds and ("pause.lifted", "alice") in kinds
    assert page.csp_violations == []
    agent.close()


def _pause_the_hr_tools(page) -> Pause:
    # The operator finds the Pauses page from the navigation and pauses the HR tools.
    login(page, "alice")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Pauses").click()
    expect(page.get_by_role("heading", name="Pauses", exact=True)).to_be_visible()
    expect(page.get_by_text("Nothing is paused")).to_be_visible()
    page.get_by_label(re.compile("^Tool")).focus()
    page.keyboard.type("hr.*")
    page.keyboard.press("Tab")
    page.keyboard.type("HR API creates duplicate users, INC-7")
    page.keyboard.press("Enter")

    # Nothing happens before the confirmation, which says exactly what will be refused.
    panel = page.locator("#pause-form-panel")
    expect(panel.get_by_role("heading", name="Confirm the pause")).to_be_focused()
    expect(panel).to_contain_text("New actions of tool hr.* are refused with 409 paused, in every run")
    expect(panel).to_contain_text("Right now 1 running run matches")
    assert not Pause.objects.exists()
    screenshot(page, "pause-confirm")
    page.keyboard.press("Tab")
    expect(panel.get_by_role("button", name="Confirm pause")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_text(re.compile("Done: Paused tool hr.*"))).to_be_visible()
    active = page.locator("table.pauses-active tbody tr")
    expect(active).to_have_count(1)
    expect(active.first).to_contain_text("HR API creates duplicate users, INC-7")
    expect(active.first).to_contain_text("alice")
    return Pause.objects.get()


def _lift_the_pause(banner, page) -> None:
    # The fix is out: the operator lifts the pause, by keyboard too.
    banner.get_by_role("link", name="See all pauses").click()
    lift = page.get_by_role("link", name=re.compile("Lift pause of hr"))
    lift.focus()
    page.keyboard.press("Enter")
    decision = page.locator("#decision-panel")
    expect(decision.get_by_role("heading", name=re.compile("Lift the pause of tool hr"))).to_be_focused()
    expect(decision).to_contain_text("New actions of tool hr.* are accepted again")
    page.keyboard.press("Tab")
    page.keyboard.type("Fixed in hr-api 2.3.1")
    page.keyboard.press("Enter")
    expect(page.get_by_text(re.compile("Done: Lifted"))).to_be_visible()
    expect(page.get_by_text("Nothing is paused")).to_be_visible()
    expect(page.locator("table.pauses-lifted tbody tr").first).to_contain_text("Fixed in hr-api 2.3.1")
    screenshot(page, "pauses-lifted")
