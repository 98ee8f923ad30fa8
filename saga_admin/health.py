from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import django_rq
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.staticfiles import finders
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from saga_admin.metrics import SURFACE_ATTR, metrics


def _dependencies() -> dict[str, str]:
    """PostgreSQL and Redis, each ``ok`` or ``down: <what failed>``."""
    status = {"database": "ok", "redis": "ok"}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means "down"; the name is what matters
        status["database"] = f"down: {type(exc).__name__}"
    try:
        django_rq.get_connection("default").ping()
    except Exception as exc:  # noqa: BLE001
        status["redis"] = f"down: {type(exc).__name__}"
    return status


def _pages() -> str:
    """Whether the app can render its own pages: the login page, rendered as a visitor gets it
    (its template, the base it extends and the static files' manifest it links through). An
    install without its templates, or without collected static files, serves 500 on every page
    while the database and Redis answer."""
    try:
        render_to_string("registration/login.html", {"form": AuthenticationForm()})
    except Exception as exc:  # noqa: BLE001 - any failure means the pages are down
        return f"down: {type(exc).__name__}"
    return "ok"


def _answer(status: dict[str, str]) -> JsonResponse:
    return JsonResponse(status, status=200 if all(value == "ok" for value in status.values()) else 503)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers: no login, no redirect, 503 naming what is down."""
    return _answer(_dependencies())


@never_cache
@require_GET
def livez(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers at all. It checks no dependency, so a database or Redis outage
    restarts nothing (an orchestrator restarts a process whose liveness fails)."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: PostgreSQL and Redis answer and the pages render; 503 naming what is not (an
    orchestrator sends no traffic to a process that is not ready)."""
    return _answer({**_dependencies(), "pages": _pages()})


@functools.cache
def _favicon_bytes() -> bytes:
    path = finders.find("favicon.ico")
    assert isinstance(path, str), "dashboard/static/favicon.ico is missing"
    return Path(path).read_bytes()


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask every site for (the dashboard's pages link their icon; the
    Django admin's and the API docs' do not): served here, no login, cached for a day."""
    response = HttpResponse(_favicon_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response


# The probes by path. ProbeMiddleware answers them first, whatever the Host header says: an
# orchestrator's kubelet or a container engine asks by the pod's or container's own address, which
# ALLOWED_HOSTS (the public name) rightly does not list, and over plain HTTP. They read nothing of
# the request and say nothing of the host.
PROBES: dict[str, Callable[[HttpRequest], HttpResponse]] = {
    "/healthz": healthz,
    "/livez": livez,
    "/readyz": readyz,
}


# What ProbeMiddleware answers: the probes and Prometheus's scrape, which asks by the pod's
# address too (behind its own token, saga_admin.metrics). The one list of these paths: the URL
# names (saga_admin/urls.py) and the request metrics' surfaces (saga_admin.metrics) come from it,
# and the pages' middleware never sees them.
HOSTLESS: dict[str, Callable[[HttpRequest], HttpResponse]] = {**PROBES, "/metrics": metrics}


class ProbeMiddleware:
    """Answers ``/healthz``, ``/livez``, ``/readyz`` and ``/metrics`` before the host check, the
    HTTPS redirect and the rest of the chain (early in MIDDLEWARE, after the request id)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = HOSTLESS.get(request.path_info)
        if probe is None:
            return self.get_response(request)
        setattr(request, SURFACE_ATTR, "metrics" if probe is metrics else "probes")
        return probe(request)
