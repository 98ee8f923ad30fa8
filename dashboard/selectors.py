"""Reads that only the dashboard needs: the queue (filters, search, keyset pages, groups), the
run page bundle, the approval inbox and the metrics. Every read is scoped to the user's tenants.

No list here counts the ledger: pages are keyset-paginated (fetch one row more than shown), and
the only counts are over small, indexed sets (pending approvals, new queue items, capped).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import (
    Aggregate,
    Avg,
    Case,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.utils import timezone

from dashboard import permissions
from dashboard.permissions import Someone
from dashboard.templatetags.dashboard import confidence
from ledger.compensation_risks import CompensationWarning, unattended_destructive_compensations
from ledger.conf import saga
from ledger.ids import looks_like_id
from ledger.models import (
    Action,
    ApprovalMode,
    Checkpoint,
    CompensationStrategy,
    Compensator,
    Event,
    Risk,
    Run,
    Tenant,
    ToolPolicy,
)
from ledger.pagination import OLDEST_FIRST, Key, keyset_page
from ledger.policies import policies_in_force, policy_settings_for
from ledger.policy_rules import compile_rules
from ledger.selectors import checkpoints_for_run, run_warnings
from ledger.upstreams import policy_upstream_mismatches
from recovery import selectors as recovery_selectors
from recovery.approvals import pending_q
from recovery.commands import overdue_before
from recovery.models import AgentCommand, Approval, RecoveryItem, Unwind, UnwindStep
from recovery.planner import APPROVAL_RISKS
from recovery.trail import run_trail
from recovery.unwinds.state import planned_step

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

APPROVAL_BADGE_CAP = 99
NEW_ITEMS_CAP = 100
GROUPS_SHOWN = 8

AGE_CHOICES = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "4h": timedelta(hours=4),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
SORTS = ("newest", "oldest", "risk")

_RISK_RANK = Case(
    *[
        When(risk=risk, then=Value(rank))
        for risk, rank in ((Risk.LOW, 0), (Risk.MEDIUM, 1), (Risk.HIGH, 2), (Risk.CRITICAL, 3))
    ],
    default=Value(0),
    output_field=IntegerField(),
)

# (field, descending) per sort; the last field is always the unique id, so the order is total
# and a keyset cursor never skips or repeats a row.
_SORT_KEYS: dict[str, list[Key]] = {
    "newest": [("opened_at", True), ("id", True)],
    "oldest": [("opened_at", False), ("id", False)],
    "risk": [("risk_rank", True), ("opened_at", False), ("id", False)],
}


# --- Queue ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueFilters:
    tenant: str = ""
    risk: str = ""
    reason: str = ""
    status: str = "unresolved"
    age: str = ""
    q: str = ""
    sort: str = "newest"
    signature: str = ""

    def as_query(self) -> dict[str, str]:
        """The non-default filters, for links that keep them (pagination, polling)."""
        defaults = QueueFilters()
        return {
            name: value for name, value in self.__dict__.items() if value and value != getattr(defaults, name)
        }


class QueueRowAnnotations(TypedDict):
    """What ``queue_page`` annotates each item with (the template reads ``approval_pending``)."""

    risk_rank: int
    approval_pending: bool
    resume_overdue_since: datetime | None


@dataclass
class QueuePage:
    items: list[WithAnnotations[RecoveryItem, QueueRowAnnotations]]
    next_cursor: str = ""
    # When the page was read: the auto-refresh counts items opened after it, whatever the sort.
    read_at: datetime | None = None


def _filtered_items(*, user: Someone, filters: QueueFilters, now: datetime) -> QuerySet[RecoveryItem]:
    """The queue's one filter (``recovery.selectors.queue_items``) over the user's tenants."""
    return recovery_selectors.queue_items(
        tenants=permissions.tenant_ids_for(user),
        status=filters.status,
        reason=filters.reason,
        risk=filters.risk,
        older_than=AGE_CHOICES.get(filters.age),
        tenant_slug=filters.tenant,
        signature=filters.signature,
        search=filters.q,
        now=now,
    )


def queue_page(
    *, user: Someone, filters: QueueFilters, cursor: str = "", page_size: int | None = None
) -> QueuePage:
    now = timezone.now()
    size = page_size or saga().page_size
    keys = _SORT_KEYS.get(filters.sort, _SORT_KEYS["newest"])
    qs = (
        _filtered_items(user=user, filters=filters, now=now)
        .select_related("run", "tenant", "failed_action", "assignee", "claimed_by")
        .annotate(
            risk_rank=_RISK_RANK,
            approval_pending=Exists(Approval.objects.filter(pending_q(now=now), run_id=OuterRef("run_id"))),
            # "Resume sent n min ago, not picked up": the run's oldest overdue resume command.
            resume_overdue_since=Subquery(
                AgentCommand.objects.filter(
                    run_id=OuterRef("run_id"),
                    kind=AgentCommand.Kind.RESUME,
                    status=AgentCommand.Status.PENDING,
                    created_at__lt=overdue_before(now),
                )
                .order_by("created_at")
                .values("created_at")[:1]
            ),
        )
    )
    page = keyset_page(qs, keys=keys, cursor=cursor, limit=size, strict=False)
    return QueuePage(items=page.items, next_cursor=page.next_cursor or "", read_at=now)


def queue_new_count(*, user: Someone, filters: QueueFilters, since: datetime) -> int:
    """Items matching the filters opened after ``since``, counted up to NEW_ITEMS_CAP + 1."""
    qs = _filtered_items(user=user, filters=filters, now=timezone.now()).filter(opened_at__gt=since)
    return len(qs.order_by().values_list("pk", flat=True)[: NEW_ITEMS_CAP + 1])


@dataclass(frozen=True)
class FailureGroup:
    signature: str
    count: int
    tool: str
    error: str
    oldest: datetime
    max_risk_rank: int


def queue_groups(*, user: Someone, filters: QueueFilters) -> list[FailureGroup]:
    """Similar unresolved failures (same tool + normalised error) with how many there are."""
    base = _filtered_items(
        user=user, filters=QueueFilters(**{**filters.__dict__, "signature": ""}), now=timezone.now()
    )
    # Aggregated on the items alone, from the columns of the covering index
    # ``recovery_unresolved_groups`` (an index-only scan): joining every unresolved item to the
    # ledger's actions for the tool's name cost more than the rest of the page. The tool and the
    # error are the same across a group up to normalisation (both make the signature), so the
    # newest item of each group shown speaks for it: one lookup by primary key.
    rows = list(
        base.exclude(signature="")
        .order_by()
        .values("signature")
        .annotate(
            count=Count("id"),
            sample_id=Max("id"),
            oldest=Min("opened_at"),
            max_risk_rank=Max(_RISK_RANK),
        )
        .filter(count__gt=1)
        .order_by("-count", "oldest")[:GROUPS_SHOWN]
    )
    samples = {
        pk: (tool or "", error)
        for pk, tool, error in RecoveryItem.objects.filter(pk__in=[row["sample_id"] for row in rows])
        .order_by()
        .values_list("pk", "failed_action__tool", "error")
    }
    return [
        FailureGroup(
            signature=row["signature"],
            count=row["count"],
            tool=samples.get(row["sample_id"], ("", ""))[0],
            error=samples.get(row["sample_id"], ("", ""))[1],
            oldest=row["oldest"],
            max_risk_rank=row["max_risk_rank"],
        )
        for row in rows
    ]


def visible_tenants(*, user: Someone) -> list[Tenant]:
    return list(Tenant.objects.filter(pk__in=permissions.tenant_ids_for(user)).order_by("slug"))


def items_for_user(*, user: Someone, ids: list[str]) -> list[RecoveryItem]:
    """The items among ``ids`` (a form's, so anything) that exist in the user's tenants."""
    return list(
        RecoveryItem.objects.filter(
            pk__in=[pk for pk in ids if looks_like_id(pk)], tenant_id__in=permissions.tenant_ids_for(user)
        ).select_related("run", "tenant", "failed_action")
    )


# --- Run page ---------------------------------------------------------------------------------


# A run page shows the newest checkpoints and audit events and says how many older ones there are:
# an agent that checkpoints in a loop must not make the operator's page unbounded.
RUN_PAGE_CHECKPOINTS = 20
RUN_PAGE_EVENTS = 200


@dataclass
class RunPage:
    run: Run
    actions: list[Action]
    warnings: list[dict[str, str]]
    checkpoints: list[Checkpoint]
    events: list[Event]
    item: RecoveryItem | None
    unwind: Unwind | None
    approvals: list[Approval] = field(default_factory=list)
    trail: Any = None
    older_checkpoints: int = 0  # not shown: older than the newest RUN_PAGE_CHECKPOINTS
    older_events: int = 0  # not shown: older than the newest RUN_PAGE_EVENTS


def newest_checkpoints(*, run: Run, limit: int = RUN_PAGE_CHECKPOINTS) -> tuple[list[Checkpoint], int]:
    """The newest ``limit`` checkpoints (newest first) and how many older ones are not in it."""
    checkpoints = list(checkpoints_for_run(run=run)[:limit])
    older = checkpoints_for_run(run=run).count() - limit if len(checkpoints) == limit else 0
    return checkpoints, older


def run_for_user(*, user: Someone, run_id: str) -> Run | None:
    return (
        Run.objects.select_related("tenant", "failed_action")
        .filter(pk=run_id, tenant_id__in=permissions.tenant_ids_for(user))
        .first()
    )


def unwind_with_steps(*, unwind_id: str, tenant_ids: list[int]) -> Unwind | None:
    return (
        Unwind.objects.select_related("run", "tenant", "requested_by")
        .prefetch_related(
            Prefetch(
                "steps", queryset=UnwindStep.objects.select_related("action", "approval").order_by("position")
            )
        )
        .filter(pk=unwind_id, tenant_id__in=tenant_ids)
        .first()
    )


def run_actions(*, run: Run) -> list[Action]:
    """The run's ledger, in the order it was written."""
    return list(Action.objects.filter(run=run).order_by("seq"))


def run_item(*, run: Run) -> RecoveryItem | None:
    """The run's item the page shows: the unresolved one, else the newest resolved one."""
    return (
        RecoveryItem.objects.filter(run=run)
        .select_related("assignee", "claimed_by", "resolved_by", "failed_action")
        .order_by(
            Case(When(status__in=RecoveryItem.UNRESOLVED, then=Value(0)), default=Value(1)), "-opened_at"
        )
        .first()
    )


def run_latest_unwind(*, run: Run) -> Unwind | None:
    latest = Unwind.objects.filter(run=run).order_by("-created_at").values_list("pk", flat=True).first()
    return unwind_with_steps(unwind_id=latest, tenant_ids=[run.tenant_id]) if latest else None


def run_pending_approvals(*, run: Run) -> list[Approval]:
    return list(
        Approval.objects.filter(pending_q(), run=run)
        .select_related("action")
        .prefetch_related("grants")
        .order_by("created_at")
    )


def run_events(*, run: Run) -> tuple[list[Event], int]:
    """The newest ``RUN_PAGE_EVENTS`` audit events, oldest first, and how many older ones."""
    events = list(Event.objects.filter(run=run).order_by("-id")[:RUN_PAGE_EVENTS])[::-1]
    older = Event.objects.filter(run=run).count() - RUN_PAGE_EVENTS if len(events) == RUN_PAGE_EVENTS else 0
    return events, older


def run_page(*, run: Run) -> RunPage:
    actions = run_actions(run=run)
    checkpoints, older_checkpoints = newest_checkpoints(run=run)
    events, older_events = run_events(run=run)
    return RunPage(
        run=run,
        actions=actions,
        warnings=run_warnings(run=run, actions=actions),
        checkpoints=checkpoints,
        events=events,
        item=run_item(run=run),
        unwind=run_latest_unwind(run=run),
        approvals=run_pending_approvals(run=run),
        trail=run_trail(run=run),
        older_checkpoints=older_checkpoints,
        older_events=older_events,
    )


# --- Approvals --------------------------------------------------------------------------------


APPROVALS_PAGE = 50
# What a card reads (``approval_card_content``), fetched with the approval in one query.
APPROVAL_CARD_RELATED = (
    "action",
    "run",
    "tenant",
    "step__unwind__requested_by",
    "step__unwind__requested_by_key",
    "requested_by",
    "requested_by_key",
    "decided_by",
)


@dataclass
class ApprovalPage:
    approvals: list[Approval]
    next_cursor: str = ""


def approvals_pending(*, user: Someone, cursor: str = "", page_size: int | None = None) -> ApprovalPage:
    """Pending approvals, oldest (closest to expiring) first, one keyset page at a time: each card
    carries two forms and pretty-printed JSON, so a page of hundreds took longer to render than
    an approver reads."""
    qs = (
        recovery_selectors.approvals_pending(tenants=permissions.tenant_ids_for(user))
        .select_related(*APPROVAL_CARD_RELATED)
        .prefetch_related("grants")
    )
    page = keyset_page(qs, keys=OLDEST_FIRST, cursor=cursor, limit=page_size or APPROVALS_PAGE, strict=False)
    return ApprovalPage(approvals=page.items, next_cursor=page.next_cursor or "")


def approvals_pending_count(*, user: Someone) -> int:
    qs = recovery_selectors.approvals_pending(tenants=permissions.tenant_ids_for(user))
    return len(qs.order_by().values_list("pk", flat=True)[: APPROVAL_BADGE_CAP + 1])


# --- Approval cards ---------------------------------------------------------------------------
#
# What an approval card says will happen, computed here once; the templates only render it. A
# forward action's card shows the action the agent asks to run. A compensation's card shows the
# compensating tool and the exact args that will run, the target's state as the forward action
# left it (its after-state: that is what the compensation starts from), a predicted change only
# where one can be computed (a snapshot restore), and who decided the compensation and why; the
# forward action's own reasoning is shown labelled as the forward action's.


@dataclass(frozen=True)
class CardFact:
    """One labelled line of a card; ``data`` (shown as JSON) when ``has_data``."""

    label: str
    text: str = ""
    data: Any = None
    has_data: bool = False

    @property
    def wide(self) -> bool:
        return len(self.text) > 40


@dataclass(frozen=True)
class CardPrediction:
    """What approving will change. ``diff``: a field-by-field table from ``diff_from`` (labelled
    ``from_label``) to ``diff_to``; otherwise only ``sentence``, which says plainly what is known,
    and ``given``, what the compensator is handed to decide with."""

    sentence: str
    diff: bool = False
    diff_from: Any = None
    diff_to: Any = None
    from_label: str = ""
    to_label: str = ""
    given: tuple[CardFact, ...] = ()


@dataclass(frozen=True)
class ApprovalCardContent:
    approval: Approval
    compensation: bool
    # Who asked for the approval: the agent (forward action), whoever decided the compensation.
    asked_by: str
    # One sentence: what approving runs (compensations; "" for a forward action).
    summary: str
    facts: tuple[CardFact, ...]
    args: Any
    args_heading: str
    # Where the args come from (a compensation: its template, or the agent's, or the snapshot).
    args_source: str
    args_note: str
    state: Any
    state_heading: str
    # Said instead of the state when none was recorded.
    state_missing: str
    prediction: CardPrediction | None
    # The agent's reasoning: this action's, or (compensation) the forward action's, so labelled.
    reasoning: str
    reasoning_label: str
    confidence: str


def _target(action: Action) -> str:
    if not action.target_id:
        return ""
    return f"{action.target_type}:{action.target_id}" if action.target_type else action.target_id


def _policy_line(policy: dict[str, Any] | None) -> str:
    if not policy:
        return ""
    return (
        f"{policy.get('pattern') or policy.get('tool')} ({policy.get('scope') or 'global'} policy) · "
        f"{policy.get('risk')} risk · {policy.get('approval')} approval"
    )


def grants_line(approval: Approval) -> str:
    """ "1 of 2 approvers (alice)" for an approval that needs several people; "" for one."""
    if approval.approvers_required <= 1:
        return ""
    grants = list(approval.grants.all())
    who = f" ({', '.join(g.label or g.approver for g in grants)})" if grants else ""
    return f"{len(grants)} of {approval.approvers_required} approvers{who}"


def _rule_words(rule: dict[str, Any]) -> str:
    """A rule that applied, and why when a value's kind decided it: the approver must know that
    the agent sent, say, the amount as text, and that the rule applied because of that."""
    words = f"Rule {rule.get('index')}: {rule.get('description')}"
    undecided = rule.get("undecided")
    if isinstance(undecided, list) and undecided:
        paths = ", ".join(str(path) for path in undecided)
        words += f" (applied because the value at {paths} is not of the kind the rule compares)"
    return words


def policy_decision_facts(policy: dict[str, Any] | None) -> list[CardFact]:
    """The rule and the limit that decided an action's risk and approval, in words."""
    facts = []
    policy = policy or {}
    rule = policy.get("rule")
    if isinstance(rule, dict):
        also = rule.get("also")
        words = "; ".join(
            _rule_words(r) for r in [rule, *(also if isinstance(also, list) else [])] if isinstance(r, dict)
        )
        facts.append(CardFact("Rule that applied", words))
    limit = policy.get("limit")
    if isinstance(limit, dict):
        facts.append(
            CardFact(
                "Limit reached",
                f"Limit {limit.get('index')}: {limit.get('description')} "
                + (
                    f"(already {limit.get('used')} in the window)."
                    if limit.get("used") is not None
                    else "(the window holds an amount that is not a number, so no room can be shown)."
                ),
            )
        )
    return facts


def _reasoning(intent: Any) -> str:
    return str(intent.get("reasoning") or "") if isinstance(intent, dict) else ""


def _shown_args(approval: Approval) -> tuple[Any, str]:
    """The args that run: the approved ones once an approver edited them, else those shown."""
    if (
        approval.status == Approval.Status.APPROVED
        and approval.approved_args_hash
        and approval.approved_args_hash != approval.args_hash
    ):
        return approval.approved_args, "Approved with edited arguments (the ones asked for were different)."
    return approval.args, ""


def approval_card_content(approval: Approval) -> ApprovalCardContent:
    """The card of ``approval``. Reads only what ``approvals_pending`` selects with it (for a
    compensation: its step, the step's unwind and who requested it), so the inbox stays one
    query per page."""
    if approval.kind == Approval.Kind.COMPENSATION and approval.step is not None:
        return _compensation_card(approval, approval.step)
    action = approval.action
    args, args_note = _shown_args(approval)
    facts = []
    if policy := _policy_line(action.policy):
        facts.append(CardFact("Policy", policy))
    facts.extend(policy_decision_facts(action.policy))
    if grants := grants_line(approval):
        facts.append(
            CardFact("Approvers", f"{grants}: it needs {approval.approvers_required} different people.")
        )
    if approval.requested_by_key is not None:
        asked_by = f"agent key {approval.requested_by_key.name}"
    else:
        asked_by = approval.requested_by.get_username() if approval.requested_by is not None else ""
    return ApprovalCardContent(
        approval=approval,
        compensation=False,
        asked_by=asked_by,
        summary="",
        facts=tuple(facts),
        args=args,
        args_heading="Arguments",
        args_source="",
        args_note=args_note,
        state=action.before_snapshot,
        state_heading="Before (current state as recorded)",
        state_missing="Not recorded: the agent sent no before-state with this action.",
        prediction=None,
        reasoning=_reasoning(action.intent),
        reasoning_label="Agent’s reasoning",
        confidence=confidence(action.intent),
    )


def _decider(unwind: Unwind) -> str:
    """Who or what decided the compensation this step belongs to."""
    if unwind.automatic:
        return "automatic compensation"
    if unwind.requested_by is not None:
        return unwind.requested_by.get_username()
    if unwind.requested_by_key is not None:
        return f"operator key {unwind.requested_by_key.name}"
    return ""


def _decided_by(unwind: Unwind) -> CardFact:
    """Who or what decided the compensation, and their reason: the rationale of the step."""
    who = _decider(unwind)
    if unwind.automatic:
        who = "Automatic compensation: no person decided it"
    elif unwind.requested_by is not None:
        who = f"{who} (operator)"
    reason = unwind.reason.strip()
    who = who or "not recorded"
    return CardFact("Compensation decided by", f"{who} — “{reason}”" if reason else who)


def _why_a_person(planned: dict[str, Any], action: Action) -> str:
    """The planner's rule (``planner._step_for``) in words: the compensating tool's policy asks
    for a person, or the action it undoes is high or critical risk."""
    reasons = []
    policy = planned.get("policy") or {}
    if policy.get("approval") and policy["approval"] != ApprovalMode.AUTO:
        reasons.append(f"the compensating tool’s policy asks for a person ({policy['approval']} approval)")
    if action.risk in APPROVAL_RISKS:
        reasons.append(
            f"it undoes a {action.risk}-risk action, and undoing a high or critical one always does"
        )
    return "; ".join(reasons)


def _args_source(action: Action, strategy: str, forward: str) -> str:
    """Where a compensation step's args came from (``planner.step_args``: filled at plan time)."""
    if strategy == CompensationStrategy.SNAPSHOT:
        return f"Built from the before-state recorded by {forward}."
    template = (action.policy or {}).get("compensation_args")
    if template is None:
        return f"As the agent gave them with {forward}’s compensation."
    if template == "$args":
        return (
            f"Filled when planned from {forward}’s own arguments (the approved ones, if an approver "
            "edited them)."
        )
    return f"Filled from the policy’s template {json.dumps(template, ensure_ascii=False, sort_keys=True)}."


def _compensation_card(approval: Approval, step: UnwindStep) -> ApprovalCardContent:
    action = approval.action
    unwind = step.unwind
    planned = planned_step(unwind, step)
    strategy = step.strategy or action.compensation_strategy
    args, args_note = _shown_args(approval)
    target = _target(action) or "its target"
    forward = f"#{action.seq} {action.tool}"
    served = str(planned.get("compensator") or "")

    if strategy == CompensationStrategy.SNAPSHOT:
        summary = f"Runs {approval.tool} to restore {target} to the state recorded before {forward}."
        args_heading = f"Arguments it will run with (the state to restore, recorded before {forward})"
    elif strategy == CompensationStrategy.CORRECTION:
        summary = (
            f"Runs {approval.tool} to correct {forward} on {target}. {forward} cannot be undone: a "
            "correcting action is issued and the original effect stays visible."
        )
        args_heading = "Arguments it will run with"
    else:
        summary = f"Runs {approval.tool} to undo {forward} on {target}."
        args_heading = "Arguments it will run with"
    if served:
        summary += f" Served by a {served} compensator."
    upstream = planned.get("upstream") or {}
    if upstream and not upstream.get("reaches"):
        # Why this step waits for a person even when its policy is automatic (recovery.planner).
        summary += f" Careful — {upstream.get('message', '')}."
    if args is None and not args_note:
        args_note = "None: the compensator works from the target and the recorded states."

    facts = [_decided_by(unwind)]
    selection = (unwind.plan or {}).get("selection") or {}
    steps = len((unwind.plan or {}).get("steps") or []) or None
    where = f"Step {step.position + 1}" + (f" of {steps}" if steps else "")
    if selection.get("mode") == "action_ids":
        where += " of a partial compensation (only the chosen actions are undone)"
    elif selection.get("mode") == "to_checkpoint":
        where += f" of a compensation back to checkpoint {selection.get('checkpoint_name') or ''}".rstrip()
    facts.append(CardFact("Place in the compensation", where + "."))
    if policy := _policy_line(planned.get("policy")):
        facts.append(CardFact("Policy that governs it", policy))
    if why := _why_a_person(planned, action):
        facts.append(CardFact("Why a person approves it", why[0].upper() + why[1:] + "."))
    if args_error := str(planned.get("args_error") or ""):
        facts.append(CardFact("Warning", f"{args_error[0].upper()}{args_error[1:]}: the step will fail."))
    if planned and not served:
        facts.append(
            CardFact("Warning", f"No compensator is registered for {approval.tool}: the step will fail.")
        )

    return ApprovalCardContent(
        approval=approval,
        compensation=True,
        asked_by=_decider(unwind),
        summary=summary,
        facts=tuple(facts),
        args=args,
        args_heading=args_heading,
        args_source=_args_source(action, strategy, forward),
        args_note=args_note,
        state=action.after_snapshot,
        state_heading=f"Current state (as recorded after {forward})",
        state_missing=f"Not recorded: {forward} reported no after-state, so the current state is not known here.",
        prediction=_prediction(approval, step, strategy, args=args, forward=forward, target=target),
        reasoning=_reasoning(action.intent),
        reasoning_label=f"The agent’s reasoning for {forward} (the action being undone, not this compensation)",
        confidence=confidence(action.intent),
    )


def _prediction(
    approval: Approval, step: UnwindStep, strategy: str, *, args: Any, forward: str, target: str
) -> CardPrediction:
    action = approval.action
    before, after = action.before_snapshot, action.after_snapshot
    if strategy == CompensationStrategy.SNAPSHOT:
        if after is None:
            return CardPrediction(
                f"No prediction: {forward} recorded no after-state to compare with. The restore sets "
                f"{target} to the arguments shown."
            )
        return CardPrediction(
            f"Field by field, from {target} as {forward} left it to the state the restore writes.",
            diff=True,
            diff_from=after,
            diff_to=args,
            from_label="Now",
            to_label="After the restore",
        )
    if strategy == CompensationStrategy.CORRECTION:
        known = (
            f"A correction restores nothing: {forward}’s effect stays, and {approval.tool} acts on top of it."
        )
    elif before is None:
        known = (
            f"{approval.tool} undoes what {forward} did to {target}. {forward} recorded no "
            f"before-state: what {target} was before it is not known here (nothing, if {forward} "
            "created it)."
        )
    else:
        known = (
            f"{approval.tool} is to bring {target} back from the state {forward} left to the one "
            "recorded before it."
        )
    none_recorded = "none recorded"
    given = (
        CardFact("Arguments", "the arguments shown" if args is not None else "none"),
        CardFact("Target", _target(action) or none_recorded),
        CardFact(
            f"After-state of {forward}", "the current state shown" if after is not None else none_recorded
        ),
        CardFact(
            f"Before-state of {forward}", none_recorded if before is None else "", before, before is not None
        ),
        CardFact("Idempotency key", f"{step.idempotency_key} (the same on every attempt)"),
    )
    return CardPrediction(
        f"{known} No prediction of the change: the compensator decides what it does. It is given:",
        given=given,
    )


# --- Metrics ----------------------------------------------------------------------------------


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(f) WITHIN GROUP (ORDER BY expr)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, *, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


class EpochSeconds(Func):
    template = "EXTRACT(EPOCH FROM %(expressions)s)"
    output_field = FloatField()


def _seconds_between(start: str, end: str) -> EpochSeconds:
    return EpochSeconds(ExpressionWrapper(F(end) - F(start), output_field=DurationField()))


METRIC_WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


@dataclass
class Metrics:
    window: str
    since: datetime
    open_by_risk: list[tuple[str, int]]
    open_by_reason: list[tuple[str, int]]
    mttr_s: float | None
    resolved: int
    unwinds_completed: int
    unwinds_failed: int
    unwind_p50_s: float | None
    unwind_p95_s: float | None
    approval_p50_s: float | None
    approval_p95_s: float | None
    approvals_decided: int
    top_failing_tools: list[tuple[str, int]]

    @property
    def compensation_success_rate(self) -> float | None:
        finished = self.unwinds_completed + self.unwinds_failed
        return self.unwinds_completed / finished if finished else None


def metrics(*, user: Someone, window: str, tenant: str = "") -> Metrics:
    span = METRIC_WINDOWS.get(window, METRIC_WINDOWS["7d"])
    window = window if window in METRIC_WINDOWS else "7d"
    since = timezone.now() - span
    tenant_ids = permissions.tenant_ids_for(user)
    if tenant:
        tenant_ids = list(Tenant.objects.filter(pk__in=tenant_ids, slug=tenant).values_list("pk", flat=True))

    # One pass over the unresolved items for both panels (it was one pass each).
    by_risk: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for risk, reason, n in (
        RecoveryItem.objects.filter(tenant_id__in=tenant_ids, status__in=RecoveryItem.UNRESOLVED)
        .order_by()
        .values_list("risk", "reason")
        .annotate(n=Count("id"))
    ):
        by_risk[risk] = by_risk.get(risk, 0) + n
        by_reason[reason] = by_reason.get(reason, 0) + n

    resolved = RecoveryItem.objects.filter(
        tenant_id__in=tenant_ids, status=RecoveryItem.Status.RESOLVED, resolved_at__gte=since
    ).aggregate(n=Count("id"), mttr=Avg(_seconds_between("opened_at", "resolved_at")))

    finished_unwinds = Unwind.objects.filter(
        tenant_id__in=tenant_ids,
        finished_at__gte=since,
        status__in=[Unwind.Status.COMPLETED, Unwind.Status.FAILED],
    )
    unwind_stats = finished_unwinds.aggregate(
        completed=Count("id", filter=Q(status=Unwind.Status.COMPLETED)),
        failed=Count("id", filter=Q(status=Unwind.Status.FAILED)),
        p50=PercentileCont(_seconds_between("created_at", "finished_at"), fraction=0.5),
        p95=PercentileCont(_seconds_between("created_at", "finished_at"), fraction=0.95),
    )
    approval_stats = Approval.objects.filter(
        tenant_id__in=tenant_ids,
        decided_at__gte=since,
        status__in=[Approval.Status.APPROVED, Approval.Status.REJECTED],
    ).aggregate(
        n=Count("id"),
        p50=PercentileCont(_seconds_between("created_at", "decided_at"), fraction=0.5),
        p95=PercentileCont(_seconds_between("created_at", "decided_at"), fraction=0.95),
    )
    failing = (
        Action.objects.filter(
            tenant_id__in=tenant_ids,
            updated_at__gte=since,
            status__in=[Action.Status.FAILED, Action.Status.UNKNOWN, Action.Status.COMPENSATION_FAILED],
        )
        .order_by()
        .values_list("tool")
        .annotate(n=Count("id"))
        .order_by("-n", "tool")[:10]
    )
    return Metrics(
        window=window,
        since=since,
        open_by_risk=[(risk.label, by_risk.get(risk.value, 0)) for risk in Risk],
        open_by_reason=[
            (reason.label, by_reason[reason.value])
            for reason in RecoveryItem.Reason
            if by_reason.get(reason.value)
        ],
        mttr_s=resolved["mttr"],
        resolved=resolved["n"],
        unwinds_completed=unwind_stats["completed"],
        unwinds_failed=unwind_stats["failed"],
        unwind_p50_s=unwind_stats["p50"],
        unwind_p95_s=unwind_stats["p95"],
        approval_p50_s=approval_stats["p50"],
        approval_p95_s=approval_stats["p95"],
        approvals_decided=approval_stats["n"],
        top_failing_tools=[(tool, n) for tool, n in failing],
    )


# --- Policies ---------------------------------------------------------------------------------


@dataclass
class PolicyRow:
    """A tool policy and its rules, limits and approvers in plain words."""

    policy: ToolPolicy
    rules: list[str]
    limits: list[str]
    approvers: int


def _policy_row(policy: ToolPolicy) -> PolicyRow:
    compiled = compile_rules(policy.rules, policy.limits)
    problems = [f"Cannot be applied, every call is refused: {p}" for p in compiled.problems]
    return PolicyRow(
        policy=policy,
        rules=problems or [f"{rule.index}. {rule.description}" for rule in compiled.rules],
        limits=[limit.description[0].upper() + limit.description[1:] for limit in compiled.limits],
        approvers=policy.approvers,
    )


@dataclass(frozen=True)
class CompensatorRow:
    """A registered compensator as the policies page shows it. ``target`` (the webhook or MCP URL,
    or the Python path) and ``reader`` are None for a reader who may not operate the tenant: a
    viewer sees that a compensator exists and of which kind, not where it points."""

    tool: str
    kind: str
    kind_display: str
    target: str | None
    mcp_tool: str | None
    reader: str | None
    scope: str
    source: str


def _compensator_row(compensator: Compensator, *, show_target: bool) -> CompensatorRow:
    target = compensator.url or compensator.python_path
    return CompensatorRow(
        tool=compensator.tool,
        kind=compensator.kind,
        kind_display=compensator.get_kind_display(),
        target=target if show_target else None,
        mcp_tool=compensator.mcp_tool if show_target else None,
        reader=compensator.reader_path if show_target else None,
        scope="tenant" if compensator.tenant_id else "global",
        source=compensator.source,
    )


@dataclass
class TenantPolicies:
    tenant: Tenant
    policies: list[PolicyRow]
    compensators: list[CompensatorRow]
    show_targets: bool
    settings_source: str
    default_policy: dict[str, Any]
    unwind: dict[str, Any]
    auto_compensate: dict[str, Any]
    # Tool/compensator pairs whose compensator does not reach the upstream the tool was recorded
    # on (``ledger.upstreams.policy_upstream_mismatches``).
    upstream_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # Compensating tools that delete or move money and run unattended (the residual risk).
    compensation_warnings: list[CompensationWarning] = field(default_factory=list)


def policies_for(*, tenant: Tenant, show_targets: bool) -> TenantPolicies:
    """The policies page's section for ``tenant``; ``show_targets``: whether the reader may see
    where compensators point (operators and admins of the tenant)."""
    own = list(Compensator.objects.filter(tenant=tenant).order_by("tool"))
    overridden = {c.tool for c in own}
    shared = [
        c
        for c in Compensator.objects.filter(tenant__isnull=True).order_by("tool")
        if c.tool not in overridden
    ]
    policy_settings = policy_settings_for(tenant)
    return TenantPolicies(
        tenant=tenant,
        policies=[_policy_row(policy) for policy in policies_in_force(tenant=tenant)],
        compensators=[
            _compensator_row(c, show_target=show_targets) for c in sorted(own + shared, key=lambda c: c.tool)
        ],
        show_targets=show_targets,
        settings_source=policy_settings.source,
        default_policy=policy_settings.default_policy,
        unwind=policy_settings.unwind,
        auto_compensate=policy_settings.auto_compensate,
        upstream_mismatches=policy_upstream_mismatches(tenant=tenant),
        compensation_warnings=unattended_destructive_compensations(tenant=tenant),
    )
