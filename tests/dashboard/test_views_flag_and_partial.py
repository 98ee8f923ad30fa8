"""The dashboard's flag and partial-compensate forms: who may use them, the confirmation of a
partial selection, and a plan that changed under the operator (shown again, never run)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Action
from ledger.services import runs
from ledger.services.actions import moves
from recovery import planner
from recovery.models import RecoveryItem, Unwind
from tests.factories import load_reliability_policies, perform_action

pytestmark = pytest.mark.django_db


@pytest.fixture
def hire(tenant, agent):
    """A failed run with three undoable actions and one whose outcome is unknown."""
    load_reliability_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    done = [
        perform_action(
            run,
            agent,
            f"rel.do_{n}",
            target_type="thing",
            target_id=f"thing-{n}",
            args={"n": n},
            compensation={"tool": "rel.undo", "args": {"n": n}},
        )
        for n in (1, 2, 3)
    ]
    return run, done


def _url(item):
    return reverse("dashboard:item-compensate", args=[item.pk])


def _queued(run, agent):
    from recovery.actions.reports import run_fail_and_queue

    return run_fail_and_queue(run=run, actor=agent, error="boom").item


def test_the_plan_has_a_ticked_box_per_undoable_step_and_carries_its_hash(client, hire, agent, alice):
    run, done = hire
    item = _queued(run, agent)
    client.force_login(alice)
    body = client.get(_url(item)).content.decode()
    plan = planner.compensation_plan(run=run)
    assert f'name="plan_hash" value="{plan.plan_hash}"' in body
    for action in done:
        assert f'name="action_ids" value="{action.pk}" id="undo-{action.pk}" checked' in body
        assert f"Undo #{action.seq} {action.tool}</span></label>" in body


def test_a_partial_choice_is_shown_back_before_anything_runs_then_runs_when_confirmed(
    client, hire, agent, alice
):
    run, (first, second, third) = hire
    item = _queued(run, agent)
    client.force_login(alice)
    plan_hash = planner.compensation_plan(run=run).plan_hash
    chosen = {"reason": "keep the account", "scope": "actions", "plan_hash": plan_hash, "stage": "choose"}

    review = client.post(_url(item), {**chosen, "action_ids": [second.pk]})

    assert review.status_code == 200
    body = review.content.decode()
    assert 'data-stage="review"' in body and "Confirm: undo 1 action, keep 2" in body
    assert body.index("Will be undone") < body.index("rel.do_2") < body.index("Kept (not undone)")
    assert not Unwind.objects.filter(run=run).exists()

    done = client.post(_url(item), {**chosen, "stage": "confirm", "action_ids": [second.pk]})

    assert done.status_code == 303
    unwind = Unwind.objects.get(run=run)
    assert [s.action_id for s in unwind.steps.all()] == [second.pk]
    assert [k["action_id"] for k in unwind.plan["kept"]] == [third.pk, first.pk]
    said = [str(m) for m in get_messages(done.wsgi_request)]
    assert any("Kept as they are: rel.do_3 (#3), rel.do_1 (#1)." in m for m in said)


def test_nothing_ticked_is_a_plain_sentence_and_nothing_runs(client, hire, agent, alice):
    run, _done = hire
    item = _queued(run, agent)
    client.force_login(alice)
    response = client.post(_url(item), {"reason": "x", "scope": "actions", "stage": "choose"})
    assert response.status_code == 422
    assert "Choose at least one action to undo." in response.content.decode()
    assert not Unwind.objects.filter(run=run).exists()


def test_a_plan_that_changed_is_shown_again_instead_of_running(client, tenant, agent, alice):
    load_reliability_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="r")
    first = perform_action(
        run, agent, "rel.do_1", target_id="t1", args={}, compensation={"tool": "rel.undo", "args": {}}
    )
    late = perform_action(
        run,
        agent,
        "rel.do_2",
        target_id="t2",
        args={},
        compensation={"tool": "rel.undo", "args": {}},
        unknown=True,
    )
    item = _queued(run, agent)
    client.force_login(alice)
    seen = planner.compensation_plan(run=run).plan_hash
    moves.action_reconcile(action=late, actor=Actor.for_user(alice), happened=True, reason="it did")

    response = client.post(
        _url(item),
        # Alice had every box ticked: the only undoable action then.
        {
            "reason": "undo",
            "scope": "actions",
            "action_ids": [first.pk],
            "plan_hash": seen,
            "stage": "choose",
        },
    )

    assert response.status_code == 409
    body = response.content.decode()
    assert "The plan changed since you opened it" in body
    assert f'value="{planner.compensation_plan(run=run).plan_hash}"' in body and "rel.do_2" in body
    assert not Unwind.objects.filter(run=run).exists()
    assert RecoveryItem.objects.get(pk=item.pk).status == RecoveryItem.Status.OPEN


def test_flag_is_for_operators_and_puts_a_succeeded_run_in_the_queue(
    client, hire, agent, alice, bob, carol, mallory
):
    run, _done = hire
    runs.run_complete(run=run, actor=agent)
    url = reverse("dashboard:run-flag", args=[run.pk])
    for user, status in ((bob, 403), (carol, 403), (mallory, 404)):
        client.force_login(user)
        assert client.post(url, {"reason": "trying"}).status_code == status, user.username
    assert not RecoveryItem.objects.filter(run=run).exists()

    client.force_login(alice)
    preview = client.get(url).content.decode()
    assert "Puts the run in the recovery queue" in preview and "Confirm: flag for review" in preview
    assert client.post(url, {"reason": " "}).status_code == 422
    response = client.post(url, {"reason": "HR cancelled the hire"})

    assert response.status_code == 303
    item = RecoveryItem.objects.get(run=run)
    assert (item.reason, item.status) == ("manual", "open")
    assert Action.objects.filter(run=run, status="succeeded").count() == 3
    page = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert "Flagged for review" in page and "Compensate…" in page and "Flag for review…" not in page
