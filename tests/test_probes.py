"""The probes an orchestrator or a load balancer polls, over HTTP against a live server: ``/livez``
(the process answers; it checks nothing external, so an outage restarts nothing), ``/readyz``
(PostgreSQL and Redis answer and the pages render; 503 naming what is not) and ``/healthz`` (as
before: PostgreSQL and Redis). None is redirected to HTTPS or sent to the login."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.test import Client

from tests.support.processes import RedisServer

pytestmark = pytest.mark.django_db(transaction=True)


def _get(base: str, path: str) -> tuple[int, Any]:
    response = httpx.get(f"{base}{path}", timeout=10, follow_redirects=False)
    return response.status_code, response.json()


def test_every_probe_answers_ok_when_everything_is_up(live_server: Any, own_redis: RedisServer) -> None:
    assert _get(live_server.url, "/livez") == (200, {"status": "ok"})
    assert _get(live_server.url, "/readyz") == (200, {"database": "ok", "redis": "ok", "pages": "ok"})
    assert _get(live_server.url, "/healthz") == (200, {"database": "ok", "redis": "ok"})


def test_with_redis_stopped_the_process_is_alive_but_not_ready(
    live_server: Any, own_redis: RedisServer
) -> None:
    own_redis.stop()
    assert _get(live_server.url, "/livez") == (200, {"status": "ok"})
    status, body = _get(live_server.url, "/readyz")
    assert status == 503
    assert body["database"] == "ok" and body["pages"] == "ok"
    assert body["redis"].startswith("down: ")
    assert _get(live_server.url, "/healthz")[0] == 503


def test_an_app_that_cannot_render_its_pages_is_not_ready(
    live_server: Any, own_redis: RedisServer, settings: Any
) -> None:
    """An install without its templates answers 500 on every page while PostgreSQL and Redis are
    fine: it is alive, and not ready."""
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [], "APP_DIRS": False, "OPTIONS": {}}]
    assert _get(live_server.url, "/livez") == (200, {"status": "ok"})
    assert _get(live_server.url, "/readyz") == (
        503,
        {"database": "ok", "redis": "ok", "pages": "down: TemplateDoesNotExist"},
    )


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/healthz"])
def test_probes_answer_plain_http_without_a_login(own_redis: RedisServer, settings: Any, path: str) -> None:
    """With HTTPS enforced, a page is redirected (the setting is live) and a probe is not."""
    settings.SECURE_SSL_REDIRECT = True
    client = Client()  # its handler loads the middleware with the setting above
    assert client.get("/login/").status_code == 301
    response = client.get(path)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("path", ["/livez", "/readyz", "/healthz"])
def test_probes_answer_whatever_host_they_are_asked_by(
    own_redis: RedisServer, settings: Any, path: str
) -> None:
    """A kubelet or a container engine asks by the pod's or container's address, which
    ALLOWED_HOSTS (the public name) does not list: a page asked that way is refused (the check is
    live), a probe answers."""
    settings.ALLOWED_HOSTS = ["saga.example.com"]
    client = Client(HTTP_HOST="10.1.2.3:8000")
    assert client.get("/login/").status_code == 400
    response = client.get(path)
    assert response.status_code == 200, response.content
    assert client.post(path).status_code == 405  # still GET-only
