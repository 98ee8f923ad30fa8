"""An operator cancels a running run from its page: the confirmation says exactly what will happen,
the page and the queue then show the cancelled run, and the agent's next write is refused."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from ledger.models import Action, Run
from ledger.services import runs
from ledger.services.actions import moves
from recovery.models import AgentCommand, RecoveryItem
from tests.factories import load_onboarding_policies, perform_action, record
from tests.support.browser import login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_cancels_a_running_run_and_the_agent_is_stopped(
    page, live_server, tenant, agent, agent_key, alice
):
    load_onboarding_policies()
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="onboarding-agent", request="Onboard new hire Ashu Kumar"
    )
    perform_action(run, agent, "hr.create_user", target_id="ashu", args={"email": "ashu@company.com"})
    licence = record(
        run, agent, "licence", tool="workspace.provision_license", args={"email": "ashu@company.com"}
    )
    moves.action_start(action=licence, actor=agent)

    login(page, "alice")
    page.goto(f"/runs/{run.pk}/")
    expect(page.get_by_role("heading", name="Onboard new hire Ashu Kumar")).to_be_visible()

    # Keyboard only: tab to "Cancel run…", open the confirmation, type the reason, press Enter.
    opener = page.get_by_role("link", name="Cancel run…")
    opener.focus()
    expect(opener).to_be_focused()
    page.keyboard.press("Enter")
    panel = page.locator("#cancel-panel")
    effects = panel.locator(".cancel-effects")
    expect(effects.locator("[data-effect=unknown]")).to_contain_text("1 running action becomes")
    expect(effects.locator("[data-effect=unknown]")).to_contain_text("workspace.provision_license")
    expect(effects.locator("[data-effect=queue]")).to_contain_text("1 succeeded action stays as it is")
    expect(effects.locator("[data-effect=queue]")).to_contain_text("hr.create_user")
    expect(effects.locator("[data-effect=told]")).to_contain_text("next heartbeat")
    screenshot(page, "cancel-confirm")
    # Nothing has happened yet.
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING

    reason = panel.get_by_label(re.compile("Reason"))
    reason.focus()
    page.keyboard.press("Enter")  # an empty reason is stopped by the browser
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    page.keyboard.type("Ashu declined the offer")
    page.keyboard.press("Enter")

    expect(page.locator(".message-success")).to_contain_text("Run cancelled")
    expect(page.locator(".run-header .badge").first).to_have_text(re.compile("Cancelled"))
    expect(page.get_by_role("link", name="Cancel run…")).to_have_count(0)
    item_panel = page.locator(".item-panel")
    expect(item_panel).to_contain_text("Run cancelled")
    expect(item_panel).to_contain_text("Ashu declined the offer")
    # The licence call's outcome is unknown now: the operator is offered to reconcile it.
    expect(page.locator(f"#action-{licence.seq}")).to_contain_text("Outcome unknown")
    expect(page.locator(f"#action-{licence.seq} form.reconcile")).to_be_visible()
    screenshot(page, "cancelled-run")

    page.get_by_role("link", name="Recovery queue").first.click()
    row = page.get_by_role("link", name=re.compile("Onboard new hire Ashu Kumar"))
    expect(row).to_be_visible()
    expect(page.locator("tr", has=row)).to_contain_text("Run cancelled")

    _check_the_agent_is_stopped(live_server.url, agent_key[1], run.pk)
    assert Action.objects.get(pk=licence.pk).status == Action.Status.UNKNOWN
    assert RecoveryItem.objects.get(run=run).reason == RecoveryItem.Reason.CANCELLED
    assert AgentCommand.objects.get(run=run).created_by == alice
    assert page.csp_violations == []


def _check_the_agent_is_stopped(base_url: str, secret: str, run_id: str) -> None:
    # The agent's next write is refused, naming the state; its heartbeat carries the cancel.
    with httpx.Client(base_url=f"{base_url}/api/v1", headers={"Authorization": f"Bearer {secret}"}) as http:
        late = http.post(
            f"/runs/{run_id}/actions",
            json={"tool": "email.send_welcome", "idempotency_key": "welcome-ashu", "args": {}},
        )
        assert late.status_code == 409
        assert late.json()["error"]["code"] == "run_not_accepting_actions"
        assert late.json()["error"]["details"]["current"] == "cancelled"
        beat = http.post(f"/runs/{run_id}/heartbeat", json={})
        assert [c["kind"] for c in beat.json()["commands"]] == ["cancel"]
