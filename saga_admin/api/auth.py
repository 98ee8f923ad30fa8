"""Pieces every API router shares: the error schema, the key authentication and its scopes."""

from __future__ import annotations

import re
from typing import Any

import structlog
from django.http import HttpRequest
from ninja import Schema
from ninja.security import HttpBearer

from ledger import errors
from ledger.models import AgentKey
from ledger.services.keys import agent_key_authenticate


class ErrorBody(Schema):
    code: str
    message: str
    details: dict[str, Any] = {}


class ErrorOut(Schema):
    error: ErrorBody


# The error responses every authenticated operation may return; operations add their own (409).
# 400/413/415 come from the body checks in saga_admin.api.limits, 429 from the throttle, and 500 is
# documented because a generated client should know its shape (it carries the request id).
AUTH_ERRORS: dict[int, type[Schema]] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    413: ErrorOut,
    415: ErrorOut,
    422: ErrorOut,
    429: ErrorOut,
    500: ErrorOut,
}

# A bearer token we would even look up: the key format is ``sk_<hex>_<urlsafe>``. Anything else
# (too long, NUL bytes, non-ASCII) is a 401 without touching the database.
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_\-]{1,200}$")


class KeyAuth(HttpBearer):
    """Bearer API key with a required scope. A missing, unknown or revoked key is a 401; a valid
    key without the scope is a 403."""

    def __init__(self, scope: str) -> None:
        super().__init__()
        self.scope = scope

    def authenticate(self, request: HttpRequest, token: str) -> AgentKey | None:
        if not _TOKEN_RE.match(token.strip()):
            return None
        key = agent_key_authenticate(raw_key=token)
        if key is None:
            return None
        if self.scope not in key.scopes:
            raise errors.Forbidden(
                f"This API key lacks the '{self.scope}' scope.", details={"scope": self.scope}
            )
        structlog.contextvars.bind_contextvars(tenant=key.tenant.slug, key=key.prefix)
        return key


agent_auth = KeyAuth("agent")
operator_auth = KeyAuth("operator")
