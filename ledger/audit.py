"""The audit log: every event is made here, ``audit_verify`` checks them.

Two writers append to it, and both take the event's content from this module:

- ``audit_record`` writes an event from Python, in the caller's transaction: every event but the
  hot writes';
- the hot writes (recording an action, moving one its agent reports on) are one call each of a
  database function (``saga_action_record``, ``saga_action_move``: ``ledger/sql``, called through
  ``ledger.services.writes``), so their events are inserted by ``saga_event_insert`` inside that
  call. ``event_template`` builds each of them, its canonical text in parts around the values only
  the database knows; the database fills those in, links the event to its chain's head under the
  run's row lock and hashes it as ``_event_digest`` does. ``clients/spec/vectors/audit_events.json``
  holds both writers and the checkers to the same hashes.

Nothing else in the application inserts events (the benchmark's seed, ``bench/size_seed.py``,
copies chains hashed the same way into a database of its own). Only retention removes any: a
run's whole chain, once archived, by ``saga_archived_run_events_delete`` (``ledger/sql``, called
by ``recovery.archive.remove``); the log's triggers refuse every other UPDATE, DELETE and TRUNCATE.

Every event is hash-chained to the previous event of its chain (its run, or the tenant's run-less
events). Two concurrent transitions must never both link to the same predecessor:

- a run's chain has its head on the run row (``Run.audit_head``), moved by a compare-and-set
  ``UPDATE … WHERE audit_head = <the head this event links to>``. The UPDATE takes the run's row
  lock and PostgreSQL re-checks the condition after any concurrent writer commits, so exactly one
  writer links to a given head; the loser re-reads the head under the lock it then holds. The
  caller's run instance usually already carries the current head (it has just locked or created
  the row), so the common case costs the UPDATE and the event's INSERT, and nothing else;
- the tenant's run-less chain is serialised with a transaction-scoped advisory lock and reads its
  latest event.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction
from django.utils import timezone

from infra.hashing import canonical_json, sha256_hex
from ledger.models import AgentKey, Event, Run, Tenant

if TYPE_CHECKING:
    # settings.AUTH_USER_MODEL: Django's own user model (the project does not swap it).
    from django.contrib.auth.models import User
    from django.db.models import Model, QuerySet

GENESIS = "0" * 64

# Data every event recorded inside ``audit_context`` carries besides its own (a bulk decision's id
# on each of the decisions it makes through the ordinary services).
_CONTEXT_DATA: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "audit_context", default=None
)


@contextlib.contextmanager
def audit_context(**data: Any) -> Iterator[None]:
    """Add ``data`` to the data of every event ``audit_record`` writes in this block (an event's
    own keys win), so a decision made on behalf of something larger names it in the log."""
    token = _CONTEXT_DATA.set({**(_CONTEXT_DATA.get() or {}), **data})
    try:
        yield
    finally:
        _CONTEXT_DATA.reset(token)


@dataclass(frozen=True)
class Actor:
    """Who did something: an agent key, a dashboard user, or the system itself."""

    type: str
    id: str = ""
    label: str = ""
    user: User | None = None
    key: AgentKey | None = None

    @classmethod
    def for_key(cls, key: AgentKey) -> Actor:
        return cls(type=Event.ActorType.AGENT_KEY, id=str(key.pk), label=key.name, key=key)

    @classmethod
    def for_user(cls, user: User) -> Actor:
        return cls(type=Event.ActorType.USER, id=str(user.pk), label=user.get_username(), user=user)

    @classmethod
    def system(cls, label: str = "system") -> Actor:
        return cls(type=Event.ActorType.SYSTEM, id="", label=label)


def _chain_for(tenant: Tenant, run: Run | None) -> str:
    return f"run:{run.pk}" if run is not None else f"tenant:{tenant.pk}"


def _event_digest(prev_hash: str, fields: dict[str, Any]) -> str:
    return sha256_hex(prev_hash + "." + canonical_json(fields))


def _hashed_fields(event: Event) -> dict[str, Any]:
    created: datetime = event.created_at
    return {
        "tenant": event.tenant_id,
        "run": event.run_id,
        "chain": event.chain,
        "kind": event.kind,
        "subject_type": event.subject_type,
        "subject_id": event.subject_id,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "actor_type": event.actor_type,
        "actor_id": event.actor_id,
        "actor_label": event.actor_label,
        "reason": event.reason,
        "data": event.data,
        "created_at": created.isoformat(),
    }


def _subject_ref(subject: Model | str) -> tuple[str, str]:
    """(type, id) of what an event is about: a model instance, or "type:id" for something that no
    longer exists as a row (a removed membership)."""
    if isinstance(subject, str):
        kind, _, ident = subject.partition(":")
        return kind, ident
    return type(subject).__name__.lower(), str(getattr(subject, "pk", ""))


def audit_record(
    *,
    tenant: Tenant,
    actor: Actor,
    kind: str,
    subject: Model | str,
    run: Run | None = None,
    from_state: str = "",
    to_state: str = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
    run_updates: dict[str, Any] | None = None,
) -> Event:
    """Append one audit event in the caller's transaction (it must be inside one).

    ``run_updates``: other columns of the run's row to set in the same UPDATE that moves its chain
    head (a counter the caller moves under the run's row lock), saving a statement."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_record must run inside the transition's transaction")
    chain = _chain_for(tenant, run)
    if run is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [chain])
        previous = Event.objects.filter(chain=chain).order_by("-id").values_list("hash", flat=True).first()
        prev_hash = previous or GENESIS
    else:
        # The head as this instance knows it (a deferred field is not worth a query: a wrong
        # guess only costs the re-read below).
        prev_hash = run.__dict__.get("audit_head") or GENESIS
    subject_type, subject_id = _subject_ref(subject)
    event = Event(
        tenant=tenant,
        run=run,
        chain=chain,
        kind=kind,
        subject_type=subject_type,
        subject_id=subject_id,
        from_state=str(from_state or ""),
        to_state=str(to_state or ""),
        actor_type=actor.type,
        actor_id=actor.id,
        actor_label=actor.label[:200],
        reason=reason or "",
        data={**(_CONTEXT_DATA.get() or {}), **(data or {})},
        created_at=timezone.now(),
        prev_hash=prev_hash,
    )
    # Hash what the database will hand back: round-trip the JSON so key order and number
    # formatting match what verification later reads.
    event.data = _roundtrip(event.data)
    event.hash = _event_digest(prev_hash, _hashed_fields(event))
    if run is not None:
        _advance_run_head(run, event, run_updates or {})
    elif run_updates:
        raise ValueError("run_updates needs a run")
    else:
        # Under the chain's advisory lock: the tenant row records where its chain ends.
        Tenant.objects.filter(pk=tenant.pk).update(audit_head=event.hash)
    event.save(force_insert=True)
    return event


# --- Events written by the database (ledger/sql: the hot path's one call per write) ------------

# A value only the database knows when the event is built (the state an action left, its attempt
# or completion number, the run of an action it moves): a ``Slot`` in the event's fields. The
# canonical text is rendered around it, in the same order and spelling as ``canonical_json``, and
# handed over in parts; the database joins them with its values (``saga_event_insert``). Content is
# never searched for a slot, so no content can fake one.


@dataclass(frozen=True)
class Slot:
    name: str  # "from", "attempt", "completion_seq", "run", "chain"


def slot(name: str) -> Slot:
    """A placeholder for the database's value ``name``."""
    return Slot(name)


def _render(value: Any) -> list[str | Slot]:
    """``canonical_json(value)`` as pieces, with every ``Slot`` left in place."""
    if isinstance(value, Slot):
        return [value]
    if isinstance(value, dict) and _has_slot(value):
        pieces: list[str | Slot] = ["{"]
        for n, key in enumerate(sorted(value)):
            pieces.append(("," if n else "") + canonical_json(key) + ":")
            pieces.extend(_render(value[key]))
        pieces.append("}")
        return pieces
    return [canonical_json(value)]


def _has_slot(value: Any) -> bool:
    if isinstance(value, Slot):
        return True
    return isinstance(value, dict) and any(_has_slot(v) for v in value.values())


def _split(value: Any) -> tuple[list[str], list[str | None]]:
    parts: list[str] = []
    slots: list[str | None] = []
    current = ""
    for piece in _render(value):
        if isinstance(piece, Slot):
            parts.append(current)
            slots.append(piece.name)
            current = ""
        else:
            current += piece
    parts.append(current)
    slots.append(None)
    return parts, slots


def event_template(
    *,
    tenant_id: int,
    run_id: str | None,
    actor: Actor,
    kind: str,
    subject_type: str,
    subject_id: str,
    to_state: str,
    from_state: str | Slot = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """One event of a run's chain for a ledger write function to insert: its columns, and its
    canonical text (exactly what ``_hashed_fields`` gives when the event is read back) in parts
    around its slots; the database links it to its chain's head and hashes it. ``from_state`` and
    ``data``'s values may be slots; ``run_id`` None: the run is the database's (slots "run" and
    "chain": the run of the action it moves)."""
    event_data = {k: v if isinstance(v, Slot) else _roundtrip(v) for k, v in (data or {}).items()}
    # The hashed fields are the ones verification reads back (``_hashed_fields``), spelled once;
    # then the slots take the places of the values only the database knows.
    fields = _hashed_fields(
        Event(
            tenant_id=tenant_id,
            run_id=run_id or "",
            chain=f"run:{run_id}" if run_id is not None else "",
            kind=kind,
            subject_type=subject_type,
            subject_id=subject_id,
            from_state="" if isinstance(from_state, Slot) else from_state,
            to_state=to_state,
            actor_type=actor.type,
            actor_id=actor.id,
            actor_label=actor.label[:200],
            reason=reason or "",
            data=event_data,
            created_at=created_at or timezone.now(),
        )
    )
    if run_id is None:
        fields.update(run=Slot("run"), chain=Slot("chain"))
    if isinstance(from_state, Slot):
        fields["from_state"] = from_state
    parts, slots = _split(fields)
    data_parts, data_slots = _split(event_data)
    columns = {
        name: value for name, value in fields.items() if name != "data" and not isinstance(value, Slot)
    }
    return {
        **columns,
        "parts": parts,
        "slots": slots,
        "data_parts": data_parts,
        "data_slots": data_slots,
        "from_slot": from_state.name if isinstance(from_state, Slot) else None,
    }


def _advance_run_head(run: Run, event: Event, run_updates: dict[str, Any]) -> None:
    """Move the run's chain head from ``event.prev_hash`` to ``event.hash``; when the head was
    elsewhere (the instance was stale), link ``event`` to the actual head, read under the row lock."""
    stored = "" if event.prev_hash == GENESIS else event.prev_hash
    if Run.objects.filter(pk=run.pk, audit_head=stored).update(audit_head=event.hash, **run_updates) != 1:
        # Lock first, then read: the head cannot move again before this transaction ends.
        current = (
            Run.objects.select_for_update(no_key=True).filter(pk=run.pk).values_list("audit_head", flat=True)
        )
        head = current.first()
        if head is None:
            raise Run.DoesNotExist(f"Run {run.pk} does not exist.")
        event.prev_hash = head or GENESIS
        event.hash = _event_digest(event.prev_hash, _hashed_fields(event))
        Run.objects.filter(pk=run.pk).update(audit_head=event.hash, **run_updates)
    run.audit_head = event.hash
    for name, value in run_updates.items():
        setattr(run, name, value)


def _jsonb_number(text: str) -> int | float:
    # jsonb keeps numbers as NUMERIC: "1e+16" comes back as 10000000000000000, which Python reads
    # as an int. Decode exponent-form integers the same way here, or such an event would fail
    # verification as "tampered" the moment it is read back.
    number = Decimal(text)
    # json calls this for finite numbers only (NaN and infinities go to parse_constant), whose
    # exponent is an int; the letters 'n', 'N', 'F' mark only those special values.
    exponent = number.as_tuple().exponent
    return int(number) if isinstance(exponent, int) and exponent >= 0 else float(text)


def _roundtrip(value: Any) -> Any:
    """``value`` as it will come back from a jsonb column. NaN and infinities, which jsonb refuses,
    are kept as strings so that recording an event never fails on them."""
    return json.loads(canonical_json(value), parse_float=_jsonb_number, parse_constant=str)


@dataclass(frozen=True)
class TruncatedChain:
    """A chain that no longer ends where its owner row (run or tenant) says: its newest events
    are gone."""

    chain: str  # run:<id> or tenant:<pk>
    head: str  # the hash the owner row says the chain's newest event has
    last_event_id: int | None  # the newest event still there (None: none left)

    @property
    def run_id(self) -> str | None:
        return self.chain.removeprefix("run:") if self.chain.startswith("run:") else None


@dataclass(frozen=True)
class BrokenLink:
    chain: str
    event_id: int
    problem: str


def link_problem(event: Event, prev_hash: str) -> str:
    """Why ``event`` is not the next link after ``prev_hash`` ("" when it is)."""
    if event.prev_hash != prev_hash:
        return "prev_hash does not match the previous event's hash"
    if event.hash != _event_digest(prev_hash, _hashed_fields(event)):
        return "the event's content does not match its hash"
    return ""


# Events read a statement at a time by audit_verify.
_PAGE = 2000


def _in_chain_order(events: QuerySet[Event]) -> Iterator[Event]:
    """``events`` (ordered by chain desc, id), a page of ``_PAGE`` a statement, each page starting
    after the last event of the one before (keyset: the rest of that chain, then the chains below
    it, each an index range scan). Not ``QuerySet.iterator()``: its server-side cursor does not
    survive PgBouncer's transaction pooling between two fetches, and with server-side cursors off
    (SAGA_DB_POOLER=transaction) it would read every event into memory at once."""
    page = list(events[:_PAGE])
    while page:
        yield from page
        last = page[-1]
        page = list(events.filter(chain=last.chain, id__gt=last.id)[:_PAGE])
        if len(page) < _PAGE:
            page += list(events.filter(chain__lt=last.chain)[: _PAGE - len(page)])


def audit_verify(
    *,
    chain: str | None = None,
    events: QuerySet[Event] | None = None,
    on_event: Callable[[Event, int], None] | None = None,
) -> tuple[int, BrokenLink | None]:
    """Walk every chain (or one) in id order; return (events checked, first broken link).

    One pass over (chain desc, id) — a backward scan of ``event_chain_latest``, read a page at a
    time (``_in_chain_order``) — rather than a query per chain: there is a chain per run, and the
    ledger has millions of runs. After
    a chain's first break the rest of that chain is skipped (every later link is suspect), and the
    break with the lowest event id across chains is reported.

    ``events``: the events to walk (an annotated queryset; default all); ``on_event(event,
    position)`` is told each event that links up, with its 1-based position in its chain
    (``ledger.audit_signing`` checks the signed heads in the same pass).
    """
    checked = 0
    first_broken: BrokenLink | None = None
    events = (events if events is not None else Event.objects.all()).order_by("-chain", "id")
    if chain:
        events = events.filter(chain=chain)
    current_chain, prev_hash, skipping, position = None, GENESIS, False, 0
    for event in _in_chain_order(events):
        if event.chain != current_chain:
            current_chain, prev_hash, skipping, position = event.chain, GENESIS, False, 0
        if skipping:
            continue
        checked += 1
        problem = link_problem(event, prev_hash)
        if problem:
            broken = BrokenLink(event.chain, event.id, problem)
        else:
            prev_hash = event.hash
            position += 1
            if on_event is not None:
                on_event(event, position)
            continue
        if first_broken is None or broken.event_id < first_broken.event_id:
            first_broken = broken
        skipping = True
    return checked, first_broken


# Each chain's owner row (a run, or a tenant for its run-less events) records the hash its chain
# ends at; a chain whose newest event is not that hash lost its newest events.
_TRUNCATED_CHAINS_SQL = """
    SELECT owner.chain, owner.audit_head, latest.id
    FROM (
        SELECT 'run:' || r.id AS chain, r.audit_head FROM ledger_run r {only_run}
        UNION ALL
        SELECT 'tenant:' || t.id, t.audit_head FROM ledger_tenant t {only_tenant}
    ) owner
    LEFT JOIN LATERAL (
        SELECT e.id, e.hash FROM ledger_event e
        WHERE e.chain = owner.chain ORDER BY e.id DESC LIMIT 1
    ) latest ON TRUE
    WHERE owner.audit_head IS DISTINCT FROM COALESCE(latest.hash, '')
    ORDER BY owner.chain
    LIMIT %s
"""


def audit_heads_verify(*, chain: str | None = None, limit: int = 100) -> list[TruncatedChain]:
    """Chains whose newest audit events were deleted (at most ``limit``, by chain name).

    A deleted event in the middle of a chain breaks the next event's link (``audit_verify``), but
    deleting a chain's newest events leaves a shorter chain that links up perfectly. The chain's
    owner row keeps its head (``Run.audit_head``, ``Tenant.audit_head``, moved in the same
    transaction as every event), so the chain must end at exactly that hash. One index probe
    (``event_chain_latest``) per run and tenant.
    """
    kind, _, ident = (chain or "").partition(":")
    only_run = "WHERE r.id = %s" if kind == "run" else ("WHERE FALSE" if chain else "")
    only_tenant = "WHERE t.id::text = %s" if kind == "tenant" else ("WHERE FALSE" if chain else "")
    with connection.cursor() as cursor:
        # The SQL is constant text: only the filters above (constants too) are spliced in.
        cursor.execute(
            _TRUNCATED_CHAINS_SQL.format(only_run=only_run, only_tenant=only_tenant),
            [*([ident] if chain else []), limit],
        )
        return [TruncatedChain(chain=row[0], head=row[1], last_event_id=row[2]) for row in cursor.fetchall()]
