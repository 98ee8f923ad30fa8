"""What the routers share: who is calling (its key, tenant, actor and reach), a key's runs and
actions, the errors of an operation that writes, and the Idempotency-Key header.

The routers (one module per resource) are authentication + typed parsing + one service call; the
pieces here are the ones each of them would otherwise spell again. No router imports another.

The agents' routers write as an agent (the ``agent`` scope) unless an operation says
``auth=reader_auth``: reads also serve keys with the ``operator`` scope. Which runs a key reaches
is ``ledger.scoping.Reach.of_key`` (``reach_of``): an agent its own runs, an operator key every run
for reading. What has no agent of its own (items, unwinds, approvals, bulk decisions) an operator
key reaches in its whole tenant (``tenant_reach_of``).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Schema
from ninja.params.functions import Header

from infra import errors
from infra.error_bodies import ErrorOut
from infra.ids import looks_like_id
from ledger import selectors as ledger_selectors
from ledger.audit import Actor
from ledger.models import Action, AgentKey, Run, Tenant
from ledger.scoping import Reach
from saga_admin.api.auth import AUTH_ERRORS
from saga_admin.api.idempotency import HEADER, KEY_PATTERN, REPLAYED_HEADER

# Errors of operations that change state: 409 for a transition the state machine refuses, a run
# that takes no more actions, a decision on something already decided, or an Idempotency-Key
# still in flight.
WRITE_ERRORS: dict[int, type[Schema]] = {**AUTH_ERRORS, 409: ErrorOut}


IDEMPOTENCY_DOC = (
    "Optional. The same key with the same body replays the original response (with "
    f"`{REPLAYED_HEADER}: true`); with another body → 422 `idempotency_key_reused`; while the first "
    "request is still running → 409 `idempotency_key_in_flight`."
)


def idempotency_header() -> Any:
    return Header(None, alias=HEADER, description=IDEMPOTENCY_DOC, max_length=255, pattern=KEY_PATTERN)


def key_of(request: HttpRequest) -> AgentKey:
    """The caller's API key: django-ninja sets request.auth to what the operation's auth returned
    (saga_admin.api.auth.KeyAuth)."""
    key = request.auth  # type: ignore[attr-defined]
    assert isinstance(key, AgentKey)
    return key


def tenant_of(request: HttpRequest) -> Tenant:
    return key_of(request).tenant


def actor_of(request: HttpRequest) -> Actor:
    return Actor.for_key(key_of(request))


def reach_of(request: HttpRequest, *, write: bool = False) -> Reach:
    """What the caller's key reaches over runs (and what is theirs), reading or, with ``write``,
    writing as its agent (``ledger.scoping``)."""
    return Reach.of_key(key_of(request), write=write)


def tenant_reach_of(request: HttpRequest) -> Reach:
    """The caller's whole tenant: what the operator's routes look up (items, unwinds, steps,
    approvals, bulk decisions, checkpoints, a run to flag or cancel)."""
    return Reach.of_tenants(tenant_of(request))


def check_id(kind: str, pk: str) -> None:
    """A path's id that cannot be one (``infra.ids``) is not looked up: the same 404 as an
    unknown id."""
    if not looks_like_id(pk):
        raise errors.NotFound.for_id(kind, pk)


def run_for(request: HttpRequest, run_id: str, *, write: bool = False) -> Run:
    """The run, if the key reaches it (reading or, with ``write``, writing as its agent); else the
    same 404 as an unknown id or another tenant's run."""
    check_id("Run", run_id)
    return ledger_selectors.run_get(reach=reach_of(request, write=write), run_id=run_id)


def archived_instead(request: HttpRequest, exc: errors.SagaError) -> errors.SagaError:
    """The answer for a run-scoped operation (a ``{run_id}`` in its path) whose run was not found:
    410 ``archived`` if retention archived that run and the key could have read it
    (``ledger.selectors.archived_run_get`` with the key's reach for reading), else the 404 itself.
    Asked by the API's error handler, so only a request already failing with 404 pays for the
    lookup; every operation under ``/runs/{run_id}``, a write too, answers the same, whichever
    step found the run missing."""
    if type(exc) is not errors.NotFound:
        return exc
    match = request.resolver_match
    run_id = match.kwargs.get("run_id") if match is not None else None
    key = getattr(request, "auth", None)
    if not isinstance(run_id, str) or not looks_like_id(run_id) or not isinstance(key, AgentKey):
        return exc
    archived = ledger_selectors.archived_run_get(reach=Reach.of_key(key), run_id=run_id)
    return errors.RunArchived.for_run(archived) if archived is not None else exc


def action_for(request: HttpRequest, action_id: str, *, write: bool = False) -> Action:
    check_id("Action", action_id)
    return ledger_selectors.action_get(reach=reach_of(request, write=write), action_id=action_id)


def action_reference(request: HttpRequest, action_id: str) -> Action:
    """A reference to an action the key reports on: the service's one write call scopes it (and
    fills it in), so it is not read first."""
    check_id("Action", action_id)
    return ledger_selectors.action_reference_for_write(key=key_of(request), action_id=action_id)
