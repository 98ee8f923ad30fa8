from __future__ import annotations

from ledger import services
from ledger.models import Action, Run


def test_it_records_runs_and_actions_through_the_state_machine(tenant, agent):
    run = services.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    recorded = services.action_record(
        run=run, actor=agent, tool="hr.create_user", idempotency_key="k1", target_type="user",
        target_id="ashu@company.com", args={"name": "Ashu"},
        compensation={"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
    )
    assert recorded.created
    action = recorded.action
    # The built-in default policy is conservative: an unknown tool needs approval.
    assert action.requires_approval and action.risk == "high"
    assert services.action_record(
        run=run, actor=agent, tool="hr.create_user", idempotency_key="k1", target_type="user",
        target_id="ashu@company.com", args={"name": "Ashu"},
        compensation={"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
    ).action.pk == action.pk
    assert Run.objects.get(pk=run.pk).action_count == 1
    assert Action.objects.count() == 1
