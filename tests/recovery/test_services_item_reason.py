from __future__ import annotations

from ledger.models import ToolPolicy
from ledger.services import runs
from ledger.services.actions import moves, recording
from recovery.actions.reports import action_fail_and_queue, run_fail_and_queue
from recovery.models import RecoveryItem
from recovery.transitions import items as recovery_items


def test_it_keeps_the_specific_reason_when_the_agent_then_fails_the_run(tenant, agent):
    """An unknown outcome queues the run; the agent giving up afterwards must not relabel the item
    as a generic failure, or the operator loses the reason a reconcile is needed."""
    ToolPolicy.objects.create(
        tool="email.*",
        risk="medium",
        approval="auto",
        action_class="external_irreversible",
        compensation="none",
    )
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu")
    action = recording.action_record(
        run=run, actor=agent, tool="email.send_welcome", idempotency_key="e1"
    ).action
    moves.action_start(action=action, actor=agent)
    action_fail_and_queue(
        action=action, actor=agent, error="timed out", retryable=True, layer="tool", outcome_unknown=True
    )
    run_fail_and_queue(run=run, actor=agent, error="gave up", failed_action=action)

    item = RecoveryItem.objects.get(run=run)
    assert item.reason == RecoveryItem.Reason.OUTCOME_UNKNOWN
    assert item.suggested_resolution == RecoveryItem.Suggestion.RECONCILE
    assert item.error == "gave up"


def test_it_takes_the_more_specific_reason_over_a_generic_failure(tenant, agent):
    run = runs.run_create(tenant=tenant, actor=agent, agent="crm", request="Raise ticket priority")
    run_fail_and_queue(run=run, actor=agent, error="tool error")
    item = recovery_items.item_open_or_update(
        run=run, reason=RecoveryItem.Reason.STATE_DRIFT, actor=agent, error="someone edited the ticket"
    )
    assert item.reason == RecoveryItem.Reason.STATE_DRIFT
    assert RecoveryItem.objects.filter(run=run).count() == 1
