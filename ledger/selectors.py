"""Reads shared by the API and the dashboard. Every lookup is scoped to a tenant (or a set of
tenants): another tenant's object is simply not found."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet, Subquery

from infra import errors
from infra.pagination import Key, Page, keyset_page
from ledger.models import Action, ActionClass, AgentKey, ArchivedRun, Checkpoint, Run, Tenant
from ledger.rules import COMPENSATABLE_CLASSES, is_pivot, pivot_order_warning

M = TypeVar("M", bound=Model)


def get_for_tenants(
    queryset: QuerySet[M], *, pk: str, tenants: Tenant | Iterable[Tenant] | Iterable[int]
) -> M:
    tenant_ids = [tenants.pk] if isinstance(tenants, Tenant) else [getattr(t, "pk", t) for t in tenants]
    obj = queryset.filter(pk=pk, tenant_id__in=tenant_ids).first()
    if obj is None:
        raise errors.NotFound.for_id(queryset.model.__name__, str(pk))
    return obj


def run_get(*, tenant: Tenant, run_id: str) -> Run:
    return get_for_tenants(Run.objects.select_related("tenant"), pk=run_id, tenants=tenant)


def action_get(*, tenant: Tenant, action_id: str) -> Action:
    return get_for_tenants(Action.objects.select_related("run", "run__tenant"), pk=action_id, tenants=tenant)


# --- What an API key reaches ------------------------------------------------------------------


def run_reach(key: AgentKey, *, write: bool = False, path: str = "") -> Q:
    """The one rule for which of its tenant's runs an API key reaches, as a filter on a run
    (``path=""``) or on an object through its run (``path="run__"``).

    A run belongs to the agent that created it: the name of the creating key (``Run.owner``).
    Every key issued with that name is the same agent, so a rotated key keeps access and older
    keys keep it until revoked. An ``agent`` key reaches only its agent's runs; a key with the
    ``operator`` scope *reads* every run of its tenant, but writes as an agent (actions,
    checkpoints, heartbeats, complete, fail, command acks) reach its own agent's runs only. A run
    out of reach is not found, exactly like another tenant's."""
    owner = reach_owner(key, write=write)
    return Q(**{f"{path}owner": owner}) if owner is not None else Q()


def reach_owner(key: AgentKey, *, write: bool = False) -> str | None:
    """``run_reach`` as a value: the owner the key's runs must have, or None for every run of its
    tenant (what a one-statement read, ``saga_admin.api.reads``, passes to its SQL)."""
    if write or AgentKey.Scope.OPERATOR not in key.scopes:
        return key.name
    return None


def run_get_for_key(*, key: AgentKey, run_id: str, write: bool = False) -> Run:
    return get_for_tenants(
        Run.objects.select_related("tenant").filter(run_reach(key, write=write)),
        pk=run_id,
        tenants=key.tenant,
    )


def archived_run_get(*, run_id: str, tenant_ids: Iterable[int], reach: Q | None = None) -> ArchivedRun | None:
    """The tombstone of a run retention archived (``ArchivedRun``), if it was one of the tenants'
    ``tenant_ids`` and is within ``reach`` (a ``run_reach`` filter: ``ArchivedRun.owner`` is the
    run's); else None.
    Asked only after the run itself was not found, so a live run costs nothing more: the API
    (``archived_run_for_key``) and the dashboard answer 410 with it instead of 404."""
    found = ArchivedRun.objects.filter(pk=run_id, tenant_id__in=tenant_ids)
    return found.filter(reach).first() if reach is not None else found.first()


def archived_run_for_key(*, key: AgentKey, run_id: str) -> ArchivedRun | None:
    """The tombstone of an archived run ``key`` could have read (``run_reach``: an agent key its own
    agent's, an operator key any of its tenant's). Reading decides, for a write too: a run gone to
    its archive takes no writes from anyone, and saying so tells a caller nothing a read would not;
    anyone else gets the 404 of a run that never existed."""
    return archived_run_get(run_id=run_id, tenant_ids=[key.tenant_id], reach=run_reach(key))


def action_get_for_key(*, key: AgentKey, action_id: str, write: bool = False) -> Action:
    return get_for_tenants(
        Action.objects.select_related("run", "run__tenant").filter(run_reach(key, write=write, path="run__")),
        pk=action_id,
        tenants=key.tenant,
    )


def runs_for_key(key: AgentKey) -> QuerySet[Run]:
    """The runs ``key`` may list (newest first is the caller's ordering)."""
    return Run.objects.filter(run_reach(key), tenant_id=key.tenant_id)


def run_reference_for_write(*, key: AgentKey, run_id: str) -> Run:
    """A reference (not a read) to the run ``key`` writes to as its agent, for a service that locks
    the row itself: ``ledger.services.runs.run_lock`` scopes the lock to the reference's tenant and
    owner, so another tenant's or another agent's run is not found there."""
    return Run(pk=run_id, tenant=key.tenant, owner=key.name)


def action_reference_for_write(*, key: AgentKey, action_id: str) -> Action:
    """A reference (not a read) to an action ``key`` reports on as its agent, for a service whose
    write scopes it itself (``ledger.services.actions.moves``: its tenant, and runs whose owner is the
    reference's ``owner``, the key's agent, ``run_reach``); out of reach, it is not found."""
    return Action(pk=action_id, tenant=key.tenant, owner=key.name)


def checkpoints_for_run(*, run: Run) -> QuerySet[Checkpoint]:
    """A run's checkpoints, newest first: the order every list of them and "the latest" use."""
    return Checkpoint.objects.filter(run=run).order_by("-created_at", "-id")


def checkpoint_latest(*, run: Run) -> Checkpoint | None:
    return checkpoints_for_run(run=run).first()


# A run's actions in the order they were recorded (``seq`` is unique per run; the id breaks no tie
# but keeps the paginator's rule that the last key is the unique id).
ACTIONS_IN_ORDER: tuple[Key, ...] = (("seq", False), ("id", False))
# How many actions a run's detail shows: its newest, the rest are paged (``run_actions_page``).
RUN_DETAIL_ACTIONS = 100


def run_actions_newest(*, run: Run, limit: int = RUN_DETAIL_ACTIONS) -> tuple[list[Action], bool]:
    """The run's newest ``limit`` actions in ``seq`` order, and whether it has older ones. One
    query (one row more than shown), whatever the run's length."""
    rows = list(Action.objects.filter(run=run).order_by("-seq")[: limit + 1])
    return rows[:limit][::-1], len(rows) > limit


def run_actions_page(*, run: Run, cursor: str | None, limit: int) -> Page[Action]:
    """A page of the run's actions, oldest first, after ``cursor`` (a forged one: 422)."""
    return keyset_page(Action.objects.filter(run=run), keys=ACTIONS_IN_ORDER, cursor=cursor, limit=limit)


def run_warnings(*, run: Run, actions: Iterable[Any] | None = None) -> list[dict[str, Any]]:
    """Pivot-order (``ledger.rules``) and unknown-outcome warnings for a run, from its actions.
    Without ``actions``, reads the few columns of only the actions a warning can concern (a pivot,
    a compensatable action, an unknown outcome), so a long run is not loaded whole."""
    if actions is None:
        # Not ``run.actions``: the related manager would read each row's deferred run_id. A
        # compensatable action can be named only after a pivot, so only those after the first
        # irreversible action are read; and as rows of five columns, not model instances.
        first_irreversible = (
            Action.objects.filter(run_id=run.pk, action_class=ActionClass.EXTERNAL_IRREVERSIBLE)
            .exclude(status=Action.Status.REJECTED)
            .order_by("seq")
            .values("seq")[:1]
        )
        actions = (
            Action.objects.filter(run_id=run.pk)
            .filter(
                Q(action_class=ActionClass.EXTERNAL_IRREVERSIBLE)
                | Q(status=Action.Status.UNKNOWN)
                | Q(action_class__in=COMPENSATABLE_CLASSES, seq__gt=Subquery(first_irreversible))
            )
            .exclude(status=Action.Status.REJECTED)
            .order_by("seq")
            .values_list("pk", "seq", "tool", "status", "action_class", named=True)
        )
    ordered = sorted(actions, key=lambda a: a.seq)
    warnings: list[dict[str, Any]] = []
    pivot: Any = None
    for action in ordered:
        if action.status == Action.Status.REJECTED:
            continue
        if pivot is None and is_pivot(action.action_class, action.status):
            pivot = action
        elif pivot is not None and action.action_class in COMPENSATABLE_CLASSES:
            warnings.append(
                pivot_order_warning(
                    action_id=action.pk,
                    tool=action.tool,
                    seq=action.seq,
                    pivot_id=pivot.pk,
                    pivot_tool=pivot.tool,
                    pivot_seq=pivot.seq,
                )
            )
        if action.status == Action.Status.UNKNOWN:
            warnings.append(
                {
                    "code": "outcome_unknown",
                    "action_id": action.pk,
                    "message": (
                        f"{action.tool} (#{action.seq}) timed out and may have happened; reconcile it "
                        "(confirm done or not done) before resuming or compensating."
                    ),
                }
            )
    return warnings
