"""The database side of the ledger's hot writes: one call of a server-side function per write
(``ledger/sql``: ``saga_action_record``, ``saga_action_move``), and the row it answers read back
into a model instance. The rules stay in ``ledger.services.actions`` (``recording``, ``moves``),
which build what the functions insert and pass the sets of states each rule allows; this module
only carries it.

Outside a transaction the call is its own: one round trip, committed by the server (autocommit).
Inside a caller's transaction it is one statement of that transaction.
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson
from django.db import connection

from infra import json_text, metrics
from ledger.models import Action
from ledger.rows import model_from_row

# The functions a write may call: a constant set, never a name from input.
FUNCTIONS = frozenset({"saga_action_record", "saga_action_move"})


def call(function: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``function(payload)``: its answer (``outcome`` and what goes with it)."""
    if function not in FUNCTIONS:
        raise ValueError(f"not a ledger write function: {function}")
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s::jsonb)", [_encode(payload)])
        row = cursor.fetchone()
    value = row[0] if row else None
    answer = _decode(value) if isinstance(value, str | bytes) else value
    if not isinstance(answer, dict):
        raise RuntimeError(f"{function} answered {answer!r}")
    metrics.ledger_write_observed(function, answer.get("outcome"), started)
    return answer


def _encode(payload: dict[str, Any]) -> str:
    """The payload as JSON text. orjson, which writes an ``orjson.Fragment`` (args already encoded
    by the caller) as it is; the standard library for what orjson does not take (an integer beyond
    64 bits in a snapshot). Either way PostgreSQL stores the same jsonb value the ORM's
    ``json.dumps`` would have given it."""
    try:
        return orjson.dumps(payload).decode()
    except orjson.JSONEncodeError:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=_fragment_value)


def _decode(value: str | bytes) -> Any:
    """The function's answer (the action's row, args and all, for a move or a replay), decoded by
    orjson unless it may hold an integer beyond 64 bits (``infra.json_text.loads``)."""
    return json_text.loads(value)


def _fragment_value(value: Any) -> Any:
    if isinstance(value, orjson.Fragment):
        return json.loads(orjson.dumps(value))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def action_from_row(row: dict[str, Any]) -> Action:
    """An Action built from a function's ``to_jsonb`` of its row, as if the ORM had read it."""
    return model_from_row(Action, row)
