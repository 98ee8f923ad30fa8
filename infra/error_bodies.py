"""The one shape of an error answer, ``{"error": {"code", "message", "details"}}``: its schema (what
the OpenAPI document names ``ErrorOut``) and the one function that builds it.

Every JSON refusal says it this way, whoever answers: the API's handlers, the API gate in front of
them, and the dashboard's JSON endpoints (Slack's). Each renders the body with its own encoder;
only the body is built here.
"""

from __future__ import annotations

from typing import Any

from ninja import Schema


class ErrorBody(Schema):
    code: str
    message: str
    details: dict[str, Any] = {}


class ErrorOut(Schema):
    error: ErrorBody


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The error answer's body: ``code`` (stable, for machines), ``message`` (for people) and
    ``details`` (always an object, empty when there is nothing more to say)."""
    return {"error": {"code": code, "message": message, "details": details or {}}}
