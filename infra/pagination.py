"""Keyset pagination, the one paginator of the API and the dashboard.

A page is the rows after the cursor in a total order (the last key is always the unique id), one
more row fetched than shown to know whether another page follows: no OFFSET, no COUNT over a big
table, and pages stay stable while new rows arrive. The cursor is opaque to clients: base64 of the
last shown row's key values. A cursor we did not hand out — anything a client can put in it, an
impossible date or a NUL in an id included — never reaches the database: the API refuses it (422)
and the dashboard shows the first page instead.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any, Generic, TypeVar

from django.db.models import F, Model, Q, QuerySet
from django.db.models.fields.tuple_lookups import Tuple, TupleGreaterThan, TupleLessThan
from django.db.models.lookups import Lookup
from django.utils.dateparse import parse_datetime

from infra import errors
from infra.ids import looks_like_id

M = TypeVar("M", bound=Model)

# (field, descending). Supported fields: ``*_at`` (datetimes), ``id`` (our prefixed ids) and
# integer annotations (a rank).
Key = tuple[str, bool]
NEWEST_FIRST: tuple[Key, ...] = (("created_at", True), ("id", True))
OLDEST_FIRST: tuple[Key, ...] = (("created_at", False), ("id", False))


# Longer than any cursor we hand out (a few keys: a date and an id), short enough to decode cheaply.
MAX_CURSOR_LENGTH = 300


@dataclass(frozen=True)
class Page(Generic[M]):
    items: list[M]
    next_cursor: str | None


def _encode_cursor(values: Sequence[Any]) -> str:
    raw = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_value(name: str, value: Any) -> tuple[bool, Any]:
    if name.endswith("_at"):
        try:
            parsed = parse_datetime(value) if isinstance(value, str) else None
        except ValueError:  # well-formed but impossible: month 13, offset +99:00
            parsed = None
        return parsed is not None, parsed
    if name == "id":
        return looks_like_id(value), value
    return isinstance(value, int) and not isinstance(value, bool), value


def _decode_cursor(cursor: str, keys: Sequence[Key]) -> list[Any] | None:
    """The cursor's values, or None when it is not one we handed out for ``keys``."""
    if len(cursor) > MAX_CURSOR_LENGTH:
        return None
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError):
        # RecursionError: "[[[[…" nested deeper than the JSON parser's stack, from a client.
        return None
    if not isinstance(values, list) or len(values) != len(keys):
        return None
    decoded: list[Any] = []
    for (name, _descending), value in zip(keys, values, strict=True):
        ok, parsed = _decode_value(name, value)
        if not ok:
            return None
        decoded.append(parsed)
    return decoded


def _after_cursor(keys: Sequence[Key], values: Sequence[Any]) -> Q | Lookup:
    """Rows strictly after ``values`` in the order ``keys``."""
    if len({descending for _name, descending in keys}) == 1:
        # One direction: a row comparison `(opened_at, id) < (…, …)`, which PostgreSQL answers
        # with one range scan of an index on those columns; the OR of comparisons below it reads
        # as a filter over every row before the cursor.
        lookup = TupleLessThan if keys[0][1] else TupleGreaterThan
        return lookup(Tuple(*(F(name) for name, _desc in keys)), tuple(values))
    condition = Q()
    for i, (name, descending) in enumerate(keys):
        step = Q(**{f"{name}__{'lt' if descending else 'gt'}": values[i]})
        for j in range(i):
            step &= Q(**{keys[j][0]: values[j]})
        condition = step if i == 0 else condition | step
    return condition


def cursor_values(cursor: str, keys: Sequence[Key]) -> list[Any]:
    """The values of a cursor this API handed out for ``keys``; any other is a
    ``ValidationFailed`` (422), before anything reaches the database. For a read that writes its
    own SQL (``saga_admin.api.reads``); ``keyset_page`` does the same for a queryset."""
    values = _decode_cursor(cursor, keys)
    if values is None:
        raise errors.ValidationFailed(
            "The cursor is not one this API handed out.", details={"cursor": "invalid"}
        )
    return values


def cursor_after(values: Sequence[Any]) -> str:
    """The cursor of the page after the row whose key values are ``values``."""
    return _encode_cursor(values)


def keyset_page(
    queryset: QuerySet[M], *, keys: Sequence[Key], cursor: str | None, limit: int, strict: bool = True
) -> Page[M]:
    """One page of ``queryset`` in the order ``keys``, after ``cursor``. ``strict``: a cursor we
    did not hand out is a ``ValidationFailed`` (the API); otherwise the first page (the
    dashboard, whose links a person may have edited)."""
    queryset = queryset.order_by(*[f"-{name}" if descending else name for name, descending in keys])
    if cursor:
        values = _decode_cursor(cursor, keys)
        if values is None:
            if strict:
                cursor_values(cursor, keys)  # raises: the one refusal of a cursor
        else:
            queryset = queryset.filter(_after_cursor(keys, values))
    rows = list(queryset[: limit + 1])
    if len(rows) <= limit:
        return Page(items=rows, next_cursor=None)
    rows = rows[:limit]
    return Page(items=rows, next_cursor=_encode_cursor([getattr(rows[-1], name) for name, _ in keys]))


def merged_keyset_page(
    querysets: Sequence[QuerySet[M]],
    *,
    keys: Sequence[Key],
    cursor: str | None,
    limit: int,
    strict: bool = True,
) -> Page[M]:
    """One page of the union of ``querysets`` (each a slice of the same rows, none shared: one per
    tenant) in the order ``keys``, after ``cursor``: a page of each, merged. Each reads at most
    ``limit + 1`` rows through its own index, so a slice with many newer rows (a busy tenant) costs
    the others nothing, where one scan of the whole order would filter its way through them."""
    if len(querysets) == 1:
        return keyset_page(querysets[0], keys=keys, cursor=cursor, limit=limit, strict=strict)
    rows: list[M] = []
    more = False
    for queryset in querysets:
        page = keyset_page(queryset, keys=keys, cursor=cursor, limit=limit, strict=strict)
        rows.extend(page.items)
        more = more or page.next_cursor is not None
    for name, descending in reversed(keys):  # stable sorts, least significant key first
        rows.sort(key=attrgetter(name), reverse=descending)
    if len(rows) <= limit and not more:
        return Page(items=rows, next_cursor=None)
    rows = rows[:limit]
    return Page(items=rows, next_cursor=_encode_cursor([getattr(rows[-1], name) for name, _ in keys]))
