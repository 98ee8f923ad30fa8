"""A model instance from ``to_jsonb`` of its row, as if the ORM had read it: what the ledger's
one-statement writes answer (``ledger.services.writes``) and the API's one-statement reads
(``saga_admin.api.reads``) select. A jsonb column arrives decoded, a timestamp as ISO text."""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import DateTimeField, Field, JSONField, Model
from django.utils.dateparse import parse_datetime

M = TypeVar("M", bound=Model)


@cache
def _fields(model: type[Model]) -> list[tuple[Field[Any, Any], str, str]]:
    """Each concrete field with its column and attribute name, and how its JSON value is read."""
    out = []
    for field in model._meta.concrete_fields:
        kind = (
            "datetime" if isinstance(field, DateTimeField) else "json" if isinstance(field, JSONField) else ""
        )
        out.append((field, field.column or field.attname, kind))
    return out


def model_from_row(model: type[M], row: dict[str, Any]) -> M:
    values: dict[str, Any] = {}
    for field, column, kind in _fields(model):
        value = row.get(column)
        if kind == "datetime":
            value = parse_datetime(value) if isinstance(value, str) else value
        elif kind != "json" and value is not None:
            value = field.to_python(value)
        values[field.attname] = value
    instance = model(**values)
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance
