from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register


class SagaAdminConfig(AppConfig):
    """The project shell as an app: only for the system check below (it has no models)."""

    name = "saga_admin"
    verbose_name = "Saga Admin"

    def ready(self) -> None:
        register(check_page_middleware, Tags.security)


def check_page_middleware(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Sessions, CSRF, authentication, messages and the login lockout run inside
    ``saga_admin.middleware.PageMiddleware`` (pages only, never /api/), so Django's and axes'
    own checks, which look for them by name in MIDDLEWARE, are silenced in the settings; this is
    the check in their place."""
    from saga_admin.middleware import PAGE_MIDDLEWARE

    if "saga_admin.middleware.PageMiddleware" not in settings.MIDDLEWARE:
        return [
            Error(
                "saga_admin.middleware.PageMiddleware is not in MIDDLEWARE: the dashboard would run "
                "without sessions, CSRF protection, authentication or the login lockout.",
                id="saga_admin.E001",
            )
        ]
    needed = {
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "axes.middleware.AxesMiddleware",
    }
    missing = sorted(needed - set(PAGE_MIDDLEWARE))
    if missing:
        return [Error(f"PAGE_MIDDLEWARE lacks {', '.join(missing)}.", id="saga_admin.E002")]
    return []
