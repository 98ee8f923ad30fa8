"""What belongs to a run, for its archive and its removal: every model that references the run,
directly or through its actions, unwinds, items or approvals (``ARCHIVED``, in the order its
records are written: the run first, its audit chain last); and what keeps a run open, which
retention never archives.

``tests/recovery/test_archive.py`` reads every installed model's foreign keys (and its ``run_id``
columns that are not keys) and fails when one that reaches a run is missing here, so a new model
can neither block the removal of archived runs nor escape their archives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import models

from ledger.models import Action, Checkpoint, Event, Run
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import (
    AgentCommand,
    Approval,
    ApprovalGrant,
    EmailLinkUse,
    Notification,
    RecoveryItem,
    Unwind,
    UnwindStep,
)

# "Closed" runs: finished, with nothing left to decide (a failed or compensating run is not).
CLOSED = (Run.Status.SUCCEEDED, Run.Status.COMPENSATED, Run.Status.CLOSED, Run.Status.CANCELLED)


@dataclass(frozen=True)
class Archived:
    """A model whose rows of run ``X`` are ``model.objects.filter(**{lookup: X})``, archived as
    records of type ``kind``."""

    model: type[models.Model]
    kind: str
    lookup: str

    def rows(self, run_id: str) -> Iterator[dict[str, Any]]:
        value = f"run:{run_id}" if self.model is Event else run_id
        columns = [field.attname for field in self.model._meta.concrete_fields]
        queryset = self.model._default_manager.filter(**{self.lookup: value}).order_by("pk").values(*columns)
        # One round trip: a run's rows of one model fit in memory (a server-side cursor, as
        # ``iterator()`` opens, costs three: DECLARE, FETCH, CLOSE, for the dozen models of every run).
        yield from queryset

    def rows_of_runs(self, run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The rows of every run in ``run_ids``, by run, in one query (the batched archiver's
        read: one statement a model for a batch of runs, not one a model for each run)."""
        columns = [field.attname for field in self.model._meta.concrete_fields]
        by_run: dict[str, list[dict[str, Any]]] = {run_id: [] for run_id in run_ids}
        if self.model is Event:
            chains = {f"run:{run_id}": run_id for run_id in run_ids}
            queryset = self.model._default_manager.filter(chain__in=list(chains)).order_by("pk")
            for row in queryset.values(*columns):
                by_run[chains[row["chain"]]].append(row)
            return by_run
        queryset = (
            self.model._default_manager.filter(**{f"{self.lookup}__in": run_ids})
            .annotate(archived_run_key=models.F(self.lookup))
            .order_by("pk")
        )
        for row in queryset.values(*columns, "archived_run_key"):
            by_run[row.pop("archived_run_key")].append(row)
        return by_run


ARCHIVED: tuple[Archived, ...] = (
    Archived(Run, "run", "pk"),
    Archived(Action, "action", "run_id"),
    Archived(Checkpoint, "checkpoint", "run_id"),
    Archived(RecoveryItem, "recovery_item", "run_id"),
    Archived(Unwind, "unwind", "run_id"),
    Archived(UnwindStep, "unwind_step", "unwind__run_id"),
    Archived(Approval, "approval", "run_id"),
    Archived(ApprovalGrant, "approval_grant", "approval__run_id"),
    # The e-mail decision links that were used on the run's approvals (their nonces).
    Archived(EmailLinkUse, "email_link_use", "approval__run_id"),
    Archived(AgentCommand, "command", "run_id"),
    Archived(BulkItem, "bulk_item", "item__run_id"),
    Archived(Notification, "notification", "run_id"),
    # The run's audit chain, in chain order (its ids), last.
    Archived(Event, "event", "chain"),
)


@dataclass(frozen=True)
class _Open:
    """Something that keeps a run open: rows of ``model`` reaching the run by ``run_lookup``, with
    ``where``."""

    reason: str
    model: type[models.Model]
    run_lookup: str
    where: dict[str, Any]

    def of(self, run: Any) -> models.QuerySet[Any]:
        return self.model._default_manager.filter(**{self.run_lookup: run}, **self.where)


OPEN: tuple[_Open, ...] = (
    _Open("an approval is pending", Approval, "run_id", {"status": Approval.Status.PENDING}),
    _Open("its recovery item is unresolved", RecoveryItem, "run_id", {"status__in": RecoveryItem.UNRESOLVED}),
    _Open(
        "an unwind is under way",
        Unwind,
        "run_id",
        {"status__in": [Unwind.Status.RUNNING, Unwind.Status.PAUSED]},
    ),
    _Open(
        "a command to its agent is pending", AgentCommand, "run_id", {"status": AgentCommand.Status.PENDING}
    ),
    _Open(
        "a notification about it is still to be sent",
        Notification,
        "run_id",
        {"status__in": [Notification.Status.PENDING, Notification.Status.SENDING]},
    ),
    _Open(
        "a bulk decision still has its recovery item to decide",
        BulkItem,
        "item__run_id",
        {"outcome": BulkItem.Outcome.PENDING, "bulk__status": BulkOperation.Status.RUNNING},
    ),
)


def open_reasons(run_id: str) -> list[str]:
    """What still keeps a closed run open, in words (empty: nothing): its archive would freeze a
    decision or a delivery still under way. One query when nothing is (the usual case)."""
    if not Run.objects.filter(pk=run_id).filter(open_runs_filter()).exists():
        return []
    return [each.reason for each in OPEN if each.of(run_id).exists()]


def open_runs_filter() -> models.Q:
    """``open_reasons`` as one filter on runs: those with anything open."""
    condition = models.Q()
    for each in OPEN:
        condition |= models.Q(models.Exists(each.of(models.OuterRef("pk"))))
    return condition
