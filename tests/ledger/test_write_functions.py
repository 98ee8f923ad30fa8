"""The ledger's write functions (``ledger/sql``: ``saga_action_record``, ``saga_action_move``,
``saga_event_insert``) on their own: the chain the database extends is the chain Python verifies,
whatever the content; a write that relied on this process's copy of the policies is refused by the
database once they changed, and the checked path applies the new ones; the database decides only
what Python told it (the states a rule allows, the run's closed states)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from infra import errors
from ledger.audit import audit_heads_verify, audit_verify
from ledger.models import Action, Compensator, Event, PolicySet, ToolPolicy
from ledger.services import writes
from ledger.services.actions import moves, recording
from recovery.compensators import compensator_registered
from tests.factories import auto_policy, force_status, make_run, record

pytestmark = pytest.mark.django_db

HOSTILE = [
    "plain",
    'quotes " and \\ backslashes \\u0041',
    "unicode: Ashu Kūmar — 日本語 🙂",
    "\u2028 line separators \u2029",
    '","from_state":"running',  # JSON that would end a string early, were it spliced unescaped
    "\ue000from\ue000 {from} %(from)s $1",  # what a placeholder scheme might have used
    "x" * 20_000,
]


def _verified(run_id: str) -> None:
    checked, broken = audit_verify(chain=f"run:{run_id}")
    assert broken is None
    assert checked > 0
    assert audit_heads_verify(chain=f"run:{run_id}") == []


@pytest.mark.parametrize("text", HOSTILE)
def test_the_databases_hash_is_the_one_python_verifies_whatever_the_content(tenant, agent, text):
    auto_policy(tenant=tenant)
    run = make_run(tenant, agent)
    action = recording.action_record(
        run=run,
        actor=agent,
        tool="hr.create_user",
        idempotency_key=f"k-{len(text)}",
        target_id=text[:500],
        args={"name": text, "n": 10**30, "f": 1.5e300, "nested": [text, {"k": text}]},
        start=True,
    ).action
    moves.action_succeed(action=action, actor=agent, result={"echo": text})
    stored = Action.objects.get(pk=action.pk)
    assert stored.args["name"] == text
    assert (stored.status, stored.seq, stored.completion_seq) == ("succeeded", 1, 1)
    kinds = list(Event.objects.filter(subject_id=action.pk).order_by("id").values_list("kind", "from_state"))
    assert kinds == [("action.recorded", ""), ("action.started", "planned"), ("action.succeeded", "running")]
    _verified(run.pk)


def test_a_policy_changed_since_this_process_read_it_applies_to_the_very_next_write(tenant, agent):
    policy = auto_policy(tenant=tenant)
    run = make_run(tenant, agent)
    assert record(run, agent, "warm").risk == "low"  # this process now holds the policies
    # Another process tightens the policy (any write moves the stamp, in the database).
    ToolPolicy.objects.filter(pk=policy.pk).update(risk="critical")
    assert record(run, agent, "after").risk == "critical"


def test_a_changed_default_policy_applies_to_the_very_next_write(tenant, agent):
    run = make_run(tenant, agent)
    assert record(run, agent, "warm", tool="crm.unknown").requires_approval  # the built-in default
    PolicySet.objects.create(
        tenant=tenant, default_policy={"risk": "low", "approval": "auto", "action_class": "read_only"}
    )
    after = record(run, agent, "after", tool="crm.unknown")
    assert (after.risk, after.requires_approval) == ("low", False)


def test_the_record_function_answers_not_found_for_another_tenants_or_agents_run(tenant, agent, other_tenant):
    auto_policy(tenant=tenant)
    run = make_run(tenant, agent)
    record(run, agent, "warm")
    base = {
        "lock_timeout_ms": 1000,
        "closed": [],
        "checked": True,
        "action": {"idempotency_key": "never"},
        "events": [],
    }
    for tenant_id, owner in ((other_tenant.pk, ""), (tenant.pk, "someone-else")):
        answer = writes.call(
            "saga_action_record", {**base, "tenant_id": tenant_id, "run_id": run.pk, "run_owner": owner}
        )
        assert answer == {"outcome": "not_found"}
    assert Action.objects.filter(run=run).count() == 1


def test_the_move_function_refuses_what_the_rule_does_not_allow_and_changes_nothing(tenant, agent):
    auto_policy(tenant=tenant)
    run = make_run(tenant, agent)
    action = record(run, agent, "k")
    head = type(run).objects.get(pk=run.pk).audit_head
    with pytest.raises(errors.InvalidTransition) as caught:
        moves.action_succeed(action=action, actor=agent)  # planned, not running
    assert caught.value.details["current"] == "planned"
    assert Action.objects.get(pk=action.pk).status == "planned"
    assert type(run).objects.get(pk=run.pk).audit_head == head


def test_a_late_report_reaches_a_failed_run_but_not_a_cancelled_one(tenant, agent):
    auto_policy(tenant=tenant)
    run = make_run(tenant, agent)
    late = recording.action_record(
        run=run, actor=agent, tool="hr.create_user", idempotency_key="a", start=True
    )
    force_status(run, "failed")
    moves.action_succeed(action=late.action, actor=agent)
    assert Action.objects.get(pk=late.action.pk).status == "succeeded"
    other = make_run(tenant, agent)
    stuck = recording.action_record(
        run=other, actor=agent, tool="hr.create_user", idempotency_key="b", start=True
    )
    force_status(other, "cancelled")
    with pytest.raises(errors.RunNotAcceptingActions):
        moves.action_succeed(action=stuck.action, actor=agent)
    assert Action.objects.get(pk=stuck.action.pk).status == "running"
    _verified(run.pk)


def _named(run, agent, key: str, tool: str):
    return recording.action_record(
        run=run,
        actor=agent,
        tool="crm.update",
        idempotency_key=key,
        compensation={"tool": tool, "args": {}},
        is_compensator=lambda name, stamp: compensator_registered(
            tenant_id=run.tenant_id, tool=name, stamp=stamp
        ),
    )


def test_a_compensator_registered_since_this_process_read_them_counts_from_the_next_write(tenant, agent):
    auto_policy("crm.*", tenant=tenant)
    run = make_run(tenant, agent)
    with pytest.raises(errors.UnknownCompensator):
        _named(run, agent, "warm", "crm.revert")  # this process now holds the registry (empty)
    with pytest.raises(errors.UnknownCompensator):
        _named(run, agent, "before", "crm.revert")
    Compensator.objects.create(tenant=tenant, tool="crm.revert", kind="python", python_path="tests.x.revert")
    recorded = _named(run, agent, "after", "crm.revert")
    assert recorded.action.compensation_tool == "crm.revert"


def test_an_agent_named_registered_compensator_costs_no_statement_of_its_own(tenant, agent):
    auto_policy("crm.*", tenant=tenant)
    Compensator.objects.create(tenant=tenant, tool="crm.revert", kind="python", python_path="tests.x.revert")
    run = make_run(tenant, agent)
    _named(run, agent, "warm", "crm.revert")
    with CaptureQueriesContext(connection) as queries:
        _named(run, agent, "k", "crm.revert")
    assert len(queries.captured_queries) == 1


@pytest.mark.django_db(transaction=True)
def test_the_one_call_record_waits_on_the_same_key_lock_as_the_checked_path(tenant, agent):
    auto_policy(tenant=tenant)
    run = make_run(tenant, agent)
    record(run, agent, "warm")  # this process holds the policies: the next record is one call
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
        other.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", [recording.key_lock_name(tenant.pk, "k")]
        )
        with pytest.raises(errors.IdempotencyKeyInFlight):
            recording.action_record(
                run=run, actor=agent, tool="hr.create_user", idempotency_key="k", lock_timeout_ms=200
            )
    finally:
        other.close()
    assert not Action.objects.filter(idempotency_key="k").exists()
