from __future__ import annotations

from ledger.models import Action, Run
from ledger.services import runs
from ledger.services.actions import recording


def test_it_records_runs_and_actions_through_the_state_machine(tenant, agent):
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    recorded = recording.action_record(
        run=run,
        actor=agent,
        tool="hr.create_user",
        idempotency_key="k1",
        target_type="user",
        target_id="ashu@company.com",
        args={"name": "Ashu"},
        compensation={"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
    )
    assert recorded.created
    action = recorded.action
    # The built-in default policy is conservative: an unknown tool needs approval.
    assert action.requires_approval and action.risk == "high"
    assert (
        recording.action_record(
            run=run,
            actor=agent,
            tool="hr.create_user",
            idempotency_key="k1",
            target_type="user",
            target_id="ashu@company.com",
            args={"name": "Ashu"},
            compensation={"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        ).action.pk
        == action.pk
    )
    assert Run.objects.get(pk=run.pk).action_count == 1
    assert Action.objects.count() == 1


def test_it_gates_a_risky_action_behind_an_approval_bound_to_its_args(tenant, agent, bob):
    from ledger.audit import Actor
    from recovery.actions.approvals import action_record_gated, approval_approve

    run = runs.run_create(tenant=tenant, actor=agent, agent="payments", request="Refund order 7")
    recorded = action_record_gated(
        run=run, actor=agent, tool="payments.charge", idempotency_key="p1", args={"amount": 10}
    )
    action = recorded.action
    assert action.status == Action.Status.AWAITING_APPROVAL
    approval = action.approvals.get()
    approval_approve(approval=approval, actor=Actor.for_user(bob), reason="looks right", args={"amount": 9})
    action.refresh_from_db()
    assert action.status == Action.Status.APPROVED and action.args == {"amount": 9}
