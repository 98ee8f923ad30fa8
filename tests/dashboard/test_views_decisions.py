"""Every decision, per role: operators decide, viewers and approvers are refused (403), outsiders
never learn the object exists (404), and domain refusals are messages, not 500s."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.services import runs
from recovery.actions.compensations import unwind_start
from recovery.models import AgentCommand, RecoveryItem, Unwind, UnwindStep
from recovery.unwinds.advance import unwind_advance_move
from recovery.unwinds.runner import step_run
from tests.factories import load_onboarding_policies, onboarding_run, perform_action

pytestmark = pytest.mark.django_db


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.mark.parametrize("name", ["item-compensate", "item-resume", "item-close"])
def test_previews_are_for_operators_and_admins(client, failed_run, name, alice, bob, carol, dave, mallory):
    _run, item = failed_run
    url = reverse(f"dashboard:{name}", args=[item.pk])
    expected = {alice: 200, dave: 200, bob: 403, carol: 403, mallory: 404}
    for user, status in expected.items():
        client.force_login(user)
        assert client.get(url).status_code == status, (user.username, name)


@pytest.mark.parametrize("name", ["item-compensate", "item-resume", "item-close", "item-assign"])
def test_decisions_are_refused_to_viewers_approvers_and_outsiders(
    client, failed_run, name, bob, carol, mallory
):
    run, item = failed_run
    url = reverse(f"dashboard:{name}", args=[item.pk])
    for user, status in ((bob, 403), (carol, 403), (mallory, 404)):
        client.force_login(user)
        assert client.post(url, {"reason": "trying"}).status_code == status, user.username
    item.refresh_from_db()
    assert item.status == RecoveryItem.Status.OPEN and item.assignee is None
    assert not Unwind.objects.filter(run=run).exists()


def test_the_compensate_preview_shows_the_plan_newest_first(client, failed_run, alice):
    _run, item = failed_run
    client.force_login(alice)
    body = client.get(reverse("dashboard:item-compensate", args=[item.pk])).content.decode()
    assert body.index("workspace.cancel_license") < body.index("hr.delete_user")
    assert "Dry run" in body and "Confirm compensation" in body and 'name="reason"' in body
    assert "no compensator is registered" in body  # the test world registers none


def test_the_htmx_preview_is_a_partial(client, failed_run, alice):
    _run, item = failed_run
    client.force_login(alice)
    response = client.get(
        reverse("dashboard:item-compensate", args=[item.pk]), headers={"HX-Request": "true"}
    )
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body and "Confirm compensation" in body


def test_compensate_needs_a_reason(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    response = client.post(reverse("dashboard:item-compensate", args=[item.pk]), {"reason": "  "})
    assert response.status_code == 422
    assert "A reason is required." in response.content.decode()
    assert not Unwind.objects.filter(run=run).exists()


def test_an_operator_compensates_and_is_sent_to_the_live_progress(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:item-compensate", args=[item.pk]), {"reason": "HR cancelled the hire"}
    )
    assert response.status_code == 303
    assert response["Location"] == reverse("dashboard:run-detail", args=[run.pk]) + "#unwind"
    unwind = Unwind.objects.get(run=run)
    assert unwind.reason == "HR cancelled the hire" and unwind.requested_by == alice
    assert [s.tool for s in unwind.steps.order_by("position")] == [
        "workspace.cancel_license",
        "hr.delete_user",
    ]
    page = client.get(response["Location"]).content.decode()
    # The page's one live poll (dashboard.selectors.live) keeps the unwind, header and buttons current.
    assert 'id="unwind"' in page and reverse("dashboard:run-live", args=[run.pk]) in page
    assert 'data-live="2s"' in page
    assert "Compensation started" in page


def test_a_second_compensate_is_a_clear_message_not_a_500(client, failed_run, alice, dave):
    _run, item = failed_run
    client.force_login(alice)
    client.post(reverse("dashboard:item-compensate", args=[item.pk]), {"reason": "first"})
    client.force_login(dave)
    response = client.post(reverse("dashboard:item-compensate", args=[item.pk]), {"reason": "second"})
    assert response.status_code == 303
    said = _messages(response)
    # A sentence, never the exception's text ("RecoveryItem rec_… is claimed; it cannot become …").
    assert any(m.startswith("A compensation is already under way for this run") for m in said), said
    assert not any("cannot become" in m or item.pk in m for m in said), said
    assert Unwind.objects.filter(run=item.run).count() == 1


def test_the_htmx_decision_redirects_on_the_client(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:item-close", args=[item.pk]),
        {"reason": "duplicate"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200 and response["HX-Redirect"] == reverse(
        "dashboard:run-detail", args=[run.pk]
    )


def test_an_operator_closes_with_a_reason(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    response = client.post(reverse("dashboard:item-close", args=[item.pk]), {"reason": "handled by hand"})
    assert response.status_code == 303
    item.refresh_from_db()
    run.refresh_from_db()
    assert item.resolution == RecoveryItem.Resolution.CLOSED and run.status == Run.Status.CLOSED
    assert item.resolution_note == "handled by hand"


def test_the_resume_preview_warns_about_a_stale_checkpoint(client, failed_run, alice):
    _run, item = failed_run
    client.force_login(alice)
    body = client.get(reverse("dashboard:item-resume", args=[item.pk])).content.decode()
    assert "Stale checkpoint" in body and "workspace.provision_license" in body
    assert "account-created" in body


def test_an_operator_resumes_from_a_chosen_checkpoint(client, failed_run, alice):
    run, item = failed_run
    checkpoint = run.checkpoints.get()
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:item-resume", args=[item.pk]),
        {"reason": "gateway is back", "checkpoint": checkpoint.pk},
    )
    assert response.status_code == 303
    command = AgentCommand.objects.get(run=run)
    assert command.kind == "resume" and command.checkpoint == checkpoint
    item.refresh_from_db()
    assert item.resolution == RecoveryItem.Resolution.RESUMED


def test_an_operator_assigns_and_unassigns(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    client.post(reverse("dashboard:item-assign", args=[item.pk]))
    item.refresh_from_db()
    assert item.assignee == alice
    client.post(reverse("dashboard:item-assign", args=[item.pk]), {"assignee": "none"})
    item.refresh_from_db()
    assert item.assignee is None


def _failed_step(run, item, user) -> UnwindStep:
    unwind = unwind_start(item=item, actor=Actor.for_user(user), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    step = unwind.steps.get(position=0)
    step_run(step_id=step.pk)  # no compensator is registered: the step fails
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.FAILED
    return step


def test_an_operator_skips_a_failed_step(client, failed_run, alice):
    run, item = failed_run
    step = _failed_step(run, item, alice)
    client.force_login(alice)
    page = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert reverse("dashboard:step-retry", args=[step.pk]) in page
    assert "No compensator is registered" in page
    response = client.post(
        reverse("dashboard:step-skip", args=[step.pk]), {"reason": "licence expires anyway"}
    )
    assert response.status_code == 303
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.SKIPPED


def test_an_operator_retries_a_failed_step(client, failed_run, alice):
    run, item = failed_run
    step = _failed_step(run, item, alice)
    client.force_login(alice)
    response = client.post(reverse("dashboard:step-retry", args=[step.pk]), {"reason": "compensator fixed"})
    assert response.status_code == 303
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.PENDING


def test_step_decisions_are_refused_by_role_and_tenant(client, failed_run, alice, carol, bob, mallory):
    run, item = failed_run
    step = _failed_step(run, item, alice)
    for name in ("step-retry", "step-skip"):
        for user, status in ((carol, 403), (bob, 403), (mallory, 404)):
            client.force_login(user)
            assert (
                client.post(reverse(f"dashboard:{name}", args=[step.pk]), {"reason": "x"}).status_code
                == status
            )
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.FAILED


def test_retrying_a_step_that_is_not_failed_is_a_message(client, failed_run, alice):
    run, item = failed_run
    step = _failed_step(run, item, alice)
    client.force_login(alice)
    client.post(reverse("dashboard:step-skip", args=[step.pk]), {"reason": "skip"})
    response = client.post(reverse("dashboard:step-retry", args=[step.pk]), {"reason": "again"})
    assert response.status_code == 303 and any("skipped" in m for m in _messages(response))


def test_the_progress_poll_stops_when_the_unwind_is_finished(client, failed_run, alice, mallory):
    run, item = failed_run
    client.force_login(alice)
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")
    url = reverse("dashboard:unwind-progress", args=[unwind.pk])
    response = client.get(url, headers={"HX-Request": "true"})
    assert response.status_code == 200 and 'hx-trigger="every 1s"' in response.content.decode()
    Unwind.objects.filter(pk=unwind.pk).update(status=Unwind.Status.COMPLETED)
    response = client.get(url, headers={"HX-Request": "true"})
    assert response.status_code == 286 and "hx-trigger" not in response.content.decode()
    client.force_login(mallory)
    assert client.get(url).status_code == 404


def test_an_operator_reconciles_an_unknown_outcome(client, tenant, agent, alice, carol, mallory):
    load_onboarding_policies()
    from ledger.services import runs

    run = runs.run_create(tenant=tenant, actor=agent, agent="crm-agent", request="Fix the owner")
    action = perform_action(
        run,
        agent,
        "crm.update_contact",
        target_id="c-1",
        args={"owner": "x"},
        before={"owner": "y"},
        unknown=True,
    )
    url = reverse("dashboard:action-reconcile", args=[action.pk])
    for user, status in ((carol, 403), (mallory, 404)):
        client.force_login(user)
        assert client.post(url, {"happened": "yes", "reason": "x"}).status_code == status
    client.force_login(alice)
    response = client.post(url, {"happened": "no", "reason": "CRM shows the old owner"})
    assert response.status_code == 303
    # Back to the action's card on the run page as served: it is among the newest actions.
    assert response["Location"] == reverse("dashboard:run-detail", args=[run.pk]) + f"#action-{action.seq}"
    action.refresh_from_db()
    assert action.status == Action.Status.FAILED


def test_reconciling_an_action_older_than_the_page_shows_goes_back_to_the_page_that_holds_it(
    client, tenant, agent, alice, monkeypatch
):
    from dashboard.selectors import runs as run_selectors

    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="crm-agent", request="Fix the owner")
    action = perform_action(
        run, agent, "crm.update_contact", target_id="c-1", args={"owner": "x"}, unknown=True
    )
    perform_action(run, agent, "crm.update_contact", target_id="c-2", args={"owner": "y"})
    monkeypatch.setattr(run_selectors, "RUN_PAGE_ACTIONS", 1)  # the page shows only the newest
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:action-reconcile", args=[action.pk]), {"happened": "yes", "reason": "it happened"}
    )
    assert response.status_code == 303
    assert "?cursor=" in response["Location"] and response["Location"].endswith(f"#action-{action.seq}")
    assert f'id="action-{action.seq}"' in client.get(response["Location"]).content.decode()


def test_bulk_close_handles_low_risk_items_and_reports_the_rest(client, tenant, agent, alice, carol):
    run_a, item_a = onboarding_run(tenant, agent, name="A", email="a@company.com")
    run_b, item_b = onboarding_run(tenant, agent, name="B", email="b@company.com")
    RecoveryItem.objects.filter(pk=item_a.pk).update(risk="low")
    client.force_login(carol)
    url = reverse("dashboard:queue-bulk")
    assert (
        client.post(url, {"operation": "close", "reason": "dupes", "items": [item_a.pk]}).status_code == 403
    )
    client.force_login(alice)
    response = client.post(
        url, {"operation": "close", "reason": "duplicates", "items": [item_a.pk, item_b.pk]}
    )
    assert response.status_code == 303
    item_a.refresh_from_db()
    item_b.refresh_from_db()
    assert item_a.resolution == "closed" and item_b.status == "open"
    messages = _messages(response)
    assert any("Closed 1 item" in m for m in messages) and any("low-risk" in m for m in messages)


def test_bulk_is_capped(client, tenant, agent, alice, settings):
    settings.SAGA = {**settings.SAGA, "BULK_MAX_ITEMS": 1}
    items = [onboarding_run(tenant, agent, name=f"N{i}", email=f"n{i}@company.com")[1] for i in range(2)]
    RecoveryItem.objects.filter(pk__in=[i.pk for i in items]).update(risk="low")
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:queue-bulk"),
        {"operation": "compensate", "reason": "x", "items": [i.pk for i in items]},
    )
    assert any("At most 1" in m for m in _messages(response))
    assert not Unwind.objects.exists()


def test_bulk_on_another_tenants_item_is_404(client, failed_run, mallory):
    _run, item = failed_run
    client.force_login(mallory)
    response = client.post(
        reverse("dashboard:queue-bulk"), {"operation": "close", "reason": "x", "items": [item.pk]}
    )
    assert response.status_code == 404
