"""HR cancels a hire after onboarding succeeded: an operator flags the succeeded run from its page,
then undoes only the licence — one action of three — confirming the exact selection, and watches
a real worker carry it out while the HR record and the intro meeting stay."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from ledger.models import Action, Compensator, Run, ToolPolicy
from ledger.services import runs
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.factories import load_onboarding_policies, perform_action
from tests.support.browser import WEBHOOK_SECRET, login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"


def _onboarded(tenant, agent, compensator_server) -> tuple[Run, list[Action]]:
    """A succeeded onboarding run with three undoable actions."""
    load_onboarding_policies()
    ToolPolicy.objects.create(
        tool="calendar.book_intro",
        risk="low",
        approval="auto",
        action_class="external_reversible",
        compensation="custom",
        compensation_tool="calendar.cancel_event",
    )
    ToolPolicy.objects.create(
        tool="calendar.cancel_event", risk="low", approval="auto", action_class="internal_update"
    )
    for tool in ("hr.delete_user", "workspace.cancel_license", "calendar.cancel_event"):
        Compensator.objects.create(
            tool=tool,
            kind="webhook",
            url=f"{compensator_server.url}/{tool}",
            secret=WEBHOOK_SECRET,
            source="tests/e2e",
        )
    run = runs.run_create(
        tenant=tenant,
        actor=agent,
        agent="onboarding-agent",
        request=f"Onboard new hire Ashu Kumar ({EMAIL})",
        external_id="hire-42",
    )
    done = [
        perform_action(
            run,
            agent,
            tool,
            target_id=EMAIL,
            args=args,
            compensation={"tool": undo, "args": {"email": EMAIL}},
        )
        for tool, undo, args in (
            ("hr.create_user", "hr.delete_user", {"name": "Ashu Kumar", "email": EMAIL}),
            ("workspace.provision_license", "workspace.cancel_license", {"sku": "business-standard"}),
            ("calendar.book_intro", "calendar.cancel_event", {"with": "team", "email": EMAIL}),
        )
    ]
    runs.run_complete(run=run, actor=agent, summary="Account, licence and intro meeting")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED
    return run, done


def test_an_operator_flags_a_succeeded_run_and_undoes_one_chosen_action(
    page, live_server, rq_worker, compensator_server, tenant, agent, alice
):
    run, (create_user, license, intro) = _onboarded(tenant, agent, compensator_server)
    login(page, "alice")
    page.goto(f"/runs/{run.pk}/")
    expect(page.get_by_role("heading", name="Onboard new hire Ashu Kumar")).to_be_visible()
    # A succeeded run has no decision yet: only the flag.
    expect(page.get_by_role("link", name="Compensate…")).to_have_count(0)

    item = _flag_for_review(page, run)
    _choose_the_licence_only(page, license, kept=(create_user, intro))
    _confirm_the_selection(page, run)
    _watch_it_finish(page, license, kept=(create_user, intro))

    # Only the licence was cancelled, once, signed; the other two actions stand.
    assert [call.tool for call in compensator_server.calls] == ["workspace.cancel_license"]
    assert compensator_server.rejected == 0
    statuses = {a.tool: a.status for a in Action.objects.filter(run=run)}
    assert statuses == {
        "hr.create_user": "succeeded",
        "workspace.provision_license": "compensated",
        "calendar.book_intro": "succeeded",
    }
    unwind = Unwind.objects.get(run=run)
    assert [s.status for s in unwind.steps.all()] == [UnwindStep.Status.DONE]
    assert Run.objects.get(pk=run.pk).status == Run.Status.CLOSED
    item.refresh_from_db()
    assert item.resolution == RecoveryItem.Resolution.COMPENSATED
    assert page.csp_violations == []


def _flag_for_review(page, run: Run) -> RecoveryItem:
    # --- Flag the succeeded run for review (keyboard: focus the link, Enter) ---
    page.get_by_role("link", name="Flag for review…").focus()
    page.keyboard.press("Enter")
    panel = page.locator("#flag-panel")
    expect(panel.get_by_text("Puts the run in the recovery queue")).to_be_visible()
    panel.get_by_label("Reason").fill("HR cancelled the hire after onboarding")
    page.keyboard.press("Enter")
    expect(page.locator(".message-success")).to_contain_text("Flagged for review")
    expect(page.locator(".item-panel")).to_contain_text("Manual")
    item = RecoveryItem.objects.get(run=run)
    assert (item.reason, item.status) == ("manual", "open")
    assert Run.objects.get(pk=run.pk).status == Run.Status.SUCCEEDED
    return item


def _choose_the_licence_only(page, license: Action, *, kept: tuple[Action, ...]) -> None:
    # --- Choose: untick the HR record and the intro meeting (keyboard: Space) ---
    page.get_by_role("link", name="Compensate…").click()
    preview = page.locator("#decision-panel")
    rows = preview.locator("table.plan tbody tr")
    expect(rows).to_have_count(3)
    for action in kept:
        box = preview.get_by_label(f"Undo #{action.seq} {action.tool}")
        expect(box).to_be_checked()
        box.focus()
        page.keyboard.press("Space")
        expect(box).not_to_be_checked()
    expect(preview.get_by_label(f"Undo #{license.seq} {license.tool}")).to_be_checked()
    preview.get_by_label("Reason").fill("Offer withdrawn: cancel the licence, HR keeps the record")
    preview.get_by_role("button", name="Confirm compensation").click()


def _confirm_the_selection(page, run: Run) -> None:
    # --- Confirm: exactly what runs, and what is kept; nothing has run yet ---
    review = page.locator(".preview-compensate[data-stage='review']")
    expect(review.get_by_role("heading", name="Confirm: undo 1 action, keep 2")).to_be_visible()
    undo_list = review.locator("ol.plan-undo li")
    expect(undo_list).to_have_count(1)
    expect(undo_list.first).to_contain_text("workspace.provision_license")
    expect(undo_list.first).to_contain_text("workspace.cancel_license")
    kept_list = review.locator("ul.plan-kept li")
    expect(kept_list).to_have_count(2)
    expect(kept_list.nth(0)).to_contain_text("calendar.book_intro")
    expect(kept_list.nth(1)).to_contain_text("hr.create_user")
    expect(review.get_by_label("Reason")).to_have_value(
        "Offer withdrawn: cancel the licence, HR keeps the record"
    )
    assert not Unwind.objects.filter(run=run).exists()
    screenshot(page, "partial-undo-confirm")
    review.get_by_role("button", name="Confirm compensation").focus()
    page.keyboard.press("Enter")


def _watch_it_finish(page, license: Action, *, kept: tuple[Action, ...]) -> None:
    # --- Watch it finish on the run page ---
    expect(page.locator(".message-success")).to_contain_text("Compensation started: 1 step(s)")
    unwind_panel = page.locator("#unwind")
    expect(unwind_panel.locator("li.step")).to_have_count(1)
    expect(unwind_panel.locator(".unwind-kept li")).to_have_count(2)
    expect(unwind_panel).to_have_attribute("data-unwind-status", "completed", timeout=30_000)
    expect(unwind_panel.locator("li.step").first).to_have_attribute("data-step-status", "done")

    page.reload()
    expect(page.locator(f"#action-{license.seq} [data-partial='undone']")).to_be_visible()
    for action in kept:
        expect(page.locator(f"#action-{action.seq} [data-partial='kept']")).to_be_visible()
    trail = page.locator("#trail")
    expect(trail).to_contain_text("Partially compensated: 1 put back, 2 kept as the operator chose")
    expect(trail.get_by_role("heading", name="What was kept, as the operator chose")).to_be_visible()
    screenshot(page, "partial-undo-run")
