"""Keyed audit chain heads: the one HMAC rule for a signed head, the worker's signing pass, and
the check ``verify_audit`` makes of every signed head.

The hash chain (``ledger.audit``) proves an event was not altered or removed *behind* a later
event; it cannot prove an event is genuine, since anyone who can INSERT into ``ledger_event``
(the application's own database role may) can compute the next hash. A signed head can: it is an
HMAC-SHA256 under ``SAGA_AUDIT_KEY``, a key kept outside the database, of
``context + "\\n" + scope + "\\n" + position + "\\n" + head + "\\n" + time``. For a chain
(``SignedHead``) the context is ``saga-audit-chain-head:v1`` and the scope is the chain
(``run:<id>`` or ``tenant:<pk>``): the chain had ``position`` events, the last hashing to ``head``,
at ``time``. Every event's hash covers its whole prefix, so a signed head vouches for all of it.
The audit stream's heads (``recovery.audit_stream.records``) use the same rule under their own
context (``saga-audit-head:v1``, scope the tenant), so neither kind of head can pass for the other.

What ``verify_audit`` then holds against a writer with the application's role (it may INSERT
events and signed heads, never UPDATE or DELETE them, and has no key):

- a signed head must still sit at its position in its chain with its hash, and its signature must
  verify under the key (a head made up, or signed with another key, exits 1 naming it);
- an event appended after a chain's last signed head may not claim a time more than
  ``BACKDATE_ALLOWANCE`` before that head was signed: a genuine event is stamped in the
  transaction that inserts it, and that transaction committed after the head was signed (the
  signer did not see it), so only a forgery is older; a forged approval dated before the action
  it approves is caught this way;
- events after a chain's last signed head are reported "not yet signed" (not a failure): they are
  what the next signing pass vouches for, and no more than a pass's interval old. An event forged
  *now* into that window is indistinguishable from a genuine one until then; the audit stream
  (delivered to a SIEM within seconds) is the record outside the database for that window.

No key (``SAGA_AUDIT_KEY`` unset): nothing is signed, and ``verify_audit`` says the heads are
unsigned.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import JSONObject, Substr
from django.utils import timezone

from ledger.audit import GENESIS, BrokenLink, audit_verify, link_problem
from ledger.models import ArchivedRun, AuditSignCursor, Event, Run, SignedHead, Tenant

log = structlog.get_logger(__name__)

CHAIN_HEAD_CONTEXT = "saga-audit-chain-head:v1"
_KEY_ID_CONTEXT = b"saga-audit-key-id:v1"
# How long a genuine event's transaction may run between stamping the event and committing it.
BACKDATE_ALLOWANCE = timedelta(minutes=5)
_CHUNK = 2000


# --- The rule -----------------------------------------------------------------------------------


def sign_head(key: bytes, *, context: str, scope: str, position: int, head: str, time: str) -> str:
    """HMAC-SHA256 (hex) of a chain head: what was signed, where, how long and when."""
    text = "\n".join([context, scope, str(position), head, time])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def signature_matches(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def key_id(key: bytes) -> str:
    """A fingerprint naming the key (not revealing it), stored with each head it signs, so a head
    signed under a previous key is reported as such."""
    return hmac.new(key, _KEY_ID_CONTEXT, hashlib.sha256).hexdigest()[:16]


def signing_key() -> bytes | None:
    """``SAGA_AUDIT_KEY`` (or the file ``SAGA_AUDIT_KEY_FILE`` names); None when unset."""
    key = str(getattr(settings, "AUDIT_KEY", "") or "")
    return key.encode() if key else None


def signed_time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def chain_head_signature(key: bytes, *, chain: str, position: int, head: str, signed_at: datetime) -> str:
    return sign_head(
        key,
        context=CHAIN_HEAD_CONTEXT,
        scope=chain,
        position=position,
        head=head,
        time=signed_time(signed_at),
    )


# --- Signing ------------------------------------------------------------------------------------

# Committed in the snapshot (or written by this very transaction, which its snapshot never shows).
_VISIBLE = (
    "(stream_txid IS NULL OR stream_txid = pg_current_xact_id_if_assigned()"
    " OR pg_visible_in_snapshot(stream_txid, %s::pg_snapshot))"
)


def _current_snapshot() -> str:
    with connection.cursor() as db:
        db.execute("SELECT pg_current_snapshot()::text")
        return str(db.fetchone()[0])


def sign_chain(
    chain: str, *, tenant_id: int, key: bytes, reason: str = SignedHead.Reason.INTERVAL, snapshot: str = ""
) -> SignedHead | None:
    """Sign ``chain``'s head as committed in ``snapshot`` (default: now), after checking that every
    event since its last signed head links up from it; None when there is nothing new to sign or
    the new events do not link up (a broken chain is never vouched for: ``verify_audit`` names it).
    Two signers signing the same chain at once make one row (``signed_head_chain_position``)."""
    snapshot = snapshot or _current_snapshot()
    last = SignedHead.objects.filter(chain=chain).order_by("-position").first()
    position = last.position if last else 0
    prev_hash = last.head if last else GENESIS
    after_id = last.event_id if last else 0
    newest: Event | None = None
    while True:
        # The SQL is constant text; every value is a parameter.
        batch = list(
            Event.objects.raw(
                f"SELECT * FROM ledger_event WHERE chain = %s AND id > %s AND {_VISIBLE} "  # noqa: S608
                "ORDER BY id LIMIT %s",
                [chain, after_id, snapshot, _CHUNK],
            )
        )
        for event in batch:
            problem = link_problem(event, prev_hash)
            if problem:
                log.error("audit.sign_refused", chain=chain, event_id=event.id, problem=problem)
                return None
            prev_hash, position, newest = event.hash, position + 1, event
        if len(batch) < _CHUNK:
            break
        after_id = batch[-1].id
    if newest is None:
        return None
    signed_at = timezone.now()
    row = SignedHead(
        tenant_id=tenant_id,
        chain=chain,
        position=position,
        event_id=newest.id,
        head=newest.hash,
        signed_at=signed_at,
        key_id=key_id(key),
        reason=reason,
        signature=chain_head_signature(
            key, chain=chain, position=position, head=newest.hash, signed_at=signed_at
        ),
    )
    SignedHead.objects.bulk_create([row], ignore_conflicts=True)
    return row


def _moved_chains(tenant_id: int, *, done: str, batch: str, after: str, limit: int) -> list[str]:
    """The tenant's chains, after ``after`` in order, that transactions committed in ``batch`` and
    not in ``done`` wrote to (on the first pass, every chain: no ``done`` yet). Events written
    before the stream's transaction ids existed (ledger/0019) have none: the first pass covers them."""
    # A snapshot counts its own transaction's writes as visible: this transaction's own events
    # (a test's, or an archive's) are never "done".
    not_done = (
        "(stream_txid = pg_current_xact_id_if_assigned() OR stream_txid >= pg_snapshot_xmin(%s::pg_snapshot)"
        " AND NOT pg_visible_in_snapshot(stream_txid, %s::pg_snapshot))"
    )
    where, params = (not_done, [done, done]) if done else ("TRUE", [])
    with connection.cursor() as db:
        db.execute(
            # Constant text: only the filters above (constants) are spliced in.
            "SELECT DISTINCT chain FROM ledger_event WHERE tenant_id = %s "  # noqa: S608
            f"AND {where} AND {_VISIBLE} AND chain > %s ORDER BY chain LIMIT %s",
            [tenant_id, *params, batch, after, limit],
        )
        return [row[0] for row in db.fetchall()]


# Chains signed per transaction, and transactions per tenant per pass (the rest: the next pass),
# so a first pass over an installation with millions of runs commits as it goes and never holds
# one transaction, or the job, for longer than a job may run.
CHAINS_PER_TRANSACTION = 500
TRANSACTIONS_PER_PASS = 20


def _sign_some(tenant_id: int, key: bytes) -> tuple[int, bool]:
    """One transaction of a tenant's pass: (heads signed, whether chains are left in its batch)."""
    with transaction.atomic():
        with connection.cursor() as db:
            db.execute(
                "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [f"audit-sign:{tenant_id}"]
            )
            if not db.fetchone()[0]:
                return 0, False  # another signer is at it
        AuditSignCursor.objects.get_or_create(tenant_id=tenant_id)
        cursor = AuditSignCursor.objects.select_for_update().get(tenant_id=tenant_id)
        if not cursor.batch_snapshot:
            cursor.batch_snapshot, cursor.batch_after_chain = _current_snapshot(), ""
        chains = _moved_chains(
            tenant_id,
            done=cursor.done_snapshot,
            batch=cursor.batch_snapshot,
            after=cursor.batch_after_chain,
            limit=CHAINS_PER_TRANSACTION,
        )
        signed = sum(
            sign_chain(chain, tenant_id=tenant_id, key=key, snapshot=cursor.batch_snapshot) is not None
            for chain in chains
        )
        more = len(chains) == CHAINS_PER_TRANSACTION
        if more:
            cursor.batch_after_chain = chains[-1]
        else:
            cursor.done_snapshot, cursor.batch_snapshot, cursor.batch_after_chain = (
                cursor.batch_snapshot,
                "",
                "",
            )
            cursor.signed_at = timezone.now()
        cursor.save()
        return signed, more


def audit_heads_sign() -> int:
    """The worker's periodic duty: sign the head of every chain that moved since the last pass,
    tenant by tenant; return how many heads were signed. A tenant another signer is signing is
    skipped (a transaction-scoped advisory lock); without a key nothing is signed."""
    key = signing_key()
    if key is None:
        return 0
    signed = 0
    for tenant_id in Tenant.objects.order_by("pk").values_list("pk", flat=True):
        for _ in range(TRANSACTIONS_PER_PASS):
            count, more = _sign_some(tenant_id, key)
            signed += count
            if not more:
                break
    if signed:
        log.info("audit.heads_signed", heads=signed)
    return signed


# --- Verifying ----------------------------------------------------------------------------------


@dataclass
class SignedHeadsReport:
    """What ``audit_verify_signed`` found. ``broken``: the first broken link of the hash chains (as
    ``audit_verify``); ``problems``: one line per signed head that fails, or event forged behind
    one (empty and no ``broken``: the log is intact); ``unsigned_events`` in ``unsigned_chains``:
    events after their chain's last signed head (not a failure)."""

    checked: int = 0
    broken: BrokenLink | None = None
    key_set: bool = False
    heads_verified: int = 0
    problems: list[str] = field(default_factory=list)
    unsigned_events: int = 0
    unsigned_chains: int = 0
    archived_runs: int = 0  # tombstones checked (``_check_archived_runs``)


class _HeadChecker:
    def __init__(self, key: bytes | None, report: SignedHeadsReport) -> None:
        self.key, self.report = key, report
        self.key_id = key_id(key) if key else ""
        self.chain: str | None = None
        self.signed_at: datetime | None = None
        self.unsigned = 0

    def _end_chain(self) -> None:
        if self.unsigned:
            self.report.unsigned_events += self.unsigned
            self.report.unsigned_chains += 1
        self.chain, self.signed_at, self.unsigned = None, None, 0

    def finish(self) -> None:
        self._end_chain()

    def __call__(self, event: Event, position: int) -> None:
        if event.chain != self.chain:
            self._end_chain()
            self.chain = event.chain
        heads: list[dict[str, Any]] = getattr(event, "signed_heads", None) or []
        if not heads:
            if self.signed_at is not None and event.created_at < self.signed_at - BACKDATE_ALLOWANCE:
                self.report.problems.append(
                    f"chain {event.chain}: event {event.id} ({event.kind}) claims {signed_time(event.created_at)}, "
                    f"before the head signed at {signed_time(self.signed_at)} that it was appended after"
                )
            self.unsigned += 1
            return
        for head in heads:
            self._check(event, position, head)
        self.unsigned = 0

    def _check(self, event: Event, position: int, head: dict[str, Any]) -> None:
        signed_at = datetime.fromisoformat(head["signed_at"])
        where = f"chain {head['chain']}: the signed head at position {head['position']} (signed {signed_time(signed_at)})"
        if head["chain"] != event.chain or head["position"] != position or head["head"] != event.hash:
            self.report.problems.append(f"{where} is no longer a prefix of the chain")
            return
        self.signed_at = max(self.signed_at or signed_at, signed_at)
        if self.key is None:
            return
        expected = chain_head_signature(
            self.key, chain=event.chain, position=position, head=event.hash, signed_at=signed_at
        )
        if signature_matches(expected, str(head["signature"])):
            self.report.heads_verified += 1
        elif head["key_id"] != self.key_id:
            self.report.problems.append(
                f"{where} was signed with another key (key id {str(head['key_id'])[:16]}, "
                f"SAGA_AUDIT_KEY's is {self.key_id}): its signature does not verify"
            )
        else:
            self.report.problems.append(f"{where} has a signature that does not verify (forged or altered)")


def audit_verify_signed(*, chain: str | None = None, limit: int = 100) -> SignedHeadsReport:
    """``audit_verify``'s one pass over every chain (or one), checking every signed head on the way;
    then the signed heads whose event is gone. At most ``limit`` problems are listed."""
    key = signing_key()
    report = SignedHeadsReport(key_set=key is not None)
    heads = (
        SignedHead.objects.filter(event_id=OuterRef("id"))
        .order_by("position")
        .values(
            json=JSONObject(
                chain="chain",
                position="position",
                head="head",
                signed_at="signed_at",
                key_id="key_id",
                signature="signature",
            )
        )
    )
    checker = _HeadChecker(key, report)
    events = Event.objects.annotate(signed_heads=ArraySubquery(heads))
    report.checked, report.broken = audit_verify(chain=chain, events=events, on_event=checker)
    checker.finish()
    _check_orphan_heads(report, chain=chain, limit=limit)
    _check_archived_runs(key, report, chain=chain, limit=limit)
    del report.problems[limit:]
    return report


def _check_orphan_heads(report: SignedHeadsReport, *, chain: str | None, limit: int) -> None:
    """Signed heads whose event is gone, but for the chains of archived runs (their heads outlive
    their events by design: ``_check_archived_runs``). A run chain with no event left at all, whose
    run is gone and which no tombstone accounts for, is a deleted run: said once per chain."""
    run_of_chain = Substr(OuterRef("chain"), len("run:") + 1)
    orphans = (
        SignedHead.objects.filter(~Exists(Event.objects.filter(id=OuterRef("event_id"))))
        .alias(archived=Exists(ArchivedRun.objects.filter(pk=run_of_chain)))
        .exclude(chain__startswith="run:", archived=True)
        .annotate(
            chain_left=Exists(Event.objects.filter(chain=OuterRef("chain"))),
            run_left=Exists(Run.objects.filter(pk=run_of_chain)),
        )
        .order_by("chain", "position")
    )
    if chain:
        orphans = orphans.filter(chain=chain)
    said: set[str] = set()
    for orphan in orphans[:limit]:
        if orphan.chain.startswith("run:") and not orphan.chain_left and not orphan.run_left:
            if orphan.chain not in said:
                said.add(orphan.chain)
                report.problems.append(
                    f"chain {orphan.chain}: its signed heads (the first at position {orphan.position}, which "
                    f"names event {orphan.event_id}, which is not in the log) vouch for a run whose events and "
                    "row are gone, and no archive record (ArchivedRun) accounts for it: the run was deleted"
                )
            continue
        report.problems.append(
            f"chain {orphan.chain}: the signed head at position {orphan.position} (signed "
            f"{signed_time(orphan.signed_at)}) names event {orphan.event_id}, which is not in the log"
        )


# Every archived run with what vouches for its archive, one index probe each (never a query per
# run): the newest ``run.archived`` event of its tenant's chain naming it (and how many there
# are), the head of its chain signed at the length it was archived with (the archive signs it,
# reason ``archive``, unless a signing pass had signed that very length already: one row per
# chain and position), its highest signed position, and whether any of its events or its row are
# still there.
_ARCHIVED_RUNS_SQL = """
    SELECT a.run_id, a.head, a.events, a.archive, a.manifest_sha256,
           ev.recorded, ev.data,
           sh.position, sh.head, sh.signed_at, sh.key_id, sh.signature,
           top.position,
           EXISTS (SELECT 1 FROM ledger_event e WHERE e.chain = 'run:' || a.run_id),
           EXISTS (SELECT 1 FROM ledger_run r WHERE r.id = a.run_id)
    FROM ledger_archivedrun a
    LEFT JOIN LATERAL (
        SELECT count(*) AS recorded, (array_agg(e.data ORDER BY e.id DESC))[1] AS data
        FROM ledger_event e
        WHERE e.subject_type = 'run' AND e.subject_id = a.run_id AND e.kind = 'run.archived'
          AND e.chain = 'tenant:' || a.tenant_id
    ) ev ON TRUE
    LEFT JOIN LATERAL (
        SELECT s.position, s.head, s.signed_at, s.key_id, s.signature FROM ledger_signedhead s
        WHERE s.chain = 'run:' || a.run_id AND s.position = a.events
    ) sh ON TRUE
    LEFT JOIN LATERAL (
        SELECT s.position FROM ledger_signedhead s
        WHERE s.chain = 'run:' || a.run_id ORDER BY s.position DESC LIMIT 1
    ) top ON TRUE
    WHERE a.run_id > %s {where}
    ORDER BY a.run_id
    LIMIT %s
"""
# What the tenant chain's ``run.archived`` event records of the archive, by the tombstone's names.
_ARCHIVED_EVENT_FIELDS = ("run", "head", "events", "archive", "manifest_sha256")


def _check_archived_runs(
    key: bytes | None, report: SignedHeadsReport, *, chain: str | None, limit: int
) -> None:
    """A run chain with no events and no run is sound only when retention archived it: its
    tombstone (``ArchivedRun``), the ``run.archived`` event of its tenant's chain saying the same
    (head, length, archive, manifest hash; that chain itself is verified above), and the head
    signed at the length it was archived with (reason ``archive``, or a signing pass's at that
    very length) with the tombstone's head and a signature that verifies; no signed head beyond
    that length, and none of its events or its row left behind. One pass over the tombstones in
    run id order, ``_CHUNK`` a statement, each after the last run of the one before (keyset: no
    server-side cursor, which PgBouncer's transaction pooling loses between two fetches)."""
    kind, _, ident = (chain or "").partition(":")
    where, params = {
        "run": ("AND a.run_id = %s", [ident]),
        "tenant": ("AND a.tenant_id::text = %s", [ident]),
    }.get(kind, ("AND FALSE" if chain else "", []))
    own_key_id = key_id(key) if key else ""
    after = ""  # every run id sorts after the empty string
    while True:
        with connection.cursor() as db:
            # Constant text: only the filter above (a constant too) is spliced in.
            db.execute(_ARCHIVED_RUNS_SQL.format(where=where), [after, *params, _CHUNK])
            rows = db.fetchall()
        for row in rows:
            if len(report.problems) >= limit:
                return
            report.archived_runs += 1
            _check_archived_run(row, key, own_key_id, report)
        if len(rows) < _CHUNK:
            return
        after = rows[-1][0]


def _check_archived_run(
    row: tuple[Any, ...], key: bytes | None, own_key_id: str, report: SignedHeadsReport
) -> None:
    run_id, head, events, archive, manifest, recorded, data = row[:7]
    top_position, events_left, run_left = row[12:15]
    where = f"archived run {run_id} (chain run:{run_id})"
    problems = report.problems
    if run_left:
        problems.append(f"{where}: its run row is still in the database")
    if events_left:
        problems.append(f"{where}: events of its chain are still in the log")
    tombstone = {
        "run": run_id,
        "head": head,
        "events": events,
        "archive": archive,
        "manifest_sha256": manifest,
    }
    problems.extend(f"{where}: {problem}" for problem in _archived_event_problems(recorded, data, tombstone))
    if top_position is not None and top_position > events:
        problems.append(
            f"{where}: a signed head at position {top_position} is beyond the {events} events it was "
            "archived with"
        )
    problem = _archive_head_problem(row, key, own_key_id, report)
    if problem:
        problems.append(f"{where}: {problem}")


def _archived_event_problems(recorded: int, data: Any, tombstone: dict[str, Any]) -> list[str]:
    """What is wrong with the tenant chain's ``run.archived`` events for one tombstone."""
    if not recorded:
        return [
            "its tenant's audit chain holds no run.archived event for it (an archive record nothing "
            "in the log vouches for)"
        ]
    if isinstance(data, str):
        data = json.loads(data)
    problems = []
    differ = [f for f in _ARCHIVED_EVENT_FIELDS if not isinstance(data, dict) or data.get(f) != tombstone[f]]
    if differ:
        problems.append(
            "its tenant chain's run.archived event does not match its archive record "
            f"({', '.join(differ)} differ{'s' if len(differ) == 1 else ''})"
        )
    if recorded > 1:
        problems.append(f"its tenant's audit chain records it as archived {recorded} times")
    return problems


def _archive_head_problem(
    row: tuple[Any, ...], key: bytes | None, own_key_id: str, report: SignedHeadsReport
) -> str:
    """What is wrong with the head signed at the length a run was archived with ("" when nothing is)."""
    run_id, head, events = row[:3]
    position, signed_head, signed_at, signer, signature = row[7:12]
    if position is None:
        # Without a key nothing is signed (and verify_audit says so); with one, an archive signs.
        return f"no head of its chain was signed at the {events} events it was archived with" if key else ""
    if signed_head != head:
        return (
            f"the head signed at the {events} events it was archived with ({signed_head[:16]}…) is not "
            f"the archive record's ({head[:16]}…)"
        )
    if key is None:
        return ""
    expected = chain_head_signature(
        key, chain=f"run:{run_id}", position=position, head=head, signed_at=signed_at
    )
    if signature_matches(expected, str(signature)):
        report.heads_verified += 1
        return ""
    if signer != own_key_id:
        return (
            f"the head signed at the {events} events it was archived with was signed with another key "
            f"(key id {str(signer)[:16]}, SAGA_AUDIT_KEY's is {own_key_id}): its signature does not verify"
        )
    return (
        f"the head signed at the {events} events it was archived with has a signature that does not "
        "verify (forged or altered)"
    )
