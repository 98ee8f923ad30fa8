"""Pieces every API router shares: the error responses, the key authentication and its scopes."""

from __future__ import annotations

import structlog
from django.http import HttpRequest
from ninja import Schema
from ninja.security import HttpBearer

from infra import errors
from infra.error_bodies import ErrorOut
from ledger.models import AgentKey
from saga_admin.api.limits import request_key

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


class KeyAuth(HttpBearer):
    """Bearer API key holding at least one of ``scopes``. A missing, unknown or revoked key is a
    401; a valid key without any of them is a 403 naming what it lacks."""

    def __init__(self, *scopes: str) -> None:
        super().__init__()
        self.scopes = tuple(str(scope) for scope in scopes)

    def authenticate(self, request: HttpRequest, token: str) -> AgentKey | None:
        # The API gate (saga_admin.api.limits) authenticated the key before reading the body;
        # this is its answer, not a second lookup.
        key = request_key(request)
        if key is None:
            return None
        if not set(self.scopes) & set(key.scopes):
            wanted = " or ".join(f"'{scope}'" for scope in self.scopes)
            raise errors.Forbidden(
                f"This API key lacks the {wanted} scope.", details={"scope": " or ".join(self.scopes)}
            )
        structlog.contextvars.bind_contextvars(tenant=key.tenant.slug, key=key.prefix)
        return key


# Writes as an agent: starting runs, recording actions, reporting on them (owner's runs only).
agent_auth = KeyAuth(AgentKey.Scope.AGENT)
# Reading runs, actions, checkpoints, commands, trail and policies: the agent reads its own runs,
# a key with the operator scope every run of its tenant (ledger.scoping.Reach.of_key).
reader_auth = KeyAuth(AgentKey.Scope.AGENT, AgentKey.Scope.OPERATOR)
# The recovery queue, unwinds and steps.
operator_auth = KeyAuth(AgentKey.Scope.OPERATOR)
# Deciding approvals (never held together with the agent scope).
approver_auth = KeyAuth(AgentKey.Scope.APPROVER)
