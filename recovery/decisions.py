"""Which decisions are possible on a run right now, and why not, in words a person reads.

One rule, read by two callers: the dashboard offers only the decisions this allows (and says why
the others are not offered), and the services that carry them out refuse the rest with the
same state sets and transition tables (``ledger.transitions``, ``recovery.models``). A refusal
that still happens (a race, a stale tab) reaches a person through ``refusal_sentence``, which
words an ``InvalidTransition`` from the same table of sentences; the API keeps the machine
message and code.

Nothing here writes: the compare-and-set in each service stays what decides a race.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import models

from infra import errors
from ledger.models import Action, Run
from ledger.services.runs import CANCELLABLE
from ledger.transitions import RUN_TRANSITIONS, run_state_phrase
from recovery.models import ITEM_TRANSITIONS, Approval, RecoveryItem, Unwind, UnwindStep
from recovery.unwinds.state import PROBLEMS, STOPPABLE

# Resume and close resolve an item that waits for a decision; an item an unwind has claimed is
# that unwind's to resolve (recovery.actions.resolutions.item_resume / item_close use this as allowed_from).
DECIDABLE_ITEM = (RecoveryItem.Status.OPEN,)
# A run being compensated is not flagged: its unwind decides what happens next (run_flag).
NOT_FLAGGABLE = (Run.Status.COMPENSATING,)

UNDER_WAY = "A compensation is already under way for this run"
UNDER_WAY_NEXT = "Stop it, or wait for it to finish, before deciding again."
ALREADY_DECIDED = "This run's recovery item has already been decided"
STILL_RUNNING = "The run is still running: cancel it first, so its agent stops, then compensate."


def _sources(table: dict[str, set[str]], to: str) -> set[str]:
    return {state for state, targets in table.items() if to in targets}


def _label(choices: type[models.TextChoices], value: str) -> str:
    return str(dict(choices.choices).get(value, value)).lower()


@dataclass(frozen=True)
class Decision:
    allowed: bool
    why: str = ""  # why not, as a sentence (empty when allowed)

    def __bool__(self) -> bool:
        return self.allowed


ALLOWED = Decision(True)


@dataclass(frozen=True)
class RunDecisions:
    compensate: Decision
    resume: Decision
    close: Decision
    cancel: Decision
    flag: Decision
    stop_unwind: Decision
    # The item's decisions that are not offered, with why: what the run page says instead, one
    # (names, sentence) per reason.
    refused: list[tuple[str, str]] = field(default_factory=list)

    @property
    def any_item_decision(self) -> bool:
        return bool(self.compensate or self.resume or self.close)


@dataclass(frozen=True)
class StepDecisions:
    retry: Decision
    skip: Decision
    ask_again: Decision


def _under_way(unwind: Unwind | None) -> str:
    """The claimed item's sentence, with where the compensation is when it is known."""
    where = ""
    if unwind is not None and unwind.status in STOPPABLE:
        waiting = [s for s in unwind.steps.all() if s.status == UnwindStep.Status.AWAITING_APPROVAL]
        if waiting:
            where = f" (step {waiting[0].position + 1} waits for an approval)"
        elif unwind.status == Unwind.Status.PAUSED:
            where = " (it waits for a person)"
    return f"{UNDER_WAY}{where}. {UNDER_WAY_NEXT}"


def _item_refusal(item: RecoveryItem | None, unwind: Unwind | None, *, doing: str) -> str:
    if item is None:
        return f"The run is not in the recovery queue: flag it for review to {doing} it."
    if item.status == RecoveryItem.Status.CLAIMED:
        return _under_way(unwind)
    if item.status == RecoveryItem.Status.RESOLVED:
        how = f" ({item.get_resolution_display().lower()})" if item.resolution else ""
        return f"{ALREADY_DECIDED}{how}: flag the run for review to decide again."
    return ""


def _outcomes_refusal(run: Run, *, doing: str, running_too: bool) -> str:
    statuses = [Action.Status.UNKNOWN, *([Action.Status.RUNNING] if running_too else [])]
    pending = list(
        Action.objects.filter(run_id=run.pk, status__in=statuses)
        .order_by("seq")
        .values_list("status", "tool", "seq")
    )
    unknown = [f"{tool} (#{seq})" for status, tool, seq in pending if status == Action.Status.UNKNOWN]
    if unknown:
        return (
            f"Reconcile first: {', '.join(unknown)} timed out with an unknown outcome; confirm in the "
            f"ledger whether {'it' if len(unknown) == 1 else 'each'} happened before you {doing}."
        )
    running = [f"{tool} (#{seq})" for status, tool, seq in pending if status == Action.Status.RUNNING]
    if running:
        return (
            f"{', '.join(running)} {'is' if len(running) == 1 else 'are'} still running, so whether "
            f"{'it' if len(running) == 1 else 'they'} happened is not known yet: wait for the agent "
            "to report it, or cancel the run."
        )
    return ""


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def decisions_for(*, run: Run, item: RecoveryItem | None, unwind: Unwind | None = None) -> RunDecisions:
    """What an operator may decide about ``run`` now (``item``: its newest recovery item,
    ``unwind``: its newest unwind, steps prefetched when given), each with why not. The same
    rules as the services: an item must be open (``DECIDABLE_ITEM``, the claim's table), the run's
    status must be a source of the transition (``RUN_TRANSITIONS``), unknown outcomes block both
    compensating and resuming, only a running or failed run is cancelled (``CANCELLABLE``), only
    a running or paused unwind is stopped (``STOPPABLE``)."""
    compensate, resume, close = _item_decisions(run, item, unwind)
    cancel = cancel_decision(run=run)
    flag = flag_decision(run=run, in_queue=item is not None and item.status in RecoveryItem.UNRESOLVED)
    stop = _stop_decision(unwind)
    # One sentence per reason, naming the decisions it holds back ("Resume, Compensate and Close").
    by_why: dict[str, list[str]] = {}
    for name, decision in (("Resume", resume), ("Compensate", compensate), ("Close", close)):
        if not decision:
            by_why.setdefault(decision.why, []).append(name)
    refused = [(_names(names), why) for why, names in by_why.items()]
    return RunDecisions(
        compensate=compensate,
        resume=resume,
        close=close,
        cancel=cancel,
        flag=flag,
        stop_unwind=stop,
        refused=refused,
    )


def _item_decisions(
    run: Run, item: RecoveryItem | None, unwind: Unwind | None
) -> tuple[Decision, Decision, Decision]:
    """Compensate, resume and close: the item's decisions (``decisions_for``)."""
    open_item = item is not None and item.status in DECIDABLE_ITEM
    compensate = resume = close = ALLOWED
    if not open_item:
        compensate = Decision(False, _item_refusal(item, unwind, doing="compensate"))
        resume = Decision(False, _item_refusal(item, unwind, doing="resume"))
        close = Decision(False, _item_refusal(item, unwind, doing="close"))
    else:
        assert item is not None
        claimable = item.status in _sources(ITEM_TRANSITIONS, RecoveryItem.Status.CLAIMED)
        if not claimable:
            compensate = Decision(False, transition_sentence("RecoveryItem", item.status, "claimed"))
        elif run.status == Run.Status.RUNNING:
            compensate = Decision(False, STILL_RUNNING)
        elif run.status not in _sources(RUN_TRANSITIONS, Run.Status.COMPENSATING):
            compensate = Decision(False, transition_sentence("Run", run.status, Run.Status.COMPENSATING))
        elif why := _outcomes_refusal(run, doing="compensate", running_too=True):
            compensate = Decision(False, why)
        if run.status not in _sources(RUN_TRANSITIONS, Run.Status.RUNNING):
            resume = Decision(False, transition_sentence("Run", run.status, Run.Status.RUNNING))
        elif why := _outcomes_refusal(run, doing="resume", running_too=False):
            resume = Decision(False, why)
    return compensate, resume, close


def cancel_decision(*, run: Run) -> Decision:
    """Whether the run may be cancelled now (the run page's and the Runs page's one rule)."""
    if run.status in CANCELLABLE:
        return ALLOWED
    return Decision(False, transition_sentence("Run", run.status, Run.Status.CANCELLED))


def flag_decision(*, run: Run, in_queue: bool) -> Decision:
    """Whether the run may be flagged for review now; ``in_queue``: it has an unresolved item."""
    if run.status in NOT_FLAGGABLE:
        flag = Decision(False, f"{UNDER_WAY}; flag the run once it has finished.")
    elif in_queue:
        flag = Decision(False, "The run is already in the recovery queue.")
    else:
        flag = ALLOWED
    return flag


def _stop_decision(unwind: Unwind | None) -> Decision:
    if unwind is not None and unwind.status in STOPPABLE:
        stop = ALLOWED
    else:
        stop = Decision(
            False,
            transition_sentence("Unwind", unwind.status, Unwind.Status.CANCELLED)
            if unwind is not None
            else "No compensation has been started for this run.",
        )
    return stop


def step_decisions(*, step: UnwindStep, unwind: Unwind) -> StepDecisions:
    """Retry, skip or ask again for a step's approval: the rules of ``recovery.unwinds.moves.step_retry``,
    ``step_skip`` and ``step_approval_ask_again``."""
    approval: Approval | None = getattr(step, "approval", None)
    not_granted = approval is not None and approval.status in (
        Approval.Status.REJECTED,
        Approval.Status.EXPIRED,
    )
    if unwind.status in (Unwind.Status.CANCELLED, Unwind.Status.COMPLETED):
        why = transition_sentence("Unwind", unwind.status, Unwind.Status.RUNNING)
        skip = retry = Decision(False, why)
    elif step.status not in PROBLEMS:
        why = transition_sentence("UnwindStep", step.status, UnwindStep.Status.PENDING)
        skip = retry = Decision(False, why)
    else:
        skip = ALLOWED
        retry = (
            Decision(
                False,
                f"Its approval {approval.status}: retrying would run it unapproved. Ask for the "
                "approval again instead.",
            )
            if not_granted and approval is not None
            else ALLOWED
        )
    if not (not_granted and step.status == UnwindStep.Status.FAILED):
        ask = Decision(False, "Only a step that failed for want of an approval can ask for it again.")
    elif unwind.status != Unwind.Status.FAILED:
        ask = Decision(
            False,
            transition_sentence("Unwind", unwind.status, Unwind.Status.RUNNING)
            if unwind.status == Unwind.Status.CANCELLED
            else "It can be asked again once the compensation has finished its other steps.",
        )
    else:
        ask = ALLOWED
    return StepDecisions(retry=retry, skip=skip, ask_again=ask)


# --- Refusals, in words ----------------------------------------------------------------------


def transition_sentence(subject_type: str, current: str, to: str) -> str:
    """Why ``subject_type`` (a model's name) cannot go from ``current`` to ``to``: the one place
    that words a state-machine refusal for a person."""
    if subject_type == "RecoveryItem":
        return _item_sentence(current)
    if subject_type == "Run":
        return _run_sentence(current, to)
    if subject_type == "Unwind":
        return _unwind_sentence(current, to)
    if subject_type == "UnwindStep":
        return _step_sentence(current, to)
    if subject_type == "Approval":
        return _approval_sentence(current)
    if subject_type == "Action":
        return (
            f"The action is {_label(Action.Status, current)} now, so this is no longer possible; "
            "reload the page to see its state."
        )
    return "This is no longer possible in the state it is in now; reload the page to see it."


def _item_sentence(current: str) -> str:
    if current == RecoveryItem.Status.CLAIMED:
        return f"{UNDER_WAY}. {UNDER_WAY_NEXT}"
    if current == RecoveryItem.Status.RESOLVED:
        return f"{ALREADY_DECIDED} (someone decided it meanwhile); reload the page to see how."
    return "This recovery item is back in the queue, waiting for a decision."


def _run_sentence(current: str, to: str) -> str:
    state = run_state_phrase(current)
    if to == Run.Status.COMPENSATING:
        if current == Run.Status.RUNNING:
            return STILL_RUNNING
        if current == Run.Status.COMPENSATING:
            return f"{UNDER_WAY}."
        return f"The run {state}; it cannot be compensated."
    if to == Run.Status.RUNNING:
        if current == Run.Status.CANCELLED:
            return "The run was cancelled and its agent told to stop: it cannot be resumed. Compensate or close it."
        if current == Run.Status.COMPENSATING:
            return f"{UNDER_WAY}: it cannot be resumed meanwhile."
        if current == Run.Status.RUNNING:
            return "The run is still running: there is nothing to resume."
        return f"The run {state}; it cannot be resumed."
    if to == Run.Status.CANCELLED:
        return f"Only a running or failed run can be cancelled; this one {state}."
    if to == Run.Status.CLOSED:
        return f"The run {state}; it cannot be closed."
    return f"The run {state} meanwhile, so this is no longer possible."


def _unwind_sentence(current: str, to: str) -> str:
    if current == Unwind.Status.CANCELLED:
        return "This compensation was stopped; start a new compensation to undo what is left."
    if current == Unwind.Status.COMPLETED:
        return "This compensation has finished; there is nothing left in it to stop or run."
    if to == Unwind.Status.CANCELLED:
        return "This compensation has already finished; there is nothing to stop."
    return f"This compensation is {_label(Unwind.Status, current)} now, so this is no longer possible."


def _step_sentence(current: str, to: str) -> str:
    state = _label(UnwindStep.Status, current)
    if to == UnwindStep.Status.AWAITING_APPROVAL:
        return f"This step is {state}; only a step that failed for want of an approval can ask for it again."
    return (
        f"This step is {state}: only a failed or drifted step can be retried or skipped "
        "(someone may have decided it meanwhile)."
    )


def _approval_sentence(current: str) -> str:
    if current == Approval.Status.EXPIRED:
        return "This approval has expired; it can be asked for again."
    if current in (Approval.Status.APPROVED, Approval.Status.REJECTED):
        return f"This approval was already {_label(Approval.Status, current)}: someone decided it meanwhile."
    return "This approval is waiting for a decision again."


def refusal_sentence(exc: errors.SagaError) -> str:
    """What a person is told when a decision is refused: a state-machine refusal in words (never
    "RecoveryItem rec_… is claimed; it cannot become claimed."), any other refusal's own message
    (those are written as sentences where they are raised)."""
    if isinstance(exc, errors.InvalidTransition) and not getattr(exc, "worded", True):
        return transition_sentence(getattr(exc, "subject_type", ""), exc.current, getattr(exc, "to", ""))
    return exc.message
