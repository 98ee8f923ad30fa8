"""Whether the compensations a tenant's policies name reach the upstreams their tools were
performed on (``ledger.upstreams``): what ``load_policies`` warns about and the policies page
shows, before any undo waits for a person because of it."""

from __future__ import annotations

from typing import Any

from ledger.models import Tenant
from ledger.policies.resolve import mandated_compensation_tool, policy_resolve
from ledger.upstreams import compensator_reach, compensator_row, goes_to, recent_upstreams


def policy_upstream_mismatches(*, tenant: Tenant) -> list[dict[str, Any]]:
    """The tool/compensator pairs of the tenant's policies known not to reach the upstream that
    performed the tool: for each (tool, upstream) of its recent gateway-recorded actions, the
    compensating tool the policy in force names for that tool, and where its compensator goes.
    What is knowable: upstreams come only from recorded actions (the server never learns of a
    gateway that has recorded nothing), and a tool whose compensation the agent names has none to
    check here (the planner still checks each step). A Python compensator registered in code is
    not seen here (it is not MCP, so it reaches no upstream either)."""
    found: list[dict[str, Any]] = []
    for tool, upstream in recent_upstreams(tenant_id=tenant.pk):
        compensation_tool = mandated_compensation_tool(policy_resolve(tenant=tenant, tool=tool), tool=tool)
        if not compensation_tool:
            continue
        reach = compensator_reach(
            via={"upstream": upstream}, row=compensator_row(tenant_id=tenant.pk, tool=compensation_tool)
        )
        if reach is None or reach.reaches:
            continue
        found.append(
            {
                "tool": tool,
                "compensation_tool": compensation_tool,
                "performed_on": upstream,
                "compensator": reach.compensator,
                "message": f"{tool} was performed on {upstream} (recorded through a gateway), but its "
                f"compensation {compensation_tool} goes to {goes_to(reach.compensator)}: undoing it "
                "will wait for a person.",
            }
        )
    return found
