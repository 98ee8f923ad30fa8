"""``plan_record`` in the ledger alone (no approval gate): what it refuses before anything is read
(any caller, not only the API's schema), all or nothing, the pivot lint over the plan, replays and
mixes of keys, and a key another request still holds."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection

from infra import errors
from ledger.models import Action, Run
from ledger.services.actions.plans import MAX_PLAN_ACTIONS, plan_record
from ledger.services.actions.recording import key_lock_name
from tests.factories import auto_policy, make_run


@pytest.fixture
def run(tenant, agent) -> Run:
    auto_policy("hr.*")
    auto_policy("mail.*", action_class="external_irreversible", compensation="none")
    return make_run(tenant, agent)


def step(key: str, tool: str = "hr.create_user", **fields: Any) -> dict[str, Any]:
    return {"tool": tool, "idempotency_key": key, "args": {"email": f"{key}@company.com"}, **fields}


@pytest.mark.parametrize(
    ("actions", "problem"),
    [
        ([], "1 to 100"),
        ([step(f"k{n}") for n in range(MAX_PLAN_ACTIONS + 1)], "1 to 100"),
        ([step("a"), {"idempotency_key": "b"}], "tool is required"),
        ([step("a"), step("b", lock_timeout_ms=1)], "unknown fields ['lock_timeout_ms']"),
        ([step("a"), step("", tool="hr.x")], "idempotency_key is required"),
        ([step("a"), {**step("b"), "idempotency_key": 7}], "idempotency_key is required"),
        ([step("a"), step("b"), step("a", tool="hr.update_user")], "also the key of action 0"),
    ],
)
def test_it_refuses_a_malformed_plan_before_anything_is_read(run, agent, actions, problem):
    with pytest.raises(errors.ValidationFailed) as refused:
        plan_record(run=run, actor=agent, actions=actions)
    assert problem in refused.value.message
    assert not Action.objects.exists()


def test_it_records_in_order_and_lints_the_pivot_over_the_whole_plan(run, agent):
    plan = plan_record(run=run, actor=agent, actions=[step("mail", tool="mail.send"), step("user")])
    assert plan.created
    mail, user = plan.actions
    assert (mail.seq, user.seq) == (1, 2)
    assert [(w["code"], w["action_id"], w["pivot_action_id"]) for w in plan.warnings] == [
        ("pivot_order", user.pk, mail.pk)
    ]
    run.refresh_from_db()
    assert run.action_count == 2


def test_a_refusal_in_the_middle_rolls_back_the_actions_before_it(run, agent):
    with pytest.raises(errors.UnknownCompensator) as refused:
        plan_record(
            run=run,
            actor=agent,
            actions=[step("a"), step("b", compensation={"tool": "x.y", "args": {}}), step("c")],
            # The policy names no compensating tool here: the check that refuses is the registry's.
            is_compensator=lambda tool, stamp: False,
        )
    assert refused.value.details["plan_index"] == 1
    assert not Action.objects.exists()
    run.refresh_from_db()
    assert run.action_count == 0


def test_all_known_keys_replay_and_a_mix_is_refused(run, agent):
    first = plan_record(run=run, actor=agent, actions=[step("a"), step("b")])
    again = plan_record(run=run, actor=agent, actions=[step("a"), step("b")])
    assert not again.created
    assert [a.pk for a in again.actions] == [a.pk for a in first.actions]
    with pytest.raises(errors.IdempotencyKeyReused) as mixed:
        plan_record(run=run, actor=agent, actions=[step("a"), step("c")])
    assert mixed.value.details == {"known": ["a"], "new": ["c"], "plan_index": 1}
    assert sorted(Action.objects.values_list("idempotency_key", flat=True)) == ["a", "b"]


@pytest.mark.django_db(transaction=True)
def test_a_key_another_request_holds_is_in_flight_and_nothing_is_recorded(tenant, agent):
    auto_policy("hr.*")
    run = make_run(tenant, agent)
    settings = connection.settings_dict
    other = psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        autocommit=True,
    )
    try:
        other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [key_lock_name(tenant.pk, "b")])
        with pytest.raises(errors.IdempotencyKeyInFlight):
            plan_record(run=run, actor=agent, actions=[step("a"), step("b")], lock_timeout_ms=200)
    finally:
        other.close()
    assert not Action.objects.exists()
    # Released, the same plan is recorded.
    assert plan_record(run=run, actor=agent, actions=[step("a"), step("b")]).created
