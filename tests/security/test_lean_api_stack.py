"""Requests under /api/ go past the middleware only pages need (sessions, CSRF, the logged-in
user, messages, the idle timeout, htmx, the login lockout); the pages keep every one of them."""

from __future__ import annotations

import pytest
from axes.middleware import AxesMiddleware
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.management import call_command
from django.middleware.csrf import CsrfViewMiddleware
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def calls(monkeypatch):
    """How often each page-only middleware ran."""
    seen: dict[str, int] = {}

    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            seen[name] = seen.get(name, 0) + 1
            return original(self, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        SessionMiddleware, "process_request", counting("session", SessionMiddleware.process_request)
    )
    monkeypatch.setattr(CsrfViewMiddleware, "process_view", counting("csrf", CsrfViewMiddleware.process_view))
    monkeypatch.setattr(
        AuthenticationMiddleware,
        "process_request",
        counting("auth", AuthenticationMiddleware.process_request),
    )
    monkeypatch.setattr(AxesMiddleware, "__call__", counting("axes", AxesMiddleware.__call__))
    return seen


def test_an_api_call_runs_none_of_the_page_middleware(agent_key, calls):
    _, secret = agent_key
    response = Client().get("/api/v1/policies", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 200
    assert calls == {}
    assert "csrftoken" not in response.cookies and "sessionid" not in response.cookies
    # What the whole site gets still applies to the API.
    assert response["X-Request-Id"] and response["X-Content-Type-Options"] == "nosniff"


def test_a_page_runs_all_of_it(alice, calls):
    client = Client()
    client.force_login(alice)
    assert client.get(reverse("dashboard:queue")).status_code == 200
    assert set(calls) == {"session", "csrf", "auth", "axes"}


def test_a_dashboard_post_without_a_csrf_token_is_refused(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("dashboard:queue-bulk"), {"action": "close"})
    assert response.status_code == 403


def test_the_system_check_stands_in_for_the_silenced_ones(settings):
    call_command("check")  # passes as configured
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != "saga_admin.middleware.PageMiddleware"]
    from saga_admin.apps import check_page_middleware

    assert [error.id for error in check_page_middleware()] == ["saga_admin.E001"]
