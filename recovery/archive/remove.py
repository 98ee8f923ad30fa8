"""Runs removed from PostgreSQL once their archives are written and confirmed, a batch of runs in
one transaction (``archive_commit_many``; ``archive_commit`` for one):
the run locked, checked to be exactly what was archived (its chain's head, still closed, nothing
open), its chain's head signed (reason ``archive``), the tombstone (``ArchivedRun``) and the
tenant-chain event ``run.archived`` written, then its audit events deleted by the one function the
audit protections allow (``saga_archived_run_events_delete``, ledger/0024: it checks those three
records itself) and every other row of the run through the ORM. A crash anywhere before the
commit leaves every run of the batch live and whole; after it, all archived and recorded."""

from __future__ import annotations

from django.db import connection, transaction

from ledger.audit import Actor, audit_record
from ledger.audit_signing import sign_chain
from ledger.models import ArchivedRun, Run, SignedHead
from recovery.archive.records import CLOSED, open_reasons, open_runs_filter
from recovery.archive.write import Written
from recovery.models import Notification

ARCHIVER = Actor.system("archiver")


class ArchiveRefused(Exception):
    """The removal found the database not as the archive says (a broken chain, a signed head that
    disagrees): nothing was removed."""


def _changed(run: Run | None, written: Written, *, still_open: bool) -> str:
    """Why the live run is not the archived one ("" when it is)."""
    if run is None:
        return "it is gone (another archiver removed it)"
    if run.audit_head != written.head:
        return "it changed after its archive was written (its audit chain moved); the next pass archives it again"
    if run.status not in CLOSED or run.finished_at != written.finished_at:
        return f"it is no longer closed as archived (now {run.status})"
    return "; ".join(open_reasons(run.pk)) if still_open else ""


def _sign(written: Written, *, key: bytes) -> None:
    """The chain's head signed at its archived length (the interval signer may have signed that
    very head already: its row stands, one row per position)."""
    chain = f"run:{written.run_id}"
    sign_chain(chain, tenant_id=written.tenant_id, key=key, reason=SignedHead.Reason.ARCHIVE)
    signed = SignedHead.objects.filter(chain=chain, position=written.events).first()
    if signed is None or signed.head != written.head:
        raise ArchiveRefused(
            f"run {written.run_id}: its audit chain does not link up to the archived head (verify_audit names "
            "the break); nothing was removed"
        )


def archive_commit(written: Written, *, key: bytes) -> str:
    """Remove the run ``written`` describes; "" when it was removed, else why it was left live."""
    return archive_commit_many([written], key=key)[written.run_id]


def archive_commit_many(writtens: list[Written], *, key: bytes) -> dict[str, str]:
    """Remove the runs ``writtens`` describe in one transaction: run id -> "" for each removed,
    else why it was left live (the others are removed all the same). Set-based: the runs locked,
    checked and deleted a statement for all of them, not ~40 statements a run."""
    by_id = {written.run_id: written for written in writtens}
    left: dict[str, str] = {}
    with transaction.atomic():
        # Locked in id order: two archivers (or an archiver and a decision) never lock crosswise.
        runs = {
            run.pk: run
            for run in Run.objects.select_for_update(of=("self",))
            .select_related("tenant")
            .filter(pk__in=list(by_id))
            .order_by("pk")
        }
        still_open = set(
            Run.objects.filter(pk__in=list(runs)).filter(open_runs_filter()).values_list("pk", flat=True)
        )
        removing: list[tuple[Run, Written]] = []
        for run_id, written in by_id.items():
            run = runs.get(run_id)
            reason = _changed(run, written, still_open=run_id in still_open)
            if reason or run is None:
                left[run_id] = reason
                continue
            removing.append((run, written))
        for _run, written in removing:
            _sign(written, key=key)
        ArchivedRun.objects.bulk_create(
            [
                ArchivedRun(
                    run_id=written.run_id,
                    tenant_id=written.tenant_id,
                    agent=written.agent,
                    owner=written.owner,
                    status=written.status,
                    created_at=written.created_at,
                    finished_at=written.finished_at,
                    archived_at=written.archived_at,
                    archive=written.manifest_url,
                    manifest_sha256=written.manifest_sha256,
                    head=written.head,
                    events=written.events,
                )
                for _, written in removing
            ]
        )
        for run, written in removing:
            audit_record(
                tenant=run.tenant,
                actor=ARCHIVER,
                kind="run.archived",
                subject=f"run:{written.run_id}",
                reason="retention",
                data={
                    "run": written.run_id,
                    "head": written.head,
                    "events": written.events,
                    "archive": written.manifest_url,
                    "manifest_sha256": written.manifest_sha256,
                },
            )
            with connection.cursor() as cursor:
                cursor.execute("SELECT saga_archived_run_events_delete(%s)", [written.run_id])
                deleted = cursor.fetchone()[0]
            if deleted != written.events:
                raise ArchiveRefused(
                    f"run {written.run_id}: {deleted} audit events removed, {written.events} archived"
                )
        removed = [written.run_id for _, written in removing]
        if removed:
            # One collector for the batch: each model's rows deleted with one statement for all.
            Notification.objects.filter(run_id__in=removed).delete()
            Run.objects.filter(pk__in=removed).delete()
    return {run_id: left.get(run_id, "") for run_id in by_id}
