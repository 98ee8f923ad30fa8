"""``runs_archive``: the runs closed longer than their tenant's retention window, archived and
removed (the worker's periodic duty, ``manage.py archive_runs``).

Per tenant with a retention (``recovery.archive.policy``), oldest finished first, at most
``limit`` runs a call, in batches of ``RUNS_PER_TRANSACTION``: the batch's rows read a statement a
model, each run's files written and confirmed (``write``), then the batch removed in one short
transaction (``remove``). A run with anything open is left and said why, and so is one whose
events the tenant's audit stream has not yet delivered. One archiver at a time per tenant (a
transaction-scoped advisory lock held on a connection of its own, ``infra.held_locks``: it works
behind PgBouncer's transaction pooling, and PostgreSQL releases it if the process dies): another
finds the tenant busy and leaves it. A kill at any point leaves each run live or archived, never half: the files are
written before the transaction that removes the batch, and a run whose files were written but not
committed is written again, whole, by the next pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from django.db.models import QuerySet
from django.utils import timezone

from infra.conf import saga
from infra.held_locks import HeldLock, LockLost, held_lock
from ledger.archive.storage import Storage, StorageError, storage_for
from ledger.audit_signing import signing_key
from ledger.models import Run, Tenant
from ledger.policies.retention import Retention, RetentionError
from recovery.archive.policy import tenant_retentions
from recovery.archive.records import CLOSED, open_reasons, open_runs_filter
from recovery.archive.remove import ArchiveRefused, archive_commit_many
from recovery.archive.write import RunChanged, Written, archive_write, rows_of_runs
from recovery.audit_stream.delivery import chain_undelivered

log = structlog.get_logger(__name__)

# Runs with something open listed per tenant and call (they are left; the list says why).
_OPEN_LISTED = 100
# Runs read together and removed in one transaction: a set-based statement a model for all of them
# instead of ~41 a run; small enough that a kill loses (to the next pass) one short transaction.
RUNS_PER_TRANSACTION = 20


class ArchiveNotConfigured(Exception):
    """Retention is configured but cannot run (no key), in words."""


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    tenant: str
    detail: str  # archived: the manifest's URL; skipped: why


@dataclass
class ArchiveResult:
    """What one call did (or, in a dry run, would do): runs archived, runs left and why, and
    tenants whose retention could not be used."""

    dry_run: bool = False
    archived: list[RunOutcome] = field(default_factory=list)
    skipped: list[RunOutcome] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _error(result: ArchiveResult, tenant: Tenant, *, reason: str, message: str, level: str = "error") -> None:
    """A tenant's pass that could not run (or stopped): in the result, and one structured log
    event (``archive.error``: tenant, reason, message; the run when one is named)."""
    result.errors.append(f"tenant {tenant.slug}: {message}")
    getattr(log, level)("archive.error", tenant=tenant.slug, reason=reason, message=message)


def _key(dry_run: bool) -> bytes:
    key = signing_key()
    if key is None and not dry_run:
        raise ArchiveNotConfigured(
            "Retention is configured but SAGA_AUDIT_KEY (or SAGA_AUDIT_KEY_FILE) is not set: archive "
            "manifests are signed with it, so nothing is archived until it is set (a long random "
            "secret kept outside the database, e.g. `openssl rand -hex 32`)."
        )
    return key or b""


# Why a tenant's pass stopped, by what stopped it (the ``archive.error`` event's reason).
_REASONS: dict[type[Exception], str] = {
    StorageError: "storage_failed",
    ArchiveRefused: "refused",
    LockLost: "lock_lost",
}


def _reason(exc: Exception) -> str:
    return next(reason for kind, reason in _REASONS.items() if isinstance(exc, kind))


def _tenant_lock_name(tenant: Tenant) -> str:
    return f"archive:{tenant.pk}"


def _due(tenant: Tenant, retention: Retention) -> QuerySet[Run]:
    cutoff = timezone.now() - retention.window
    return Run.objects.filter(tenant=tenant, status__in=CLOSED, finished_at__lt=cutoff)


def _tenant_pass(
    tenant: Tenant,
    retention: Retention,
    *,
    result: ArchiveResult,
    key: bytes,
    limit: int,
    storage: Storage,
    lock: HeldLock,
) -> int:
    """One tenant's due runs: archived (or, dry, listed); returns how many were taken on."""
    due = _due(tenant, retention)
    still_open = due.filter(open_runs_filter()).order_by("finished_at", "pk").values_list("pk", flat=True)
    for run_id in still_open[:_OPEN_LISTED]:
        result.skipped.append(RunOutcome(run_id, tenant.slug, "; ".join(open_reasons(run_id)) or "open"))
    candidates = list(
        due.exclude(open_runs_filter()).order_by("finished_at", "pk").values_list("pk", flat=True)[:limit]
    )
    ready: list[str] = []
    for run_id in candidates:
        behind = chain_undelivered(tenant, f"run:{run_id}")
        if behind:
            result.skipped.append(
                RunOutcome(
                    run_id,
                    tenant.slug,
                    f"the audit stream has not yet delivered its events to {', '.join(behind)}",
                )
            )
            continue
        if result.dry_run:
            result.archived.append(
                RunOutcome(run_id, tenant.slug, f"would be archived under {retention.archive.url}")
            )
            continue
        ready.append(run_id)
    for start in range(0, len(ready), RUNS_PER_TRANSACTION):
        # Still the only archiver of this tenant before its next files are written.
        lock.check()
        _archive_batch(
            ready[start : start + RUNS_PER_TRANSACTION],
            tenant,
            retention,
            result=result,
            key=key,
            storage=storage,
        )
    return len(candidates)


def _archive_batch(
    run_ids: list[str],
    tenant: Tenant,
    retention: Retention,
    *,
    result: ArchiveResult,
    key: bytes,
    storage: Storage,
) -> None:
    """A batch of runs: their rows read together, each run's files written and confirmed, then all
    of them removed in one transaction."""
    rows = rows_of_runs(run_ids)
    writtens: list[Written] = []
    for run_id in run_ids:
        try:
            writtens.append(
                archive_write(
                    run_id,
                    tenant=tenant,
                    destination=retention.archive,
                    storage=storage,
                    key=key,
                    compress=saga().archive_gzip,
                    rows=rows[run_id],
                )
            )
        except RunChanged:
            result.skipped.append(RunOutcome(run_id, tenant.slug, "it changed while its archive was written"))
        except LookupError:
            continue  # removed meanwhile
    if not writtens:
        return
    reasons = archive_commit_many(writtens, key=key)
    for written in writtens:
        reason = reasons[written.run_id]
        if reason:
            result.skipped.append(RunOutcome(written.run_id, tenant.slug, reason))
            continue
        log.info(
            "archive.run_archived", run_id=written.run_id, tenant=tenant.slug, archive=written.manifest_url
        )
        result.archived.append(RunOutcome(written.run_id, tenant.slug, written.manifest_url))


def runs_archive(
    *, tenant: Tenant | None = None, dry_run: bool = False, limit: int | None = None
) -> ArchiveResult:
    """Archive the runs past their tenant's retention window (every tenant's, or ``tenant``'s), at
    most ``limit`` (default ``SAGA_ARCHIVE_BATCH``). ``dry_run``: change nothing, list what would
    be archived and what is left and why. ``ArchiveNotConfigured`` without ``SAGA_AUDIT_KEY`` when
    some tenant has a retention; a storage failure stops that tenant's pass (``errors``)."""
    result = ArchiveResult(dry_run=dry_run)
    retentions = tenant_retentions(tenant=tenant)
    if not retentions:
        return result
    key = _key(dry_run)
    remaining = saga().archive_batch if limit is None else limit
    for each, retention in retentions:
        if isinstance(retention, RetentionError):
            _error(
                result,
                each,
                reason="retention_unusable",
                message=f"audit.retention cannot be used: {retention}",
            )
            continue
        if remaining <= 0:
            break
        with held_lock(_tenant_lock_name(each)) as lock:
            if lock is None:
                _error(
                    result,
                    each,
                    reason="archiver_busy",
                    message="another archiver is at it; left to it",
                    level="warning",
                )
                continue
            try:
                storage = storage_for(retention.archive, s3_endpoint_url=saga().archive_s3_endpoint_url)
                remaining -= _tenant_pass(
                    each, retention, result=result, key=key, limit=remaining, storage=storage, lock=lock
                )
            except (StorageError, ArchiveRefused, LockLost) as exc:
                _error(result, each, reason=_reason(exc), message=str(exc))
    return result
