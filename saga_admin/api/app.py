"""The NinjaAPI behind /api/v1/: authentication, the one error shape, and the routers.

Every error leaves here as ``{"error": {"code", "message", "details"}}``: domain errors with
their own code and status, ninja's validation errors as 422 ``invalid_request``, and anything
unexpected as a 500 carrying only the request id (the traceback goes to the log).
"""

from __future__ import annotations

from typing import Any

import structlog
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, ValidationError
from ninja.operation import Operation

from infra import errors
from infra.conf import saga
from infra.error_bodies import error_body
from saga_admin.api import (
    actions,
    approvals,
    bulk,
    checkpoints,
    commands,
    pauses,
    plans,
    policies,
    queue,
    runs,
    unwinds,
)
from saga_admin.api.common import archived_instead
from saga_admin.api.limits import (
    BodyRejected,
    CheckedJSONParser,
    error_json,
    internal_error,
    unauthorized_response,
)
from saga_admin.api.renderers import ORJSONRenderer

log = structlog.get_logger(__name__)


def error_response(
    api: NinjaAPI,
    request: HttpRequest,
    *,
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
) -> HttpResponse:
    return api.create_response(request, error_body(code, message, details), status=status)


# The operation ids of the OpenAPI document, which generated clients name their methods after, by
# tag. ninja's default is ``<module>_<function>``: these are those ids as they were when the views
# lived in one module per audience (agents.py, operator.py), kept while the views move between modules.
OPERATION_ID_PREFIXES = {"agents": "saga_admin_api_agents_", "recovery": "saga_admin_api_operator_"}


ARCHIVED_DOC = (
    "Gone: the run was archived by retention (`archived`, `details`: `archive`, the URL of its "
    "manifest, and `archived_at`); said only to a key that could have read it, any other gets 404."
)


class SagaAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        (tag,) = operation.tags or []
        return OPERATION_ID_PREFIXES[tag] + operation.view_func.__name__

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        """ninja's document, with the 410 every operation on one run may answer
        (``saga_admin.api.common.archived_instead``, from the error handler: no operation declares it)."""
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
        for path, operations in schema["paths"].items():
            if "{run_id}" in path:
                for operation in operations.values():
                    responses = operation["responses"]
                    responses[410] = {"content": error, "description": ARCHIVED_DOC}
                    operation["responses"] = dict(sorted(responses.items(), key=lambda kv: int(kv[0])))
        return schema


api = SagaAPI(
    title="Saga Admin API",
    version="1.0.0",
    description=(
        "The system of record and recovery for AI agents: an action ledger, checkpoints, approvals "
        "and a recovery queue. See the README's 'For agent authors' section."
    ),
    urls_namespace="api-v1",
    openapi_url="/openapi.json",
    docs_url="/docs",
    parser=CheckedJSONParser(),
    renderer=ORJSONRenderer(),
    # No ninja throttle: the per-key limits are counted by the API gate (saga_admin.api.limits)
    # from the headers, so a key over them is refused before its body is read.
)


@api.exception_handler(errors.SagaError)
def _saga_error(request: HttpRequest, exc: errors.SagaError) -> HttpResponse:
    exc = archived_instead(request, exc)  # a run gone to its archive: 410, not 404
    return error_response(
        api, request, status=exc.status, code=exc.code, message=exc.message, details=exc.details
    )


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    fields = []
    for err in exc.errors:
        loc = [str(part) for part in err.get("loc", ())]
        # ninja's loc is (source, [body parameter name,] field…); agents think in field names, and
        # the operation's parameter name (``payload``) is the framework's, not the body's: dropped.
        path = loc[2:] if len(loc) > 2 and loc[0] == "body" else loc[1:] if len(loc) > 1 else loc
        fields.append(
            {
                "loc": [loc[0], *path] if loc else loc,
                "field": ".".join(path),
                "message": err.get("msg", "invalid"),
                "type": err.get("type", ""),
            }
        )
    return error_response(
        api,
        request,
        status=422,
        code="invalid_request",
        message="The request is not valid; see details.errors.",
        details={"errors": fields},
    )


@api.exception_handler(AuthenticationError)
def _authentication_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    # Normally the API gate answers first, before the body is read; the same answer here covers a
    # request that reached an operation without it.
    return unauthorized_response()


@api.exception_handler(AuthorizationError)
def _authorization_error(request: HttpRequest, exc: AuthorizationError) -> HttpResponse:
    return error_response(api, request, status=403, code="forbidden", message=str(exc) or "Forbidden.")


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    # Normally the body-limits middleware answers first; this covers a request that skipped it.
    limit = saga().max_body_bytes
    return error_response(
        api,
        request,
        status=413,
        code="payload_too_large",
        message=f"The request body is larger than {limit} bytes.",
        details={"max_bytes": limit},
    )


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps any parser failure in a 400 "Cannot parse request body"; keep our own answer.
    if isinstance(exc.__cause__, BodyRejected):
        cause = exc.__cause__
        return error_response(
            api, request, status=cause.status, code=cause.code, message=cause.message, details=cause.details
        )
    codes = {
        400: "bad_request",
        404: "not_found",
        405: "method_not_allowed",
        413: "payload_too_large",
        415: "unsupported_media_type",
    }
    return error_response(
        api, request, status=exc.status_code, code=codes.get(exc.status_code, "http_error"), message=str(exc)
    )


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(api, request, status=404, code="not_found", message="Not found.")


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("api.unexpected_error", path=request.path, method=request.method)
    if settings.DEBUG and getattr(settings, "SAGA_RAISE_API_ERRORS", False):
        raise exc
    return internal_error(request, exc)  # the database down: 503 with Retry-After


# The agents' API, then the operator's (the order of the OpenAPI document's paths).
for resource in (
    runs,
    actions,
    plans,
    commands,
    checkpoints,
    policies,
    bulk,
    queue,
    unwinds,
    approvals,
    pauses,
):
    api.add_router("", resource.router)


@csrf_exempt  # an API path: key-authenticated, never a browser form
def unrouted(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Every path under /api/ that no operation serves (a typo, another version): a JSON 404 in
    the one error shape, not the dashboard's page. It sits after the API in saga_admin/urls.py, so
    the gate has already asked for a key: without one the answer is 401, as for any API path."""
    return error_json(404, "not_found", "No API operation at this path; see /api/v1/docs.")
