"""Which policy's ``before`` the gateway follows (``saga_client.mcp.policy_cache``), picked as the
server picks (ledger/policies/resolve.py): an exact name beats a glob, a tenant's policy beats the
global one, the longer literal part wins; and the read's name on the upstream (``before_reads``)."""

from __future__ import annotations

from typing import Any

import pytest

from saga_client.mcp.before_reads import upstream_name
from saga_client.mcp.policy_cache import policy_for


def policy(tool: str, scope: str = "global", **extra: Any) -> dict[str, Any]:
    return {"tool": tool, "scope": scope, **extra}


@pytest.mark.parametrize(
    "policies, tool, expected",
    [
        ([policy("inv.*"), policy("inv.set_price")], "inv.set_price", "inv.set_price"),
        ([policy("inv.set_price"), policy("inv.*", "tenant")], "inv.set_price", "inv.set_price"),
        ([policy("inv.set_*"), policy("inv.*")], "inv.set_price", "inv.set_*"),
        ([policy("inv.set_price"), policy("inv.set_price", "tenant", mark=1)], "inv.set_price", "tenant"),
        ([policy("inv.*"), policy("*", "tenant")], "inv.get_item", "*"),  # tenant, then literal
        ([policy("inv.get_?tem")], "inv.get_item", "inv.get_?tem"),
        ([policy("crm.*")], "inv.set_price", None),
        ([policy("inv.set_price")], "inv.set_prices", None),
    ],
)
def test_the_most_specific_policy_governs(policies, tool, expected):
    picked = policy_for(policies, tool)
    if expected is None:
        assert picked is None
    elif expected == "tenant":
        assert picked is not None and picked["scope"] == "tenant" and picked["tool"] == tool
    else:
        assert picked is not None and picked["tool"] == expected


def test_a_glob_tenant_policy_beats_a_glob_global_one_of_the_same_length():
    picked = policy_for([policy("inv.*"), policy("inv.*", "tenant")], "inv.x")
    assert picked is not None and picked["scope"] == "tenant"


@pytest.mark.parametrize(
    "tool, namespace, expected",
    [
        ("inv.get_item", "inv", "get_item"),
        ("get_item", "", "get_item"),
        ("crm.get", "inv", "crm.get"),
        ("a.b.get", "a.b", "get"),
        ("inventory.get", "inv", "inventory.get"),
    ],
)
def test_the_read_is_called_without_the_gateways_namespace(tool, namespace, expected):
    assert upstream_name(tool, namespace) == expected
