"""The runs list's one filter: every run of some tenants, by agent, status, tool, start time and
an id or text search, newest first in keyset pages.

The dashboard's Runs page builds it from its form (``dashboard.run_filter_form``); an API list
may build the same object later. Its fields are validated when it is built, in one place: an
unknown status, a tool that is not a name or a ``*``/``?`` glob, a NUL byte or an over-long value
is a ``ValidationFailed`` with a sentence a person reads, never a database error.

Every read walks an index (``ledger/0021_runs_page_indexes``): the newest runs by
``(created_at, id)``, an agent's by ``run_tenant_agent`` / ``run_tenant_owner``, a status by
``run_tenant_status``, a tool through the run's actions (``action_seq_per_run``) or the tenant's
actions of that tool (``action_tenant_tool``), an exact id by its own index, and text by the
trigram index over the run's request and external id (where pg_trgm exists).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet

from infra import errors
from infra.pagination import NEWEST_FIRST, Key, Page, merged_keyset_page
from ledger import scoping
from ledger.models import Action, Run
from ledger.scoping import Tenants
from ledger.tool_names import TOOL_NAME_MAX_LENGTH

# Runs newest first: when they started, then the id (unique: a cursor never skips or repeats).
RUNS_ORDER: tuple[Key, ...] = NEWEST_FIRST
SEARCH_MAX_LENGTH = 500
AGENT_MAX_LENGTH = 200
SLUG_MAX_LENGTH = 50
# What the runs filter takes for a tool: a tool's name, or a glob of one with * and ? (the
# character classes policies allow are left out: a list filter does not need them).
_TOOL_FILTER = re.compile(rf"[A-Za-z0-9_.:/\-*?]{{1,{TOOL_NAME_MAX_LENGTH}}}")
TOOL_FILTER_RULE = "an exact tool name (letters, digits, . _ - : /) or a glob with * and ?, like crm.update_*"
# Control characters: PostgreSQL refuses a NUL in text, and none belongs in a name or a search.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _refuse(field: str, message: str) -> errors.ValidationFailed:
    return errors.ValidationFailed(message, details={"errors": [{"field": field, "message": message}]})


def _text(field: str, label: str, value: str, max_length: int) -> str:
    value = value.strip()
    if len(value) > max_length:
        raise _refuse(field, f"The {label} is too long (at most {max_length} characters).")
    if _CONTROL.search(value):
        raise _refuse(field, f"The {label} may not contain control characters.")
    return value


def tool_regex(tool: str) -> str:
    """A tool filter as an anchored PostgreSQL regular expression: ``*`` any run of characters,
    ``?`` one; the rest literal (of a tool name's characters only ``.`` means anything else)."""
    parts = {"*": ".*", "?": ".", ".": r"\."}
    return "^" + "".join(parts.get(char, char) for char in tool) + "$"


@dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows. ``agent``: the agent as operators see it, the name the run
    declares or the name of the key that created it (``Run.owner``), exactly. ``tool``: runs with
    any action of that tool (an exact name, or a glob with ``*`` and ``?``). ``started_after`` /
    ``started_before``: the run's start, inclusive / exclusive. ``search``: see ``exact_ids`` and
    ``matching``."""

    tenant_slug: str = ""
    agent: str = ""
    status: str = ""
    tool: str = ""
    started_after: datetime | None = None
    started_before: datetime | None = None
    search: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenant_slug", _text("tenant", "tenant", self.tenant_slug, SLUG_MAX_LENGTH))
        object.__setattr__(self, "agent", _text("agent", "agent", self.agent, AGENT_MAX_LENGTH))
        object.__setattr__(self, "search", _text("q", "search", self.search, SEARCH_MAX_LENGTH))
        if self.status and self.status not in Run.Status.values:
            shown = self.status[:40]
            raise _refuse(
                "status",
                f"Unknown status {shown!r}: a run is {', '.join(Run.Status.values[:-1])} or "
                f"{Run.Status.values[-1]}.",
            )
        tool = self.tool.strip()
        if tool and _TOOL_FILTER.fullmatch(tool) is None:
            raise _refuse("tool", f"The tool must be {TOOL_FILTER_RULE}.")
        object.__setattr__(self, "tool", tool)
        after, before = self.started_after, self.started_before
        if after is not None and before is not None and after >= before:
            raise _refuse("before", "“Started before” must be later than “started after”.")

    def runs(self, *, tenants: Tenants) -> QuerySet[Run]:
        """The runs of ``tenants`` that every field but the search matches."""
        tenant_ids = scoping.tenant_ids(tenants)
        queryset = Run.objects.filter(tenant_id__in=tenant_ids)
        if self.tenant_slug:
            queryset = queryset.filter(tenant__slug=self.tenant_slug)
        if self.agent:
            queryset = queryset.filter(Q(agent=self.agent) | Q(owner=self.agent))
        if self.status:
            queryset = queryset.filter(status=self.status)
        if self.started_after is not None:
            queryset = queryset.filter(created_at__gte=self.started_after)
        if self.started_before is not None:
            queryset = queryset.filter(created_at__lt=self.started_before)
        if self.tool:
            actions = Action.objects.filter(run_id=OuterRef("pk"))
            if "*" in self.tool or "?" in self.tool:
                actions = actions.filter(tool__regex=tool_regex(self.tool))
            else:
                actions = actions.filter(tool=self.tool)
            queryset = queryset.filter(Exists(actions))
        return queryset

    def exact_ids(self, *, tenants: Tenants) -> QuerySet[Run]:
        """The runs the search names exactly, as a run id, an external id, an action id or an
        action's target id; each is found through its own index (a union, not one OR across the
        tables, which no index serves)."""
        tenant_ids = scoping.tenant_ids(tenants)
        term = self.search
        by_action = Action.objects.filter(tenant_id__in=tenant_ids)
        ids = (
            Run.objects.filter(pk=term)
            .values("pk")
            .order_by()
            .union(
                Run.objects.filter(tenant_id__in=tenant_ids, external_id=term).values("pk").order_by(),
                by_action.filter(pk=term).values("run_id").order_by(),
                by_action.filter(target_id=term).values("run_id").order_by(),
            )
        )
        return self.runs(tenants=tenant_ids).filter(pk__in=ids)

    def matching(self, *, tenants: Tenants) -> tuple[QuerySet[Run], bool]:
        """The runs the filter matches and whether the search named them exactly: the runs it names
        as an id when there are any, else those whose request or external id contains it (any
        case). Without a search, every run the other fields match (and ``False``)."""
        if not self.search:
            return self.runs(tenants=tenants), False
        exact = self.exact_ids(tenants=tenants)
        if exact.exists():
            return exact, True
        text = Q(request__icontains=self.search) | Q(external_id__icontains=self.search)
        return self.runs(tenants=tenants).filter(text), False


def runs_page(
    *, tenants: Tenants, run_filter: RunFilter, cursor: str | None, limit: int, strict: bool = True
) -> tuple[Page[Run], bool]:
    """A page of the runs ``run_filter`` matches, newest first, after ``cursor`` (a forged one is
    a ``ValidationFailed`` when ``strict``, else the first page), and whether the search named
    them exactly."""
    # One page per tenant, merged: each reads its own newest runs (``run_tenant_*`` indexes), so a
    # neighbour tenant's burst of runs never lies between a tenant and its own (PostgreSQL cannot
    # walk one index in order for several tenants under a LIMIT; it would filter the global order).
    tenant_ids = scoping.tenant_ids(tenants)
    matched = [run_filter.matching(tenants=[tenant_id]) for tenant_id in tenant_ids] or [
        run_filter.matching(tenants=tenant_ids)
    ]
    page = merged_keyset_page(
        [queryset.select_related("tenant") for queryset, _ in matched],
        keys=RUNS_ORDER,
        cursor=cursor,
        limit=limit,
        strict=strict,
    )
    return page, any(exact for _, exact in matched)
