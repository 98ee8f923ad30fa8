from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

SESSION_KEY = "saga_last_activity"
# Background polls (queue refresh, unwind progress) send this header; they must not keep an
# unattended session alive forever.
POLL_HEADER = "X-Saga-Poll"
ACTIVITY_RESOLUTION_S = 60
# Requests a browser makes by itself, not the person: static files whitenoise did not serve (a
# missing one) and the icon. The API, the probes and /metrics never reach this middleware
# (saga_admin.middleware.PageMiddleware, saga_admin.health.ProbeMiddleware).
_FAVICON = "/favicon.ico"


class IdleTimeoutMiddleware:
    """Logs a dashboard user out after ``SESSION_IDLE_TIMEOUT_S`` seconds without a request
    they made themselves (the absolute limit is ``SESSION_COOKIE_AGE``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        path = request.path_info
        if (
            user is None
            or not user.is_authenticated
            or path == _FAVICON
            or path.startswith(settings.STATIC_URL)
        ):
            return self.get_response(request)
        now = int(time.time())
        last = request.session.get(SESSION_KEY)
        if last is not None and now - int(last) > settings.SESSION_IDLE_TIMEOUT_S:
            logout(request)
            messages.info(request, "You were signed out after a period of inactivity.")
            login_url = f"{reverse('login')}?next={request.get_full_path()}"
            if request.headers.get("HX-Request"):
                return HttpResponseClientRedirect(login_url)
            return redirect(login_url)
        # Refreshed at most once a minute: writing it on every page view cost an UPDATE of the
        # session row and a transaction per request. The idle timeout stays exact to the minute.
        if last is None or (
            not request.headers.get(POLL_HEADER) and now - int(last) >= ACTIVITY_RESOLUTION_S
        ):
            request.session[SESSION_KEY] = now
        return self.get_response(request)
