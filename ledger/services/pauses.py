"""Pauses: an operator's kill switch for an agent, a tool, or a tool of one agent.

While a pause is active (not lifted), new runs of a matching agent and new actions it covers are
refused with 409 ``paused``, naming the pause and its reason. ``agent`` and ``tool`` are exact
names or globs (``fnmatch``, case-sensitive, as tool policies are). An agent pattern matches the
agent that owns a run (the name of the key that created it, ``Run.owner``) *or* the agent the run
declares (``Run.agent``): a looping agent is stopped whichever name it gives itself.

- a pause by agent only: no new runs of that agent, and no new actions in its runs;
- a pause by tool only: no new actions of that tool, in any run;
- a pause by both: no new actions of that tool in that agent's runs (its runs still start).

What was recorded before the pause stands (an idempotent replay of it is still answered), but it
does not start while the pause covers it; what the agent reports on actions already running goes
through: the switch stops calls that have not happened, it does not tear down work in flight
(cancel the run for that).

The hot path: recording an action reads the tenant's active pauses in the statement that locks
the run (``run_lock(..., policy_stamp=True).active_pauses``, through the partial index
``pause_active``), so a tenant without pauses pays no extra round trip; starting a run makes one
indexed query. Nothing is cached, so a pause applies to the very next request in every process.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import structlog
from django.db import DatabaseError, transaction
from django.db.models import JSONField, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from infra import errors
from infra.pagination import NEWEST_FIRST, Page, keyset_page
from ledger.audit import Actor, audit_record
from ledger.models import Action, Event, Pause, Run, Tenant
from ledger.rules import reason_required
from ledger.scoping import Reach
from ledger.tool_names import check_tool_name

log = structlog.get_logger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

NAME_MAX_LENGTH = 200
STATUSES = ("active", "lifted", "all")

# The audit event of a new action refused on its run (by a pause, a policy rule, a compensation the
# policy does not allow): written by the recording that refused it, read by the run's pause banner.
ACTION_REFUSED = "action.refused"

# (id, agent pattern, tool pattern) of an active pause: what the hot path reads and matches.
ActivePause = Sequence[str]


# --- Matching (the one rule; the hot path, the banner and the preview all use it) --------------


def _matches(pattern: str, names: Iterable[str]) -> bool:
    return any(name and (name == pattern or fnmatch.fnmatchcase(name, pattern)) for name in names)


def run_names(run: Run) -> tuple[str, ...]:
    """The names an agent pattern is matched against: the run's owner and its declared agent."""
    return tuple(name for name in (run.owner, run.agent) if name)


def covers_run_start(*, agent: str, tool: str, names: Iterable[str]) -> bool:
    """A pause with this ``agent``/``tool`` refuses a new run of an agent called ``names``."""
    return bool(agent) and not tool and _matches(agent, names)


def covers_action(*, agent: str, tool: str, names: Iterable[str], action_tool: str) -> bool:
    """A pause with this ``agent``/``tool`` refuses a new ``action_tool`` action in a run of an
    agent called ``names``."""
    if not agent and not tool:
        return False  # impossible in the table (a check constraint); never a blanket refusal
    if agent and not _matches(agent, names):
        return False
    return not tool or _matches(tool, [action_tool])


def covers_run(*, agent: str, tool: str, names: Iterable[str], tools: Iterable[str]) -> bool:
    """A pause with this ``agent``/``tool`` affects a run (its agent, or any tool it has used): what
    the dashboard's banner says."""
    names, tools = list(names), list(tools)
    if agent and not _matches(agent, names):
        return False
    return not tool or any(_matches(tool, [t]) for t in tools)


def describe(pause: Pause) -> str:
    """What a pause stops, in words: "agent X", "tool Y", "tool Y of agent X"."""
    if pause.agent and pause.tool:
        return f"tool {pause.tool} of agent {pause.agent}"
    return f"agent {pause.agent}" if pause.agent else f"tool {pause.tool}"


# --- The hot path ---------------------------------------------------------------------------


def active_pauses_subquery() -> RawSQL:
    """The active pauses of the run's tenant as ``[[id, agent, tool], …]``, to fold into the
    statement that locks the run (``ledger.services.runs.run_lock``): an index probe on
    ``pause_active``, no round trip of its own. Plain SQL, like ``policy_stamp_subquery``."""
    # ledger_pause / ledger_run: the tables of ledger.models.Pause and Run; constants, no input.
    return RawSQL(  # noqa: S611
        "SELECT coalesce(jsonb_agg(jsonb_build_array(p.id, p.agent, p.tool) ORDER BY p.id), '[]'::jsonb)"
        " FROM ledger_pause p WHERE p.tenant_id = ledger_run.tenant_id AND p.lifted_at IS NULL",
        (),
        output_field=JSONField(),
    )


def _refusal(pause_id: str, *, what: str, outcome: str) -> errors.Paused:
    """The 409 for a refusal by ``pause_id``: "<what> is paused (<pause> by <who>: <reason>);
    <outcome>." The pause is read only here, off the hot path."""
    pause = Pause.objects.select_related("created_by", "created_by_key").filter(pk=pause_id).first()
    if pause is None:  # deleted since the check read it: still refused, by what was read
        return errors.Paused(
            f"{what} is paused ({pause_id}); {outcome}.",
            details={"pause_id": pause_id, "agent": "", "tool": ""},
        )
    who = created_by_label(pause)
    by = f" by {who}" if who else ""
    return errors.Paused(
        f"{what} is paused ({pause_id}{by}: {pause.reason}); {outcome}. "
        "Retry after an operator lifts the pause.",
        details={"pause_id": pause_id, "agent": pause.agent, "tool": pause.tool},
    )


def pause_check_run(*, tenant: Tenant, agent: str, owner: str) -> None:
    """Refuse (``Paused``) a new run of an agent an active pause covers: one query on the partial
    index ``pause_active``."""
    names = [name for name in (owner, agent) if name]
    rows = (
        Pause.objects.filter(tenant=tenant, lifted_at__isnull=True, tool="")
        .order_by("id")
        .values_list("id", "agent")
    )
    for pause_id, pattern in rows:
        if covers_run_start(agent=pattern, tool="", names=names):
            raise _refusal(pause_id, what=f"Agent {agent}", outcome="no run was started")


def pause_check_action(
    *,
    run: Run,
    tool: str,
    active: Sequence[ActivePause] | None = None,
    outcome: str = "the action was not recorded",
) -> None:
    """Refuse (``Paused``) a new ``tool`` action in ``run`` that an active pause covers — recorded
    now, or recorded earlier and about to start (a kill switch stops a call that has not happened
    yet, whenever it was planned). ``active``: the tenant's active pauses as the run's lock read
    them (``active_pauses_subquery``); without them they are read here (one query on
    ``pause_active``)."""
    if active is None:
        active = list(
            Pause.objects.filter(tenant_id=run.tenant_id, lifted_at__isnull=True)
            .order_by("id")
            .values_list("id", "agent", "tool")
        )
    if not active:
        return
    names = run_names(run)
    for pause_id, agent, pattern in active:
        if covers_action(agent=agent, tool=pattern, names=names, action_tool=tool):
            what = f"{tool}" if pattern else f"Agent {run.agent}"
            raise _refusal(pause_id, what=what, outcome=outcome)


def run_refusal_record(
    *,
    exc: errors.Paused | errors.UrlNotAllowed,
    tenant: Tenant,
    actor: Actor,
    agent: str,
    external_id: str = "",
) -> None:
    """Audit a refused run start on the tenant's chain, in a transaction of its own (the refused
    create rolled back). Inside a caller's transaction (the API's Idempotency-Key claim) it is a
    savepoint that the caller keeps: only the claim is released on a refusal. A refused
    ``resume_url`` is recorded with the reason its agent is not told (``UrlNotAllowed.reason``)."""
    if isinstance(exc, errors.UrlNotAllowed):
        subject, reason, details = "url:resume_url", exc.operator_message or exc.message, exc.audit_data()
    else:
        subject, reason, details = f"pause:{exc.details.get('pause_id', '')}", exc.message, exc.details
    log.info("run.refused", code=exc.code, subject=subject, agent=agent)
    try:
        with transaction.atomic():
            audit_record(
                tenant=tenant,
                actor=actor,
                kind="run.refused",
                subject=subject,
                reason=reason,
                data={
                    "code": exc.code,
                    "agent": agent,
                    "owner": actor.key.name if actor.key is not None else "",
                    "external_id": external_id,
                    "details": details,
                },
            )
    except DatabaseError:
        # The refusal itself must still reach the agent; the log line above keeps the trace.
        log.warning("run.refusal_not_audited", agent=agent, exc_info=True)


def audits_run_refusals(create: Callable[P, R]) -> Callable[P, R]:
    """Around the run-create service: a start refused by a pause, or for its ``resume_url``, is
    audited (``run_refusal_record``) after the create's own transaction has rolled back."""

    @functools.wraps(create)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return create(*args, **kwargs)
        except (errors.Paused, errors.UrlNotAllowed) as exc:
            tenant, actor = kwargs["tenant"], kwargs["actor"]
            assert isinstance(tenant, Tenant) and isinstance(actor, Actor)
            run_refusal_record(
                exc=exc,
                tenant=tenant,
                actor=actor,
                agent=str(kwargs.get("agent", "")),
                external_id=str(kwargs.get("external_id", "")),
            )
            raise

    return wrapper


# --- Pausing and lifting ----------------------------------------------------------------------


def _pattern(value: str, *, field: str) -> str:
    cleaned = value.strip()
    if len(cleaned) > NAME_MAX_LENGTH:
        raise errors.ValidationFailed(
            f"The {field} is at most {NAME_MAX_LENGTH} characters.",
            details={field: "too_long", "max_length": NAME_MAX_LENGTH},
        )
    return cleaned


def pause_patterns(*, agent: str, tool: str) -> tuple[str, str]:
    """The (agent, tool) patterns a pause would keep, stripped; ``ValidationFailed`` when neither
    is given or one is too long. The service's rule, which the dashboard's form applies too."""
    agent, tool = _pattern(agent, field="agent"), _pattern(tool, field="tool")
    if tool:
        # The one tool-name rule (ledger.tool_names), globs allowed: a pattern no tool name can
        # match would be a kill switch that silently stops nothing.
        check_tool_name(tool, field="tool", glob=True)
    if not agent and not tool:
        raise errors.ValidationFailed(
            "A pause names an agent, a tool or both (exact names or globs such as payments.*).",
            details={"agent": "required_without_tool", "tool": "required_without_agent"},
        )
    return agent, tool


@transaction.atomic
def pause_create(*, tenant: Tenant, actor: Actor, agent: str = "", tool: str = "", reason: str) -> Pause:
    """A new active pause of ``agent`` and/or ``tool`` (exact names or globs), audited on the
    tenant's chain with who and why. Neither → ``ValidationFailed``."""
    agent, tool = pause_patterns(agent=agent, tool=tool)
    reason = reason_required(reason)
    pause = Pause.objects.create(
        tenant=tenant,
        agent=agent,
        tool=tool,
        reason=reason,
        created_by=actor.user,
        created_by_key=actor.key,
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="pause.created",
        subject=pause,
        to_state="active",
        reason=reason,
        data={"agent": agent, "tool": tool},
    )
    return pause


@transaction.atomic
def pause_lift(*, pause: Pause, actor: Actor, reason: str) -> Pause:
    """active → lifted, audited. A pause already lifted → ``InvalidTransition`` (409): a second
    click, tab or operator loses cleanly."""
    reason = reason_required(reason)
    now = timezone.now()
    lifted = Pause.objects.filter(pk=pause.pk, lifted_at__isnull=True).update(
        lifted_at=now, lifted_by=actor.user, lifted_by_key=actor.key, lift_reason=reason
    )
    if lifted != 1:
        raise errors.InvalidTransition(
            pause,
            to="lifted",
            current="lifted",
            message=f"Pause {pause.pk} was already lifted; new work it covered is accepted again.",
        )
    pause.lifted_at, pause.lifted_by, pause.lifted_by_key, pause.lift_reason = (
        now,
        actor.user,
        actor.key,
        reason,
    )
    audit_record(
        tenant=pause.tenant,
        actor=actor,
        kind="pause.lifted",
        subject=pause,
        from_state="active",
        to_state="lifted",
        reason=reason,
        data={"agent": pause.agent, "tool": pause.tool},
    )
    return pause


# --- Reads (the API and the dashboard) --------------------------------------------------------


def created_by_label(pause: Pause) -> str:
    """Who paused: a dashboard user's name or an operator key's name ("" once deleted)."""
    if pause.created_by is not None:
        return pause.created_by.get_username()
    return pause.created_by_key.name if pause.created_by_key is not None else ""


def lifted_by_label(pause: Pause) -> str:
    if pause.lifted_by is not None:
        return pause.lifted_by.get_username()
    return pause.lifted_by_key.name if pause.lifted_by_key is not None else ""


def _pauses() -> QuerySet[Pause]:
    return Pause.objects.select_related(
        "tenant", "created_by", "created_by_key", "lifted_by", "lifted_by_key"
    )


def pauses_list(
    *,
    tenant_ids: Sequence[int],
    status: str | None = "active",
    cursor: str | None = None,
    limit: int = 50,
    strict: bool = True,
) -> Page[Pause]:
    """A page of pauses, newest first: ``active`` (default), ``lifted`` or ``all``."""
    status = status or "active"
    if status not in STATUSES:
        raise errors.ValidationFailed(
            f"status must be one of {', '.join(STATUSES)}.", details={"status": status[:40]}
        )
    queryset = _pauses().filter(tenant_id__in=tenant_ids)
    if status == "active":
        queryset = queryset.filter(lifted_at__isnull=True)
    elif status == "lifted":
        queryset = queryset.filter(lifted_at__isnull=False)
    return keyset_page(queryset, keys=NEWEST_FIRST, cursor=cursor, limit=limit, strict=strict)


def pause_get(*, reach: Reach, pause_id: str) -> Pause:
    """The pause, if it is within ``reach`` (``ledger.scoping``); otherwise the same 404 as an
    unknown id."""
    pause = reach.first(_pauses(), pause_id[:40])
    if pause is None:
        raise errors.NotFound.for_id("Pause", pause_id)
    return pause


@dataclass(frozen=True)
class PauseOnRun:
    """An active pause that covers a run, and the tools of this run it has already refused."""

    pause: Pause
    refused_tools: tuple[str, ...] = ()


def pauses_on_run(*, run: Run) -> list[PauseOnRun]:
    """The active pauses that cover the run (the run page's banner): those that refused one of its
    actions (its ``action.refused`` events with code ``paused``: the run a pause actually stopped,
    though nothing of the refused tool was recorded), and those that cover its agent or a tool it
    has used. One query when its tenant has no active pause, three when it has."""
    active = list(
        _pauses().filter(tenant_id__in=[run.tenant_id], lifted_at__isnull=True).order_by("created_at", "id")
    )
    if not active:
        return []
    tools = set(Action.objects.filter(run=run).values_list("tool", flat=True).distinct())
    refused: dict[str, list[str]] = {}
    for pause_id, tool in (
        Event.objects.filter(run=run, kind=ACTION_REFUSED, data__code=errors.Paused.code)
        .order_by("id")
        .values_list("data__details__pause_id", "data__tool")
    ):
        if isinstance(pause_id, str) and isinstance(tool, str) and tool not in refused.get(pause_id, []):
            refused.setdefault(pause_id, []).append(tool)
    names = run_names(run)
    return [
        PauseOnRun(pause=p, refused_tools=tuple(refused.get(p.pk, ())))
        for p in active
        if p.pk in refused or covers_run(agent=p.agent, tool=p.tool, names=names, tools=tools)
    ]


def pauses_covering_run(*, run: Run) -> list[Pause]:
    """The active pauses that cover the run (``pauses_on_run`` without the refused tools)."""
    return [covering.pause for covering in pauses_on_run(run=run)]


def running_runs_covered(*, tenant: Tenant, agent: str, tool: str, limit: int = 200) -> int:
    """How many of the tenant's running runs a new pause of ``agent``/``tool`` would affect (their
    agent matches, and, with a tool, they have used a matching tool): the confirmation's count.
    Bounded: it reads at most ``limit`` running runs, newest first."""
    agent, tool = agent.strip(), tool.strip()
    if not agent and not tool:
        return 0
    runs = list(
        Run.objects.filter(tenant=tenant, status=Run.Status.RUNNING)
        .order_by("-created_at")
        .values_list("id", "agent", "owner")[:limit]
    )
    tools_by_run: dict[str, set[str]] = {}
    if tool:
        for run_id, used in (
            Action.objects.filter(run_id__in=[r[0] for r in runs]).values_list("run_id", "tool").distinct()
        ):
            tools_by_run.setdefault(run_id, set()).add(used)
    return sum(
        1
        for run_id, run_agent, owner in runs
        if covers_run(
            agent=agent,
            tool=tool,
            names=[n for n in (owner, run_agent) if n],
            tools=tools_by_run.get(run_id, ()),
        )
    )
