"""Which upstream performed a forward call, and whether a compensator reaches it.

A gateway (``saga-mcp``) records each call with ``via``: its own identity and the upstream MCP
server it forwarded the call to (a Streamable HTTP URL, or the command it starts over stdio). An
undo that goes anywhere else leaves the effect in place while the run reads ``compensated``, so
the planner asks here whether the step's compensator reaches that upstream: only an MCP
compensator whose URL is the same upstream does. A webhook, a Python compensator, an MCP
compensator on another server, and any compensator of a stdio upstream (nothing outside the
gateway's process can reach it) do not.

``via`` is the recording agent's statement, like every field it sends: it can only make an undo
more careful (a step a person must approve), never let one run that would not run without it,
and nothing here calls the address it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.db.models import Q

from ledger.models import Action, Compensator

# How many of a tenant's newest gateway-recorded actions the policy checks read (a bounded index
# scan of ``action_via_recent``, not the whole ledger).
RECENT_VIA_ACTIONS = 2000

_DEFAULT_PORTS = {"http": 80, "https": 443}


def upstream_key(text: str) -> str | None:
    """The upstream as compared: ``scheme://host:port/path`` for an http(s) URL (scheme and host
    lowercased, the default port written out, no credentials, query, fragment or trailing slash),
    None for anything else (a stdio command). Names are compared as written, never resolved:
    ``localhost`` and ``127.0.0.1`` are two upstreams."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}{parts.path.rstrip('/')}"


def upstream_shown(text: str) -> str:
    """An address as a plan or page may show it: an http(s) URL without credentials or query."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return text
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
        return text
    return f"{parts.scheme.lower()}://{parts.hostname}{f':{port}' if port else ''}{parts.path}"


def via_upstream(via: Any) -> str:
    """The upstream a recorded ``via`` names ("" when the action has none)."""
    if isinstance(via, dict) and isinstance(via.get("upstream"), str):
        return str(via["upstream"])
    return ""


@dataclass(frozen=True)
class Reach:
    """Whether the compensator of a step reaches the upstream its forward call was performed on."""

    performed_on: str  # the forward action's upstream, as recorded
    gateway: str  # the gateway that recorded it
    compensator: str  # where the compensator goes: an MCP server's URL, "webhook", "python", ""
    reaches: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "performed_on": self.performed_on,
            "gateway": self.gateway,
            "compensator": self.compensator,
            "reaches": self.reaches,
        }

    def mismatch(self, *, tool: str) -> str:
        """The sentence a plan, an approval and a page show for a compensator that does not reach
        the upstream ("" when it does)."""
        if self.reaches:
            return ""
        stdio = upstream_key(self.performed_on) is None
        where = "a stdio upstream no compensator can reach" if stdio else "that server"
        return (
            f"upstream mismatch: the action was performed on {self.performed_on} (through "
            f"{self.gateway or 'a gateway'}), but {tool} goes to {goes_to(self.compensator)}, not "
            f"{where}; undoing it there "
            "would leave the effect in place, so a person must check and approve this step"
        )


def goes_to(compensator: str) -> str:
    if upstream_key(compensator):
        return f"an MCP server at {compensator}"
    return f"a {compensator} compensator" if compensator else "no registered compensator"


def compensators_in_force(*, tenant_id: int) -> list[Compensator]:
    """Every policy-file compensator that serves a tool for the tenant, by tool: its own rows, and
    the global ones for tools it has no row of (the rule ``compensator_row`` applies to one tool)."""
    rows = Compensator.objects.filter(Q(tenant_id=tenant_id) | Q(tenant__isnull=True)).order_by("tool")
    in_force: dict[str, Compensator] = {}
    for row in rows:
        if row.tool not in in_force or row.tenant_id:
            in_force[row.tool] = row
    return list(in_force.values())


def compensator_row(*, tenant_id: int, tool: str) -> Compensator | None:
    """The policy-file compensator that serves ``tool`` for the tenant: its own row, else the
    global one (a row beats a Python compensator registered in code for the same tool)."""
    rows = list(Compensator.objects.filter(Q(tenant_id=tenant_id) | Q(tenant__isnull=True), tool=tool))
    # The tenant's own row beats the global one.
    rows.sort(key=lambda row: 0 if row.tenant_id else 1)
    return rows[0] if rows else None


def compensator_reach(*, via: Any, row: Compensator | None, in_code: bool = False) -> Reach | None:
    """``row`` (the compensator that would serve the step; None when only code, ``in_code``, or
    nothing serves it) against the forward action's ``via``. None when the action names no
    upstream (nothing to compare)."""
    performed_on = via_upstream(via)
    if not performed_on:
        return None
    gateway = str(via.get("gateway") or "") if isinstance(via, dict) else ""
    if row is None:
        return Reach(performed_on, gateway, "python" if in_code else "", False)
    if row.kind != Compensator.Kind.MCP:
        return Reach(performed_on, gateway, row.kind, False)
    key = upstream_key(performed_on)
    return Reach(
        performed_on, gateway, upstream_shown(row.url), key is not None and key == upstream_key(row.url)
    )


def recent_upstreams(*, tenant_id: int) -> list[tuple[str, str]]:
    """The distinct (tool, upstream) pairs of the tenant's newest gateway-recorded actions (at most
    ``RECENT_VIA_ACTIONS`` read), in the order first seen."""
    rows = (
        Action.objects.filter(tenant_id=tenant_id, via__isnull=False)
        .order_by("-created_at")
        .values_list("tool", "via")[:RECENT_VIA_ACTIONS]
    )
    pairs: dict[tuple[str, str], None] = {}
    for tool, via in rows:
        upstream = via_upstream(via)
        if upstream:
            pairs.setdefault((tool, upstream), None)
    return list(pairs)
