"""A run as retention leaves it once archived, made in one step for tests of what reads that
state (410 ``archived``, ``verify_audit``'s checks of archived chains), whatever the run's status
and with no archive file written. The real archiver (``recovery.archive``: files, then
``remove.archive_commit``) leaves the same records; ``recovery/test_archive.py`` archives for real
and holds the live ``verify_audit`` to them
(``::test_live_verify_audit_still_passes_for_the_rest_after_an_archive``).

In one transaction, exactly what the archiver's removal leaves behind: the run's tombstone
(``ArchivedRun``); the ``run.archived`` event of its tenant's chain naming the run, its chain's
head and length, the archive and the manifest's hash; the head of its chain signed with reason
``archive`` at that length (when ``SAGA_AUDIT_KEY`` is set: without a key nothing is signed; and
a signing pass's head at that very length stands for it);
then every row of the run deleted — the run, its actions, checkpoints, approvals, recovery items,
unwinds, commands, notifications, idempotency records and the events of its chain (the archiver
deletes those through a SECURITY DEFINER function; here the test's owner role steps past the
append-only trigger). Earlier signed heads of the chain stay, as they do after a real archive."""

from __future__ import annotations

import hashlib

import pgtrigger
from django.db import transaction
from django.utils import timezone

from ledger.audit import Actor, audit_record
from ledger.audit_signing import chain_head_signature, key_id, signing_key
from ledger.models import ArchivedRun, Event, IdempotencyRecord, Run, SignedHead
from recovery.models import Notification


def archive_run_for_test(run: Run, archive_url: str) -> ArchivedRun:
    """Archive ``run`` to ``archive_url`` (the URL of its manifest) as retention does; return its
    tombstone."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("tenant").get(pk=run.pk)
        chain = f"run:{run.pk}"
        events = Event.objects.filter(chain=chain)
        length = events.count()
        last = events.order_by("-id").values_list("id", "hash").first()
        head = last[1] if last else run.audit_head
        manifest_sha256 = hashlib.sha256(f"manifest of {run.pk} at {archive_url}".encode()).hexdigest()
        now = timezone.now()
        tombstone = ArchivedRun.objects.create(
            run_id=run.pk,
            tenant=run.tenant,
            agent=run.agent,
            owner=run.owner,
            status=run.status,
            created_at=run.created_at,
            finished_at=run.finished_at or now,
            archived_at=now,
            archive=archive_url,
            manifest_sha256=manifest_sha256,
            head=head,
            events=length,
        )
        audit_record(
            tenant=run.tenant,
            actor=Actor.system("retention"),
            kind="run.archived",
            subject=f"run:{run.pk}",
            data={
                "run": run.pk,
                "head": head,
                "events": length,
                "archive": archive_url,
                "manifest_sha256": manifest_sha256,
            },
        )
        key = signing_key()
        if key is not None and last is not None:
            # One row per chain and length: when a signing pass signed this very length already,
            # that head stands for the archive's (as ``ledger.audit_signing.sign_chain`` does).
            SignedHead.objects.bulk_create(
                [
                    SignedHead(
                        tenant=run.tenant,
                        chain=chain,
                        position=length,
                        event_id=last[0],
                        head=head,
                        signed_at=now,
                        key_id=key_id(key),
                        reason=SignedHead.Reason.ARCHIVE,
                        signature=chain_head_signature(
                            key, chain=chain, position=length, head=head, signed_at=now
                        ),
                    )
                ],
                ignore_conflicts=True,
            )
        with pgtrigger.ignore("ledger.Event:event_append_only"):
            events.delete()
        Notification.objects.filter(tenant=run.tenant, run_id=run.pk).delete()
        IdempotencyRecord.objects.filter(tenant=run.tenant, path__contains=f"/runs/{run.pk}").delete()
        # The rest goes with the run (its actions, checkpoints, approvals, recovery items, unwinds
        # and commands are deleted with it: on_delete=CASCADE).
        Run.objects.filter(pk=run.pk).delete()
    return tombstone
