"""One specification of the audit event's hash (``clients/spec/vectors/audit_events.json``), held
by both of its writers and both of its verifiers: Python's ``audit_record``, the database's
``saga_event_insert`` (given what ``event_template`` builds, as the hot writes give it), and the
checks that read the log back: ``audit_verify``'s ``link_problem`` and the archive's offline chain
check. Each must give every vector's exact hash; an edited event must fail both verifiers."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import connection, transaction

from infra.hashing import canonical_json
from ledger.archive.format import ArchiveReport, _ChainCheck
from ledger.audit import GENESIS, Actor, _hashed_fields, audit_record, event_template, link_problem, slot
from ledger.models import Event, Run, Tenant

VECTORS_FILE = Path(__file__).resolve().parents[2] / "clients" / "spec" / "vectors" / "audit_events.json"
SPEC = json.loads(VECTORS_FILE.read_text("utf-8"))
VECTORS = SPEC["events"]
BY_SQL = [v for v in VECTORS if "saga_event_insert" in v["writers"]]
BY_PYTHON = [v for v in VECTORS if "audit_record" in v["writers"]]


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


def _actor(event: dict[str, Any]) -> Actor:
    return Actor(type=event["actor_type"], id=event["actor_id"], label=event["actor_label"])


def _event(vector: dict[str, Any], **changed: Any) -> Event:
    """The vector's event as the log stores it (what verification reads back)."""
    fields = {**vector["event"], **changed}
    return Event(
        id=1,
        tenant_id=fields["tenant"],
        run_id=fields["run"],
        chain=fields["chain"],
        kind=fields["kind"],
        subject_type=fields["subject_type"],
        subject_id=fields["subject_id"],
        from_state=fields["from_state"],
        to_state=fields["to_state"],
        actor_type=fields["actor_type"],
        actor_id=fields["actor_id"],
        actor_label=fields["actor_label"],
        reason=fields["reason"],
        data=fields["data"],
        created_at=datetime.fromisoformat(fields["created_at"]),
        prev_hash=vector["prev_hash"],
        hash=vector["hash"],
    )


def _archive_row(vector: dict[str, Any], **changed: Any) -> dict[str, Any]:
    """The vector's event as a line of an archive's records file carries it."""
    fields = {**vector["event"], **changed}
    row = {k: v for k, v in fields.items() if k not in ("tenant", "run")}
    return {
        **row,
        "id": 1,
        "tenant_id": fields["tenant"],
        "run_id": fields["run"],
        "prev_hash": vector["prev_hash"],
        "hash": vector["hash"],
    }


def _archive_check(vector: dict[str, Any], row: dict[str, Any]) -> tuple[list[str], str]:
    report = ArchiveReport(where="vectors")
    check = _ChainCheck(vector["event"]["chain"], report)
    check.prev = vector["prev_hash"]
    check.event(row, 1)
    return report.problems, check.prev


@pytest.fixture
def vector_world(db) -> dict[str, Any]:
    """The vectors' tenant and run, so their events can be stored (an event names both)."""
    events = [v["event"] for v in VECTORS]
    tenant = Tenant.objects.create(id=events[0]["tenant"], slug="vectors", name="Vectors")
    runs = {
        e["run"]: Run.objects.create(id=e["run"], tenant=tenant, agent="vectors", request="vectors")
        for e in {e["run"]: e for e in events if e["run"]}.values()
    }
    return {"tenant": tenant, "runs": runs}


def _stored(event_hash: str) -> dict[str, Any]:
    """The hashed fields of the event stored with this hash, read back as verification reads them."""
    return _hashed_fields(Event.objects.get(hash=event_hash))


def test_every_vector_is_what_its_description_says():
    """The file itself: each hash is SHA-256 of prev + "." + canonical, canonical the event's JSON."""
    assert len({v["hash"] for v in VECTORS}) == len(VECTORS) > 0
    assert BY_SQL and BY_PYTHON
    for vector in VECTORS:
        text = json.dumps(vector["event"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert vector["canonical"] == text, vector["name"]
        digest = hashlib.sha256(f"{vector['prev_hash']}.{text}".encode()).hexdigest()
        assert vector["hash"] == digest, vector["name"]


@pytest.mark.parametrize("vector", VECTORS, ids=_ids(VECTORS))
def test_the_python_verifiers_give_the_vectors_hash(vector):
    event = _event(vector)
    assert canonical_json(_hashed_fields(event)) == vector["canonical"]
    assert link_problem(event, vector["prev_hash"]) == ""
    assert _archive_check(vector, _archive_row(vector)) == ([], vector["hash"])


@pytest.mark.parametrize("vector", VECTORS, ids=_ids(VECTORS))
def test_the_python_verifiers_refuse_an_edited_event(vector):
    edited = {"reason": vector["event"]["reason"] + "."}
    assert link_problem(_event(vector, **edited), vector["prev_hash"]) == (
        "the event's content does not match its hash"
    )
    assert _archive_check(vector, _archive_row(vector, **edited)) == (
        ["line 1: event 1: its content does not match its hash"],
        vector["prev_hash"],
    )
    assert link_problem(_event(vector), "f" * 64) == "prev_hash does not match the previous event's hash"


@pytest.mark.parametrize("vector", BY_PYTHON, ids=_ids(BY_PYTHON))
def test_audit_record_writes_the_vectors_hash(vector_world, vector):
    event = vector["event"]
    run = vector_world["runs"].get(event["run"])
    if run is None:
        # A tenant's chain links to its latest event: the vector is its first.
        assert vector["prev_hash"] == GENESIS
        assert not Event.objects.filter(chain=event["chain"]).exists()
    else:
        head = "" if vector["prev_hash"] == GENESIS else vector["prev_hash"]
        Run.objects.filter(pk=run.pk).update(audit_head=head)
        run.audit_head = head
    with (
        transaction.atomic(),
        mock.patch("ledger.audit.timezone.now", return_value=datetime.fromisoformat(event["created_at"])),
    ):
        written = audit_record(
            tenant=vector_world["tenant"],
            actor=_actor(event),
            kind=event["kind"],
            subject=f"{event['subject_type']}:{event['subject_id']}",
            run=run,
            from_state=event["from_state"],
            to_state=event["to_state"],
            reason=event["reason"],
            data=event["data"],
        )
        assert (written.prev_hash, written.hash) == (vector["prev_hash"], vector["hash"])
        assert _stored(written.hash) == event
        transaction.set_rollback(True)


def _template(vector: dict[str, Any]) -> dict[str, Any]:
    """What a hot write hands ``saga_event_insert`` for the vector's event: its slots left open."""
    event, slots = vector["event"], vector.get("slots", {})
    if "run" in slots:
        # event_template's own names for the run and chain of the action a write moves.
        assert (slots["run"], slots["chain"]) == ("run", "chain")
    data = {k: slot(slots[f"data.{k}"]) if f"data.{k}" in slots else v for k, v in event["data"].items()}
    return event_template(
        tenant_id=event["tenant"],
        run_id=None if "run" in slots else event["run"],
        actor=_actor(event),
        kind=event["kind"],
        subject_type=event["subject_type"],
        subject_id=event["subject_id"],
        to_state=event["to_state"],
        from_state=slot(slots["from_state"]) if "from_state" in slots else event["from_state"],
        reason=event["reason"],
        data=data,
        created_at=datetime.fromisoformat(event["created_at"]),
    )


@pytest.mark.parametrize("vector", BY_SQL, ids=_ids(BY_SQL))
def test_saga_event_insert_writes_the_vectors_hash(vector_world, vector):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT saga_event_insert(%s::jsonb, %s, %s::jsonb)",
            [
                json.dumps(_template(vector)),
                vector["prev_hash"],
                json.dumps(vector.get("database_values", {})),
            ],
        )
        assert cursor.fetchone()[0] == vector["hash"]
        assert _stored(vector["hash"]) == vector["event"]
        assert link_problem(Event.objects.get(hash=vector["hash"]), vector["prev_hash"]) == ""
        transaction.set_rollback(True)
