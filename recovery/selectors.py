"""Reads shared by the operator API and the dashboard: the recovery queue (one filter, one
search), the approval inbox (one rule for "pending"), items, unwinds and steps, a run's pending
commands and the resume preview. Every lookup is narrowed to the caller's reach
(``ledger.scoping``): another tenant's object is simply not found (404, never 403, so existence
does not leak)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from infra import errors
from infra.pagination import Page, keyset_page
from ledger import scoping
from ledger.models import Action, ActionClass, Checkpoint, Risk, Run
from ledger.scoping import Reach, Tenants
from ledger.selectors import checkpoint_latest
from ledger.services.runs import CANCELLABLE
from ledger.tool_names import TOOL_NAME_MAX_LENGTH, check_tool_name, glob_regex, is_glob
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import AgentCommand, Approval, RecoveryItem, Unwind, UnwindStep
from recovery.planner import PLANNABLE_STATUSES
from recovery.transitions.approvals import pending_q

# The longest text each of the filter's fields takes (longer is a 422, not a slow query).
FILTER_TEXT_MAX_LENGTH = {
    "run_id": 40,
    "tenant_slug": 50,
    "signature": 64,
    "search": 500,
    "agent": 200,
    "tool": TOOL_NAME_MAX_LENGTH,
}
# What the queue's status filter accepts besides the item states.
QUEUE_STATUSES = ("unresolved", *RecoveryItem.Status.values, "all")
# Newest first by id: ids are time-ordered ULIDs.
_BY_ID_DESC = (("id", True),)


def _choice(name: str, value: str | None, choices: Iterable[str]) -> str | None:
    if value and value not in choices:
        raise errors.ValidationFailed(f"Unknown {name} {value!r}.", details={name: value})
    return value or None


# --- The recovery queue ------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueFilter:
    """The recovery queue's one filter: its fields, their validation and the query, for every
    caller (the dashboard's filter form and the operator API's query schema build it; bulk
    decisions take it). ``status`` defaults to unresolved (open and claimed); ``all`` is every
    item. ``older_than``: opened strictly before that long ago. ``agent``: the run's agent as
    operators see it, the one it declared or the key's name that owns it (``Run.agent`` or
    ``Run.owner``, exact). ``tool``: the failed action's tool, an exact name or a glob
    (``crm.update_*``). ``search`` (the API's ``q``): an item, run, external or target id, else
    part of the failing tool's name or of the run's request. An unknown status, reason or risk, a
    tool that is no tool name or glob, or a value past its length is a ``ValidationFailed`` when
    the filter is built, never silently ignored."""

    status: str = "unresolved"
    reason: str = ""
    risk: str = ""
    older_than: timedelta | None = None
    run_id: str = ""
    tenant_slug: str = ""
    signature: str = ""
    search: str = ""
    agent: str = ""
    tool: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _choice("status", self.status, QUEUE_STATUSES) or "unresolved")
        _choice("reason", self.reason, RecoveryItem.Reason.values)
        _choice("risk", self.risk, Risk.values)
        for name in ("run_id", "tenant_slug", "signature", "search", "agent", "tool"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise errors.ValidationFailed(f"The {name} must be text.", details={"field": name})
            object.__setattr__(self, name, value.strip())
            if len(getattr(self, name)) > FILTER_TEXT_MAX_LENGTH[name]:
                raise errors.ValidationFailed(
                    f"The {name} is longer than {FILTER_TEXT_MAX_LENGTH[name]} characters.",
                    details={"field": name, "max_length": FILTER_TEXT_MAX_LENGTH[name]},
                )
        if self.tool:
            check_tool_name(self.tool, field="tool", glob=True)

    def is_empty(self) -> bool:
        """Whether the filter narrows nothing but the status: every item of the tenants in one
        state (``status=all`` alone is every item there is). A bulk decision refuses it
        (``filter_required``): it must name a reason, risk, age, agent, tool, search, run, tenant
        or group."""
        return replace(self, status="unresolved") == QueueFilter()

    def as_dict(self) -> dict[str, Any]:
        """The filter as JSON (a bulk decision keeps the filter it was started with)."""
        return {
            "status": self.status,
            "reason": self.reason,
            "risk": self.risk,
            "older_than_s": int(self.older_than.total_seconds()) if self.older_than is not None else None,
            "run_id": self.run_id,
            "tenant_slug": self.tenant_slug,
            "signature": self.signature,
            "search": self.search,
            "agent": self.agent,
            "tool": self.tool,
        }

    def items(self, *, tenants: Tenants, now: datetime | None = None) -> QuerySet[RecoveryItem]:
        """The items of ``tenants`` the filter matches."""
        tenant_ids = scoping.tenant_ids(tenants)
        queryset = RecoveryItem.objects.filter(tenant_id__in=tenant_ids)
        if self.status == "unresolved":
            queryset = queryset.filter(status__in=RecoveryItem.UNRESOLVED)
        elif self.status != "all":
            queryset = queryset.filter(status=self.status)
        exact = {
            "reason": self.reason,
            "risk": self.risk,
            "run_id": self.run_id,
            "tenant__slug": self.tenant_slug,
            "signature": self.signature,
            # A glob is matched by the database as the equivalent regular expression.
            ("failed_action__tool__regex" if is_glob(self.tool) else "failed_action__tool"): (
                glob_regex(self.tool) if is_glob(self.tool) else self.tool
            ),
        }
        queryset = queryset.filter(**{name: value for name, value in exact.items() if value})
        if self.older_than is not None:
            queryset = queryset.filter(opened_at__lt=(now or timezone.now()) - self.older_than)
        if self.agent:
            queryset = queryset.filter(
                run_id__in=Run.objects.filter(
                    Q(agent=self.agent) | Q(owner=self.agent), tenant_id__in=tenant_ids
                ).values("pk")
            )
        if self.search:
            queryset = _search(queryset, self.search, tenant_ids=tenant_ids)
        return queryset


def _search(qs: QuerySet[RecoveryItem], term: str, *, tenant_ids: list[int]) -> QuerySet[RecoveryItem]:
    """Exact ids first: an item, run, external or target id, each found through its own index.
    Only when none of them matches, part of the failing tool's name or of the run's request.

    One OR across the joined tables (as this once was) is served by no index: PostgreSQL read
    every unresolved item with its run (a sequential scan of all runs) for any term.
    """
    exact_ids = (
        RecoveryItem.objects.filter(pk=term)
        .values("pk")
        .order_by()
        .union(
            RecoveryItem.objects.filter(
                run_id__in=Run.objects.filter(
                    Q(pk=term) | Q(tenant_id__in=tenant_ids, external_id=term)
                ).values("pk")
            )
            .values("pk")
            .order_by(),
            RecoveryItem.objects.filter(
                failed_action_id__in=Action.objects.filter(tenant_id__in=tenant_ids, target_id=term).values(
                    "pk"
                )
            )
            .values("pk")
            .order_by(),
        )
    )
    exact = qs.filter(pk__in=exact_ids)
    if exact.exists():
        return exact
    # Served by the trigram index over unresolved items' search text (recovery/0003).
    return qs.filter(search_text__contains=term.lower())


def items_list(
    *, tenants: Tenants, queue_filter: QueueFilter, cursor: str | None = None, limit: int = 50
) -> Page[RecoveryItem]:
    """A page of the recovery queue, newest first (the operator API)."""
    queryset = queue_filter.items(tenants=tenants).select_related(
        "run", "failed_action", "assignee", "claimed_by"
    )
    return keyset_page(queryset, keys=_BY_ID_DESC, cursor=cursor, limit=limit)


def item_unresolved(*, run: Run) -> RecoveryItem | None:
    """The run's item in the queue, if it has one (at most one is unresolved)."""
    return RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()


def item_get(*, reach: Reach, item_id: str) -> RecoveryItem:
    return reach.get(
        RecoveryItem.objects.select_related("run", "run__tenant", "failed_action", "assignee", "claimed_by"),
        item_id,
    )


def item_age_seconds(item: RecoveryItem, *, now: datetime | None = None) -> int:
    """How long the item has been (or was) in the queue; never negative, whatever the clocks."""
    end = item.resolved_at or now or timezone.now()
    return max(0, int((end - item.opened_at).total_seconds()))


# --- Bulk decisions by filter ----------------------------------------------------------------


def bulk_get(*, reach: Reach, bulk_id: str) -> BulkOperation:
    return reach.get(BulkOperation.objects.select_related("tenant"), bulk_id)


def bulk_items(*, bulk: BulkOperation, outcome: str, limit: int = 50) -> list[BulkItem]:
    """The bulk's items with ``outcome``, in the order it decides them (the first ``limit``)."""
    return list(
        BulkItem.objects.filter(bulk=bulk, outcome=outcome)
        .select_related("item__failed_action")
        .order_by("position")[:limit]
    )


def bulks_for_run(*, run_id: str) -> list[BulkOperation]:
    """The bulk decisions that matched one of the run's items, newest first (its trail links them)."""
    return list(
        BulkOperation.objects.filter(
            pk__in=BulkItem.objects.filter(run_id=run_id).values("bulk_id")
        ).order_by("-started_at")
    )


# --- Unwinds and steps -----------------------------------------------------------------------


def unwind_get(*, reach: Reach, unwind_id: str) -> Unwind:
    return reach.get(Unwind.objects.select_related("run", "item"), unwind_id)


def unwind_steps(*, unwind: Unwind) -> list[UnwindStep]:
    return list(unwind.steps.select_related("action", "approval").order_by("position"))


def unwinds_for_run(*, run_id: str) -> list[Unwind]:
    return list(Unwind.objects.filter(run_id=run_id).order_by("-created_at"))


def step_get(*, reach: Reach, step_id: str) -> UnwindStep:
    return reach.get(
        UnwindStep.objects.select_related("unwind", "unwind__run", "action"),
        step_id,
        tenant_field="unwind__tenant_id",
    )


# --- Approvals ---------------------------------------------------------------------------------


def latest_action_approvals(
    *, run_id: str, action_id: str | None = None, action_ids: Iterable[str] | None = None
) -> dict[str, Approval]:
    """The newest approval of each of a run's actions (or of ``action_id`` alone, or of those in
    ``action_ids``: a page of them), by action id: an action asked again after an expiry has
    several, and it shows the newest."""
    queryset = Approval.objects.filter(run_id=run_id, kind=Approval.Kind.ACTION)
    if action_id is not None:
        queryset = queryset.filter(action_id=action_id)
    if action_ids is not None:
        queryset = queryset.filter(action_id__in=list(action_ids))
    return {approval.action_id: approval for approval in queryset.order_by("created_at", "id")}


def approval_get(*, reach: Reach, approval_id: str) -> Approval:
    return reach.get(Approval.objects.select_related("run", "run__tenant", "action", "step"), approval_id)


def approvals_pending(*, tenants: Tenants, now: datetime | None = None) -> QuerySet[Approval]:
    """Approvals waiting for a decision (``recovery.transitions.approvals.pending_q``: not past their expiry),
    the inbox's and the badge's one definition."""
    return Approval.objects.filter(pending_q(now=now), tenant_id__in=scoping.tenant_ids(tenants))


def approvals_list(
    *,
    tenants: Tenants,
    status: str | None = Approval.Status.PENDING,
    kind: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[Approval]:
    """The approval inbox for automation, newest first. ``pending`` means still decidable (not
    past its expiry); ``all`` is every approval."""
    if status == Approval.Status.PENDING:
        queryset = approvals_pending(tenants=tenants)
    else:
        queryset = Approval.objects.filter(tenant_id__in=scoping.tenant_ids(tenants))
        if status and status != "all":
            _choice("status", status, Approval.Status.values)
            queryset = queryset.filter(status=status)
    if _choice("kind", kind, Approval.Kind.values):
        queryset = queryset.filter(kind=kind)
    return keyset_page(
        queryset.select_related("run", "action", "step"), keys=_BY_ID_DESC, cursor=cursor, limit=limit
    )


# --- Agent commands ----------------------------------------------------------------------------


def commands_pending(*, run: Run) -> QuerySet[AgentCommand]:
    return AgentCommand.objects.filter(run=run, status=AgentCommand.Status.PENDING).select_related(
        "checkpoint"
    )


# --- Resume preview ----------------------------------------------------------------------------


@dataclass
class ResumePreview:
    run: Run
    checkpoint: Checkpoint | None
    succeeded_after: list[Action]
    repeats: list[Action]
    unknown: list[Action]
    warnings: list[dict[str, Any]]

    @property
    def stale(self) -> bool:
        return bool(self.succeeded_after)

    @property
    def compensate_only(self) -> bool:
        """The checkpoint forbids resuming there (the preview warns; resuming is refused)."""
        return (
            self.checkpoint is not None
            and self.checkpoint.recovery_mode == Checkpoint.RecoveryMode.COMPENSATE_ONLY
        )

    def as_dict(self) -> dict[str, Any]:
        def brief(action: Action) -> dict[str, Any]:
            return {
                "id": action.pk,
                "tool": action.tool,
                "seq": action.seq,
                "status": action.status,
                "action_class": action.action_class,
                "completion_seq": action.completion_seq,
            }

        return {
            "run_id": self.run.pk,
            "checkpoint_id": getattr(self.checkpoint, "pk", None),
            "checkpoint_name": getattr(self.checkpoint, "name", None),
            "stale": self.stale,
            "succeeded_after": [brief(a) for a in self.succeeded_after],
            "repeats": [brief(a) for a in self.repeats],
            "unknown": [brief(a) for a in self.unknown],
            "warnings": self.warnings,
        }


def _checkpoint_for(run: Run, checkpoint: Checkpoint | None) -> Checkpoint | None:
    if checkpoint is None:
        return checkpoint_latest(run=run)
    if checkpoint.run_id != run.pk:
        raise errors.ValidationFailed(
            "The checkpoint does not belong to this run.", details={"checkpoint_id": checkpoint.pk}
        )
    return checkpoint


def _naming(code: str, lead: str, actions: list[Action]) -> dict[str, Any]:
    """A resume warning about some actions: ``lead`` and their tools in its message, their ids."""
    return {
        "code": code,
        "message": f"{lead}: " + ", ".join(a.tool for a in actions) + ".",
        "action_ids": [a.pk for a in actions],
    }


def resume_preview(*, item: RecoveryItem, checkpoint: Checkpoint | None = None) -> ResumePreview:
    """What a resume from ``checkpoint`` (default: the latest) would mean. A checkpoint is stale
    when actions succeeded after it was written (its ``completion_mark``): the agent, restarting
    there, would do them again; the irreversible ones among them would happen twice."""
    run = item.run
    chosen = _checkpoint_for(run, checkpoint)
    actions = list(Action.objects.filter(run=run).order_by("seq"))
    mark = chosen.completion_mark if chosen is not None else 0
    after = sorted(
        (a for a in actions if a.completion_seq is not None and a.completion_seq > mark),
        key=lambda a: a.completion_seq or 0,
    )
    repeats = [a for a in after if a.action_class == ActionClass.EXTERNAL_IRREVERSIBLE]
    unknown = [a for a in actions if a.status == Action.Status.UNKNOWN]
    warnings: list[dict[str, Any]] = []
    if chosen is None:
        # One warning, not "no checkpoint" and "stale checkpoint" side by side: without a
        # checkpoint, what succeeded so far is what a restart from the beginning repeats.
        repeated = (
            f", repeating the {len(after)} action(s) that already succeeded: "
            + ", ".join(a.tool for a in after)
            if after
            else ""
        )
        warnings.append(
            {
                "code": "no_checkpoint",
                "message": f"The run wrote no checkpoint: a resume restarts it from the beginning{repeated}.",
                "action_ids": [a.pk for a in after],
            }
        )
    elif after:
        warnings.append(
            {
                "code": "stale_checkpoint",
                "message": (
                    f"{len(after)} action(s) succeeded after checkpoint "
                    f"{getattr(chosen, 'name', '(start)')!s}: "
                    + ", ".join(a.tool for a in after)
                    + ". Resuming there repeats them."
                ),
                "action_ids": [a.pk for a in after],
            }
        )
    if repeats:
        warnings.append(
            _naming("repeats_non_idempotent", "A resume would repeat irreversible actions", repeats)
        )
    if unknown:
        warnings.append(_naming("outcome_unknown", "Reconcile unknown outcomes before resuming", unknown))
    preview = ResumePreview(
        run=run, checkpoint=chosen, succeeded_after=after, repeats=repeats, unknown=unknown, warnings=warnings
    )
    if preview.compensate_only:
        warnings.append(
            {
                "code": "resume_not_allowed",
                "message": f"Checkpoint {getattr(chosen, 'name', '')} says compensate only: "
                "the agent cannot resume here.",
            }
        )
    return preview


# --- Cancel preview ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelPreview:
    """What cancelling ``run`` does, as the operator's confirmation shows it (and as
    ``recovery.actions.cancellations.run_cancel`` then does it, in one transaction)."""

    run: Run
    running: list[Action]  # become ``unknown``: someone confirms whether each happened
    unknown: list[Action]  # already ``unknown``
    changed: list[Action]  # succeeded and not read-only: stay as they are until someone decides
    awaiting: list[Action]  # awaiting approval: their approvals are withdrawn (and they rejected)
    item: RecoveryItem | None  # the run's unresolved item (updated, not duplicated)
    agent_told_by_push: bool  # a resume_url gets the signed cancel command too

    @property
    def cancellable(self) -> bool:
        return self.run.status in CANCELLABLE

    @property
    def queues(self) -> bool:
        """Whether the run lands in (or stays in) the recovery queue, reason ``cancelled``."""
        return bool(self.running or self.unknown or self.changed) or self.item is not None


def cancel_preview(*, run: Run) -> CancelPreview:
    actions = list(run.actions.order_by("seq"))
    return CancelPreview(
        run=run,
        running=[a for a in actions if a.status == Action.Status.RUNNING],
        unknown=[a for a in actions if a.status == Action.Status.UNKNOWN],
        changed=[
            a for a in actions if a.status in PLANNABLE_STATUSES and a.action_class != ActionClass.READ_ONLY
        ],
        awaiting=[a for a in actions if a.status == Action.Status.AWAITING_APPROVAL],
        item=item_unresolved(run=run),
        agent_told_by_push=bool(run.resume_url),
    )
