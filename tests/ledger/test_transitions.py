"""The compare-and-set's three forms, on runs: what each does when it wins, and what losing is."""

from __future__ import annotations

import pytest
from django.db.models import Q

from infra import errors
from ledger.models import Run
from ledger.transitions import RUN_TRANSITIONS, compare_and_set, compare_and_set_rows, try_compare_and_set
from tests.factories import force_status, make_run


def test_it_moves_the_row_and_the_object_and_answers_where_it_came_from(tenant, agent):
    run = make_run(tenant, agent)
    before = Run.objects.get(pk=run.pk).updated_at
    assert (
        compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.FAILED, updates={"error": "boom"})
        == "running"
    )
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.error, run.status, run.error) == ("failed", "boom", "failed", "boom")
    assert stored.updated_at > before


def test_it_loses_to_a_move_that_got_there_first(tenant, agent):
    run = make_run(tenant, agent)
    force_status(Run.objects.get(pk=run.pk), Run.Status.CANCELLED)
    with pytest.raises(errors.InvalidTransition) as lost:
        compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.SUCCEEDED, current=Run.Status.RUNNING)
    assert lost.value.current == "cancelled"
    assert run.status == "running"  # the object is left as the caller saw it


def test_its_try_form_answers_none_where_the_other_raises(tenant, agent):
    run = make_run(tenant, agent)
    force_status(Run.objects.get(pk=run.pk), Run.Status.CANCELLED)
    assert try_compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.SUCCEEDED, current="running") is None
    # Not a source of ``to`` (the table's, or ``allowed_from``'s) is a loss too, and writes nothing.
    assert (
        try_compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.SUCCEEDED, current="cancelled") is None
    )
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    assert try_compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.CLOSED) == "cancelled"


def test_it_fences_on_more_columns(tenant, agent):
    run = make_run(tenant, agent)
    Run.objects.filter(pk=run.pk).update(summary="token-2")  # a fencing token, taken over
    stale = {"summary": "token-1"}
    assert try_compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.FAILED, where=stale) is None
    assert try_compare_and_set(run, table=RUN_TRANSITIONS, to=Run.Status.FAILED, where={"summary": "token-2"})


def test_its_rows_form_moves_those_in_a_source_state_that_meet_its_condition(tenant, agent):
    running, failed, cancelled, succeeded = (make_run(tenant, agent) for _ in range(4))
    force_status(failed, Run.Status.FAILED)
    force_status(cancelled, Run.Status.CANCELLED)
    force_status(succeeded, Run.Status.SUCCEEDED)
    Run.objects.filter(pk=cancelled.pk).update(error="kept")
    rows = Run.objects.filter(pk__in=[running.pk, failed.pk, cancelled.pk, succeeded.pk])
    # closed follows failed and cancelled; of the cancelled, only those with no error here.
    moved = compare_and_set_rows(
        rows, table=RUN_TRANSITIONS, to=Run.Status.CLOSED, when={Run.Status.CANCELLED: Q(error="")}
    )
    assert moved == 1
    assert dict(rows.values_list("pk", "status")) == {
        running.pk: "running",
        failed.pk: "closed",
        cancelled.pk: "cancelled",
        succeeded.pk: "succeeded",
    }


def test_its_rows_form_refuses_a_condition_for_no_source_state(tenant, agent):
    with pytest.raises(ValueError):
        compare_and_set_rows(
            Run.objects.all(), table=RUN_TRANSITIONS, to=Run.Status.CLOSED, when={Run.Status.RUNNING: Q()}
        )


def test_its_rows_form_moves_nothing_to_a_state_nothing_may_become(tenant, agent):
    make_run(tenant, agent)
    assert compare_and_set_rows(Run.objects.all(), table={"running": set()}, to="running") == 0
