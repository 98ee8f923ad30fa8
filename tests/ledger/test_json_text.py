"""``infra.json_text``: the ledger's jsonb columns spelled and read by orjson, never less exact
than Django's own field (the standard library) — an integer beyond 64 bits, a dict with non-string
keys, text that merely looks numeric — and the same value PostgreSQL stores either way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

from infra import json_text
from ledger.audit import Actor
from ledger.models import Action, Run
from recovery.models import Approval
from tests.factories import make_run, record

pytestmark = pytest.mark.django_db

AWKWARD: list[Any] = [
    2**64,
    2**64 - 1,
    -(2**63) - 1,
    10**30,
    -(10**40),
    {"n": 123456789012345678901234567890, "s": "1234567890123456789012"},
    [1.5, 0.1, 1e-7, 1e300, -0.0, 0, True, None],
    "unicode: Ashu Kūmar — 日本語 🙂 \u2028",
    {"nested": [{"k": [2**70]}]},
]


@pytest.mark.parametrize("value", AWKWARD, ids=repr)
def test_it_reads_back_what_the_standard_library_would(value: Any) -> None:
    """Pass: every value round-trips through the text exactly as through the standard library
    (integers stay integers of the same value, floats floats)."""
    text = json_text.Encoder().encode(value)
    assert json_text.loads(text) == json.loads(json.dumps(value))
    assert json.loads(text, cls=json_text.Decoder) == json.loads(json.dumps(value))
    assert repr(json_text.loads(text)) == repr(json.loads(json.dumps(value)))


def test_it_spells_what_orjson_refuses_with_the_standard_library() -> None:
    """Pass: non-string keys and integers orjson cannot write are written as Django's field would."""
    assert json.loads(json_text.Encoder().encode({1: 2**65})) == {"1": 2**65}
    assert json.dumps({1: 2}, cls=json_text.Encoder) == json.dumps({1: 2})


def test_invalid_text_is_a_json_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        json_text.loads("{not json")
    with pytest.raises(json.JSONDecodeError):
        json_text.loads("[" + "1" * 30 + ",")


def _column_text(table: str, column: str, pk: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column}::text FROM {table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("value", AWKWARD, ids=repr)
def test_the_columns_read_what_the_standard_library_reads(value: Any, tenant: Any) -> None:
    """Pass: an action's args, snapshots and result, a run's metadata and an approval's args come
    back from PostgreSQL as the standard library reads the column's text (Django's own field),
    in Python's own types: no integer turned into a float, none rounded."""
    actor = Actor.system("tests")
    run = make_run(tenant, actor)
    action = record(run, actor, "k", tool="crm.update_contact", args={"v": value})
    Action.objects.filter(pk=action.pk).update(before_snapshot={"v": value}, result={"v": value})
    Run.objects.filter(pk=run.pk).update(metadata={"v": value})
    fresh = Action.objects.get(pk=action.pk)
    approval = Approval.objects.create(
        kind="action",
        action=fresh,
        run=run,
        tenant=tenant,
        risk="high",
        tool=fresh.tool,
        args={"v": value},
        args_hash="x" * 64,
        expires_at=fresh.created_at,
    )
    read = {
        ("ledger_action", "args", action.pk): fresh.args,
        ("ledger_action", "before_snapshot", action.pk): fresh.before_snapshot,
        ("ledger_action", "result", action.pk): fresh.result,
        ("ledger_run", "metadata", run.pk): Run.objects.get(pk=run.pk).metadata,
        ("recovery_approval", "args", approval.pk): Approval.objects.get(pk=approval.pk).args,
    }
    for (table, column, pk), got in read.items():
        assert repr(got) == repr(json.loads(_column_text(table, column, pk))), (table, column)
    if not isinstance(value, list):  # floats PostgreSQL spells its own way
        assert repr(fresh.args) == repr({"v": json.loads(json.dumps(value))})


def test_postgres_stores_the_same_jsonb_as_with_the_standard_library(tenant: Any) -> None:
    """Pass: the jsonb PostgreSQL holds is the one the standard library's text gives it."""
    value = {"b": [1, 2**64, 1.5, "x\u0001"], "a": {"z": None, "y": True}}
    actor = Actor.system("tests")
    action = record(make_run(tenant, actor), actor, "k", tool="crm.update_contact", args=value)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT args = %s::jsonb FROM ledger_action WHERE id = %s", [json.dumps(value), action.pk]
        )
        assert cursor.fetchone() == (True,)


def test_the_field_deconstructs_to_itself_without_its_defaults() -> None:
    """Pass: migrations name the ledger's field and no encoder or decoder (the field's own), so a
    model's columns can change spelling without a migration per column."""
    _, path, _, kwargs = Action._meta.get_field("args").deconstruct()
    assert path == "infra.json_text.JSONField"
    assert "encoder" not in kwargs and "decoder" not in kwargs
