"""Builders for the bulk-decision tests: many runs failing the same way, each in the queue."""

from __future__ import annotations

from ledger.audit import Actor
from ledger.models import Tenant
from ledger.services import runs
from recovery.actions.reports import run_fail_and_queue
from recovery.models import RecoveryItem
from tests.factories import auto_policy, perform_action


def crm_policies() -> None:
    """``crm.*`` tools low-risk and automatic, undone by ``crm.restore`` (automatic too)."""
    auto_policy("crm.*", compensation="custom", compensation_tool="crm.restore")


def failing_runs(
    tenant: Tenant,
    agent: Actor,
    count: int,
    *,
    tool: str = "crm.update_contact",
    agent_name: str = "crm-sync",
    undoable: bool = False,
) -> list[RecoveryItem]:
    """``count`` runs of ``agent_name`` whose ``tool`` call failed (after a succeeded
    ``crm.create_note`` when ``undoable``), each failed into the queue: their open items."""
    made = []
    for n in range(count):
        run = runs.run_create(tenant=tenant, actor=agent, agent=agent_name, request=f"Sync contact {n}")
        if undoable:
            perform_action(
                run,
                agent,
                "crm.create_note",
                target_type="contact",
                target_id=f"c-{n}",
                args={"n": n},
                compensation={"tool": "crm.restore", "args": {"n": n}},
            )
        failed = perform_action(
            run, agent, tool, target_type="contact", target_id=f"c-{n}", args={"n": n}, fail="upstream 503"
        )
        outcome = run_fail_and_queue(run=run, actor=agent, error="upstream 503", failed_action=failed)
        assert outcome.item is not None
        made.append(outcome.item)
    return made
