from __future__ import annotations

import functools
from pathlib import Path

import django_rq
from django.contrib.staticfiles import finders
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """For load balancers: no login, no redirect, 503 naming what is down."""
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
    healthy = all(value == "ok" for value in status.values())
    return JsonResponse(status, status=200 if healthy else 503)


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
