"""What the schema modules share: the strict input base, the decision body, the field types.

Input schemas are strict: an unknown field is an error (it is almost always a typo in agent
code that would otherwise be silently dropped), and nothing is coerced (``"5"`` is not 5,
``"true"`` is not True). Every string has a length limit. Output schemas are built from the
models (``Out``: ``XOut.from_orm(obj)``; the agents' ``*_out`` helpers) so the API, the
idempotency store and the tests all see the same JSON.
"""

from __future__ import annotations

from typing import Annotated, Any, Self
from urllib.parse import urlsplit

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


def fields_of(obj: Any, schema: type[Schema]) -> dict[str, Any]:
    """The model attributes a schema names (relations and computed fields are added by callers)."""
    return {
        name: getattr(obj, name)
        for name in schema.model_fields
        if hasattr(type(obj), name) or name in vars(obj)
    }


class Out(Schema):
    """An output schema read from a model: ``XOut.from_orm(obj)`` takes each field from ``obj``'s
    attribute of that name, or from the schema's ``resolve_<field>(obj)`` for what the model does
    not hold as it is shown (ninja's resolvers). Given a dict (``XOut(**fields)``) it takes the
    fields as they are, and an instance it keeps: ninja checks what a view returns against the
    response schema, and an output already built is not read again through its resolvers."""

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(
        cls, values: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Any:
        if isinstance(values, cls | dict):
            return handler(values)
        return handler(DjangoGetter(values, cls, info.context))
