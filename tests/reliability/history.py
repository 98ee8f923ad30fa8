"""The history checker: reads the audit log (nothing else) and checks the guarantees held.

- at most one effective compensation per action (``step.done`` events);
- per run, effective compensations in reverse order of the forward actions' completion (LIFO,
  from the ``completion_seq`` each ``action.succeeded`` event recorded);
- every write the test saw acknowledged (a 2xx) has its event: no acknowledged write is missing;
- the hash chain is intact and every run's chain ends at its recorded head
  (``ledger.audit.audit_verify``, ``audit_heads_verify``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Acknowledged:
    """A write the client got a 2xx for, and the audit event that must therefore exist."""

    kind: str  # e.g. "run.created", "action.recorded", "unwind.started", "recovery.resolved"
    subject_id: str


@dataclass
class HistoryReport:
    events: int = 0
    compensations: int = 0
    runs_checked: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return sum(1 for v in self.violations if v.startswith("duplicate"))

    @property
    def lost(self) -> int:
        return sum(1 for v in self.violations if v.startswith("lost"))


def check_events(events: Iterable[Any], *, acknowledged: Iterable[Acknowledged] = ()) -> HistoryReport:
    """Check a history given as event-like objects (``kind``, ``run_id``, ``subject_id``,
    ``data``, ``id``) in id order. Pure, so it can be shown a broken history too."""
    report = HistoryReport()
    done_by_action: dict[str, int] = defaultdict(int)
    completion_seq: dict[str, int] = {}
    done_order: dict[str, list[str]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for event in sorted(events, key=lambda e: e.id):
        report.events += 1
        seen.add((event.kind, str(event.subject_id)))
        data = event.data or {}
        if event.kind in ("action.succeeded", "action.reconciled") and "completion_seq" in data:
            completion_seq[str(event.subject_id)] = int(data["completion_seq"])
        elif event.kind == "step.done":
            action_id = str(data.get("action_id"))
            done_by_action[action_id] += 1
            done_order[str(event.run_id)].append(action_id)
            report.compensations += 1
    for action_id, count in done_by_action.items():
        if count > 1:
            report.violations.append(f"duplicate: action {action_id} was compensated {count} times")
    for run_id, action_ids in done_order.items():
        report.runs_checked += 1
        seqs = [completion_seq.get(a, -1) for a in action_ids]
        if seqs != sorted(seqs, reverse=True):
            report.violations.append(
                f"order: run {run_id} compensated completion_seqs {seqs}, not newest first"
            )
    for ack in acknowledged:
        if (ack.kind, ack.subject_id) not in seen:
            report.violations.append(f"lost: acknowledged {ack.kind} for {ack.subject_id} has no audit event")
    return report


def check_history(*, acknowledged: Iterable[Acknowledged] = ()) -> HistoryReport:
    """Check the whole audit log of the test database, hash chain included."""
    from ledger.audit import audit_heads_verify, audit_verify
    from ledger.models import Event

    report = check_events(Event.objects.order_by("id").iterator(), acknowledged=acknowledged)
    _checked, broken = audit_verify()
    if broken is not None:
        report.violations.append(f"chain: {broken.chain} breaks at event {broken.event_id}: {broken.problem}")
    for gap in audit_heads_verify():
        report.violations.append(
            f"chain: run {gap.run_id} lost its newest events (ends at {gap.last_event_id})"
        )
    return report
