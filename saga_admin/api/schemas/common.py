"""What the schema modules share: the strict input base, the decision body, the field types.

Input schemas are strict: an unknown field is an error (it is almost always a typo in agent
code that would otherwise be silently dropped), and nothing is coerced (``"5"`` is not 5,
``"true"`` is not True). Every string has a length limit. Output schemas are read from the
models' attributes, one way for every response (``Out``: ``XOut.from_orm(obj)``, with a
resolver for what the model does not hold as it is shown), so the API, the idempotency store and
the tests all see the same JSON.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Annotated, Any, ClassVar, Self
from urllib.parse import urlsplit

from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from ninja import Schema
from ninja.schema import DjangoGetter
from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, model_validator
from pydantic.functional_validators import ModelWrapValidatorHandler

from ledger.rules import REASON_MAX_LENGTH
from ledger.tool_names import TOOL_NAME_MAX_LENGTH, TOOL_NAME_PATTERN, TOOL_NAME_RULE

# Free-form JSON the ledger stores as-is (args, snapshots, results, state). Its size and depth are
# bounded by the body limits in saga_admin.api.limits.
JSONValue = Any
JSONObject = dict[str, Any]


def _http_url(value: str) -> str:
    if value:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http(s) URL")
    return value


HttpUrlStr = Annotated[str, Field(max_length=2000), AfterValidator(_http_url)]
ActionId = Annotated[str, Field(min_length=1, max_length=40)]
# The one tool-name rule (ledger.tool_names); the services apply it too, for every other path.
ToolName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=TOOL_NAME_MAX_LENGTH,
        pattern=TOOL_NAME_PATTERN,
        description=f"A tool name: {TOOL_NAME_RULE}.",
    ),
]


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReasonIn(StrictIn):
    reason: str = Field(
        ..., min_length=1, max_length=REASON_MAX_LENGTH, description="Why; kept in the audit log."
    )


class Out(Schema):
    """An output schema read from a model: ``XOut.from_orm(obj)`` takes each field from ``obj``'s
    attribute of that name, or from the schema's ``resolve_<field>(obj)`` for what the model does
    not hold as it is shown (ninja's resolvers). Given a dict (``XOut(**fields)``) it takes the
    fields as they are, and an instance it keeps: ninja checks what a view returns against the
    response schema, and an output already built is not read again through its resolvers: a view
    that returns one (or a body of them) is validated once, when it is built.

    A resolver that takes ``context`` gets the validation's: what a caller hands on beside the
    model (``XOut.model_validate(obj, context=...)``), as an action's approval."""

    # Fields that hold an agent's free-form JSON: JSON already (parsed from a request, or read
    # from a jsonb column), so ``json_ready`` hands them on as they are instead of converting
    # every value of up to a megabyte.
    AS_IS: ClassVar[frozenset[str]] = frozenset()

    def json_ready(self) -> dict[str, Any]:
        """The output as JSON values (``model_dump(mode="json")``, in the fields' order), for a
        body rendered or stored without ninja's response pass (``json_response``, the
        idempotency store); the ``AS_IS`` fields as they are."""
        as_is = type(self).AS_IS
        if not as_is:
            return self.model_dump(mode="json")
        out = self.model_dump(mode="json", exclude=set(as_is))
        return {name: getattr(self, name) if name in as_is else out[name] for name in type(self).model_fields}

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(
        cls, values: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Any:
        if isinstance(values, cls | dict):
            return handler(values)
        return handler(_attributes(values, cls, info.context))


# The descriptors of a model's plain concrete fields: reading one is reading the instance's
# ``__dict__`` (once loaded), and its value is a column's (never a manager, a queryset, a file or
# a callable, which ninja's getter would convert).
_PLAIN = (DeferredAttribute, ForeignKeyDeferredAttribute)


# Per (schema, model class): each field's name, and whether an instance holds it in its
# ``__dict__`` as it is shown (no resolver, a plain field's descriptor).
_READING: dict[tuple[type[Out], type[object]], tuple[tuple[str, bool], ...]] = {}


def _reading(schema: type[Out], kind: type[object]) -> tuple[tuple[str, bool], ...]:
    reading = _READING.get((schema, kind))
    if reading is None:
        resolvers = schema._ninja_resolvers
        reading = tuple(
            (name, name not in resolvers and type(getattr(kind, name, None)) in _PLAIN)
            for name in schema.model_fields
        )
        _READING[(schema, kind)] = reading
    return reading


def _attributes(obj: Any, schema: type[Out], context: Any) -> dict[str, Any]:
    """What ``schema`` reads of ``obj``, as ninja's getter (``DjangoGetter``) reads it: a
    resolver's answer, else the attribute, converted; a field it cannot read is left out (its
    default). A plain field is taken from the instance's ``__dict__`` at once: the getter's
    attribute lookup and conversions, per field and per action, were most of a read's cost."""
    getter = DjangoGetter(obj, schema, context)
    stored = getattr(obj, "__dict__", {})
    data = {}
    for name, plain in _reading(schema, type(obj)):
        if plain and name in stored:
            data[name] = stored[name]
            continue
        with suppress(AttributeError):
            data[name] = getattr(getter, name)
    return data
