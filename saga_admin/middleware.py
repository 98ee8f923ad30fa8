from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse
from django.utils.module_loading import import_string

_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-Id when it is well-formed), binds it to
    the log context and returns it in the response, so a 500 seen by a client can be found."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-Id", "")
        request_id = incoming if _SAFE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        response = self.get_response(request)
        response["X-Request-Id"] = request_id
        return response


# The middleware only the pages need (sessions, CSRF, the logged-in user, messages, the idle
# timeout, htmx, the login lockout), built as one link of the chain: a request under /api/ goes
# straight past all of it. API requests carry a bearer key, never a session or a CSRF token, so
# none of it applies to them, and each would cost every agent call a little for nothing.
PAGE_MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "dashboard.middleware.IdleTimeoutMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
)
# The same test as the API gate's (saga_admin.api.limits.is_api_request): path_info, the path
# within this application, so a SCRIPT_NAME prefix changes nothing.
API_PREFIX = "/api/"

# The hooks of a middleware instance, as Django calls them.
ViewHook = Callable[[HttpRequest, Callable[..., Any], tuple[Any, ...], dict[str, Any]], HttpResponse | None]
ExceptionHook = Callable[[HttpRequest, Exception], HttpResponse | None]
TemplateHook = Callable[[HttpRequest, Any], Any]


class PageMiddleware:
    """``PAGE_MIDDLEWARE`` in that order for every path outside ``/api/``; nothing for the API.

    Django registers a middleware's view and exception hooks from the instances it builds itself,
    so this one offers the hooks of the middleware it holds (CSRF's ``process_view``, say) and
    calls them in the order Django would have, for pages only."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        handler = get_response
        instances = []
        for path in reversed(PAGE_MIDDLEWARE):
            handler = import_string(path)(handler)
            instances.append(handler)
        instances.reverse()  # outermost first, as in settings.MIDDLEWARE
        self.pages = handler
        self._view_hooks: list[ViewHook] = [m.process_view for m in instances if hasattr(m, "process_view")]
        # Django runs exception and template-response hooks innermost first.
        self._exception_hooks: list[ExceptionHook] = [
            m.process_exception for m in reversed(instances) if hasattr(m, "process_exception")
        ]
        self._template_hooks: list[TemplateHook] = [
            m.process_template_response
            for m in reversed(instances)
            if hasattr(m, "process_template_response")
        ]

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        return self.pages(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> HttpResponse | None:
        if request.path_info.startswith(API_PREFIX):
            return None
        for hook in self._view_hooks:
            response = hook(request, view, args, kwargs)
            if response is not None:
                return response
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if request.path_info.startswith(API_PREFIX):
            return None
        for hook in self._exception_hooks:
            response = hook(request, exception)
            if response is not None:
                return response
        return None

    def process_template_response(self, request: HttpRequest, response: Any) -> Any:
        if request.path_info.startswith(API_PREFIX):
            return response
        for hook in self._template_hooks:
            response = hook(request, response)
        return response
