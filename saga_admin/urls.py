from __future__ import annotations

import sys

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.urls import include, path, re_path
from django.views import defaults

from dashboard.views import slack, sso, workers
from saga_admin.api.app import api, unrouted
from saga_admin.api.limits import (
    DATABASE_RETRY_AFTER_S,
    database_down,
    database_unavailable,
    error_json,
    is_api_request,
)
from saga_admin.health import HOSTLESS, favicon

urlpatterns = [
    # /healthz, /livez, /readyz and /metrics (Prometheus, behind SAGA_METRICS_TOKEN; the
    # dashboard's charts are at /insights/): answered by saga_admin.health.ProbeMiddleware before
    # any of this, whatever the Host; named here for reverse().
    *(path(url.lstrip("/"), view, name=url.lstrip("/")) for url, view in HOSTLESS.items()),
    # Browsers ask every site for /favicon.ico (the Django admin's pages and the API docs name no
    # icon); the dashboard's pages link theirs.
    path("favicon.ico", favicon, name="favicon"),
    path("api/v1/", api.urls),
    # Any other path under /api/ is the API's JSON 404 (never the dashboard's page, never an
    # APPEND_SLASH redirect).
    re_path(r"^api/(?P<rest>.*)$", unrouted, name="api-unrouted"),
    # The admin's own password form, closed while SAGA_LOCAL_LOGIN=0 (to the dashboard's login).
    path("admin/login/", sso.admin_login),
    path("admin/", admin.site.urls),
    # Superusers only (django-rq's own check lets any staff user in, tenant admins included).
    path("django-rq/", include((workers.urlpatterns(), "django_rq"))),
    # Slack's interactivity requests (Approve / Reject buttons), verified by signature, not session.
    path("integrations/slack/interactions", slack.interactions, name="slack-interactions"),
    # Slack's slash command by which a person links their own Slack account (/saga link …).
    path("integrations/slack/commands", slack.commands, name="slack-commands"),
    path("", include("dashboard.auth_urls")),
    path("", include("dashboard.urls")),
]

if settings.SAGA_DEMO:
    # The demo's pretend systems exist only where the demo runs (SAGA_DEMO=1, set by `make run`):
    # a deployment never serves their endpoints or tables.
    urlpatterns.append(path("demo-world/", include("demo.urls")))


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 400s raised before any view (a Host header ALLOWED_HOSTS does not list, a
    malformed request): in the API's error shape under /api/, as every answer there is."""
    if is_api_request(request):
        message = (
            "The Host header names a host this server does not serve."
            if isinstance(exception, DisallowedHost)
            else "Bad request."
        )
        return error_json(400, "bad_request", message)
    return defaults.bad_request(request, exception)


handler400 = bad_request


# A page while the database is down: no template (the base's context processors would ask the
# database again), a retry the browser may follow.
UNAVAILABLE_PAGE = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>Saga Admin: briefly unavailable</title>"
    "<h1>Briefly unavailable</h1><p>The database is not answering right now. Nothing is lost: "
    "decisions already made are in it. Try again in a few seconds.</p></html>"
)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500, reached for an exception no view or API handler answered: one raised in a
    middleware (the API gate's key lookup, the session's) or by a page. The database down answers
    503 with Retry-After instead, in the API's error shape under /api/; anything else is Django's
    500 page."""
    if database_down(sys.exc_info()[1]):  # Django calls this inside its except block
        if is_api_request(request):
            return database_unavailable()
        response = HttpResponse(UNAVAILABLE_PAGE, status=503)
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
        return response
    return defaults.server_error(request)


handler500 = server_error
