"""The run page offers only the decisions the services would carry out, says why it does not
offer the others, words every refusal as a sentence, and keeps itself current through one poll
that sends back only what changed (dashboard.selectors.live)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from infra import errors
from ledger.audit import Actor
from ledger.models import Run
from ledger.services import runs
from recovery import decisions
from recovery.actions.cancellations import run_cancel
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.actions.resolutions import item_close, item_resume
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.factories import load_onboarding_policies, perform_action

pytestmark = pytest.mark.django_db

UNDER_WAY = "A compensation is already under way for this run"


def _live_query(page: str) -> dict[str, str]:
    """The query the page's poller sends (its hx-get), as the browser would decode it."""
    start = page.index('id="run-live"')
    tag = page[start : page.index(">", start)]
    url = tag.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    return dict(parse_qsl(urlsplit(url).query))


def _poll(client, run: Run, query: dict[str, str]):
    return client.get(reverse("dashboard:run-live", args=[run.pk]), query, headers={"HX-Request": "true"})


# --- The rule ---------------------------------------------------------------------------------


def test_an_open_item_of_a_failed_run_can_be_compensated_resumed_and_closed(failed_run):
    run, item = failed_run
    offered = decisions.decisions_for(run=run, item=item)
    assert offered.compensate and offered.resume and offered.close and offered.cancel
    assert not offered.flag and offered.flag.why == "The run is already in the recovery queue."
    assert offered.refused == []


def test_nothing_but_stopping_is_offered_while_a_compensation_is_under_way(failed_run, alice):
    run, item = failed_run
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")
    item.refresh_from_db()
    run.refresh_from_db()
    offered = decisions.decisions_for(run=run, item=item, unwind=unwind)
    assert not (offered.compensate or offered.resume or offered.close or offered.cancel or offered.flag)
    assert offered.stop_unwind
    ((names, why),) = offered.refused
    assert names == "Resume, Compensate and Close" and why.startswith(UNDER_WAY)
    # The service refuses what the page does not offer, and its refusal reads the same.
    with pytest.raises(errors.InvalidTransition) as refused:
        unwind_start(item=item, actor=Actor.for_user(alice), reason="again")
    assert decisions.refusal_sentence(refused.value).startswith(UNDER_WAY)
    assert Unwind.objects.filter(run=run).count() == 1


def test_the_sentence_says_which_step_waits_for_an_approval(failed_run, alice):
    run, item = failed_run
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")
    unwind.steps.filter(position=1).update(status=UnwindStep.Status.AWAITING_APPROVAL)
    Unwind.objects.filter(pk=unwind.pk).update(status=Unwind.Status.PAUSED)
    unwind.refresh_from_db()
    item.refresh_from_db()
    offered = decisions.decisions_for(run=run, item=item, unwind=unwind)
    assert "(step 2 waits for an approval)" in offered.compensate.why


def test_unknown_outcomes_hold_back_compensate_and_resume_but_not_close(tenant, agent):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="crm-agent", request="Fix the owner")
    perform_action(
        run,
        agent,
        "crm.update_contact",
        target_id="c-1",
        args={"owner": "x"},
        before={"owner": "y"},
        unknown=True,
    )
    run_fail_and_queue(run=run, actor=agent, error="gave up")
    item = RecoveryItem.objects.get(run=run)
    run.refresh_from_db()
    offered = decisions.decisions_for(run=run, item=item)
    assert not offered.compensate and not offered.resume and offered.close
    assert offered.compensate.why == offered.resume.why.replace("resume", "compensate")
    assert offered.resume.why.startswith("Reconcile first: crm.update_contact (#1) timed out")


def test_a_cancelled_run_is_not_offered_resume(failed_run, alice):
    run, item = failed_run
    run_cancel(run=run, actor=Actor.for_user(alice), reason="withdrawn")
    run.refresh_from_db()
    item.refresh_from_db()
    offered = decisions.decisions_for(run=run, item=item)
    assert offered.compensate and offered.close and not offered.resume
    assert "cannot be resumed" in offered.resume.why
    with pytest.raises(errors.InvalidTransition) as refused:
        item_resume(item=item, actor=Actor.for_user(alice), reason="go on")
    assert decisions.refusal_sentence(refused.value) == offered.resume.why


def test_every_transition_refusal_is_worded_without_class_names_or_ids(failed_run):
    run, item = failed_run
    for subject in (run, item, Unwind(pk="unw_x"), UnwindStep(pk="stp_x")):
        for current in ("open", "claimed", "resolved", "running", "completed", "cancelled", "done"):
            exc = errors.InvalidTransition(subject, to="claimed", current=current)
            sentence = decisions.refusal_sentence(exc)
            assert type(subject).__name__ not in sentence and str(subject.pk) not in sentence
            assert "cannot become" not in sentence and sentence.endswith((".", "!"))
    worded = errors.InvalidTransition(run, to="x", current="y", message="Said for people.")
    assert decisions.refusal_sentence(worded) == "Said for people."


# --- The page ---------------------------------------------------------------------------------


def test_the_page_offers_no_compensate_while_one_is_under_way(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    before = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert "Compensate…" in before and "not offered now" not in before
    unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")
    page = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert "Compensate…" not in page and "Resume…" not in page and "Close…" not in page
    assert "Cancel run…" not in page and "Flag for review…" not in page
    assert 'data-not-offered="Resume, Compensate and Close"' in page and UNDER_WAY in page
    assert "Stop unwind…" in page


def test_a_refused_decision_is_a_sentence_and_changes_nothing(client, failed_run, alice, dave):
    run, item = failed_run
    client.force_login(alice)
    unwind_start(item=item, actor=Actor.for_user(dave), reason="dave was first")
    for name in ("item-compensate", "item-resume", "item-close"):
        response = client.post(reverse(f"dashboard:{name}", args=[item.pk]), {"reason": "stale tab"})
        said = [str(m) for m in get_messages(response.wsgi_request)]
        assert response.status_code == 303, name
        assert said and all(m.startswith(UNDER_WAY) for m in said), (name, said)
        assert not any("RecoveryItem" in m or item.pk in m for m in said), said
    item.refresh_from_db()
    run.refresh_from_db()
    assert item.status == RecoveryItem.Status.CLAIMED and run.status == Run.Status.COMPENSATING
    assert Unwind.objects.filter(run=run).count() == 1


def test_the_poll_answers_204_when_nothing_changed_and_the_changes_when_something_did(
    client, failed_run, alice
):
    run, item = failed_run
    client.force_login(alice)
    page = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert 'data-live="10s"' in page  # an open item: someone may decide it
    query = _live_query(page)
    assert _poll(client, run, query).status_code == 204

    unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")
    response = _poll(client, run, query)
    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="run-summary" hx-swap-oob="true" data-run-status="compensating"' in body
    assert 'id="item-summary" hx-swap-oob="true" data-item-status="claimed"' in body
    assert 'id="unwind-slot" hx-swap-oob="true"' in body and 'data-unwind-status="running"' in body
    assert 'id="decision-panel" hx-swap-oob="true"' in body  # an opened Compensate… form goes
    assert "Compensate…" not in body and UNDER_WAY in body
    assert 'data-live="2s"' in body  # the new poller, faster while the unwind runs
    # The unwind panel no longer polls on its own: the page's one poll drives it.
    assert reverse("dashboard:unwind-progress", args=[Unwind.objects.get(run=run).pk]) not in body
    # The new poller carries the new marks: asked again, nothing changed.
    assert _poll(client, run, _live_query(body)).status_code == 204


def test_the_poll_stops_once_the_run_is_settled(client, failed_run, alice, mallory):
    run, item = failed_run
    client.force_login(alice)
    query = _live_query(client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode())
    item_close(item=item, actor=Actor.for_user(alice), reason="handled by hand")
    response = _poll(client, run, query)
    body = response.content.decode()
    assert response.status_code == 286  # htmx: stop polling
    assert 'data-live="settled"' in body and "hx-trigger" not in body.split('id="run-live"')[1].split(">")[0]
    assert 'data-run-status="closed"' in body and 'data-item-status="resolved"' in body
    page = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert 'data-live="settled"' in page and reverse("dashboard:run-live", args=[run.pk]) not in page
    client.force_login(mallory)
    assert _poll(client, run, query).status_code == 404


def test_the_approvals_badge_drops_with_a_decision(client, approval, bob):
    client.force_login(bob)
    page = client.get(reverse("dashboard:approvals")).content.decode()
    assert 'aria-label="1 pending"' in page
    response = client.post(
        reverse("dashboard:approval-reject", args=[approval.pk]),
        {f"{approval.pk}-reject-reason": "not this one"},
        headers={"HX-Request": "true"},
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert '<span id="nav-approvals-badge" hx-swap-oob="true"></span>' in body
