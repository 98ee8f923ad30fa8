"""What the schema modules share: the strict input base, the decision body, the field types.

Input schemas are strict: an unknown field is an error (it is almost always a typo in agent
code that would otherwise be silently dropped), and nothing is coerced (``"5"`` is not 5,
``"true"`` is not True). Every string has a length limit. Output schemas are built from the
models with ``from_*`` helpers so the API, the idempotency store and the tests all see the same
JSON.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field

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
