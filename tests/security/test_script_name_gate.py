"""The API gate decides "is this an API request" on ``path_info``, the path within the application,
so a ``SCRIPT_NAME`` prefix cannot walk a request past it.

Under gunicorn a peer it trusts as a proxy (``--forwarded-allow-ips``: the Procfile's
``SAGA_TRUSTED_PROXY_IPS``, here ``*``) may send a ``SCRIPT_NAME`` header (gunicorn's default
``forwarder_headers``), and an installation mounted under a prefix sets
it for every request (``SCRIPT_NAME=/saga``). Either way the full path is ``/<prefix>/api/…`` while
the URL resolver still routes ``path_info`` (``/api/…``) to the API. A gate that looked at the full
path let such requests reach the views without its refusals: no per-address throttle for requests
without a key, no content-type check, and Django's HTML 404 instead of the error shape."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.support.processes import ROOT, database_url_for_subprocesses, free_port, wait_for

UNAUTHENTICATED_RATE = 3


@dataclass
class Mounted:
    base: str  # where the server listens
    prefix: str  # the SCRIPT_NAME every request below carries
    headers: dict[str, str]  # what a client adds to put its request under that prefix


def _gunicorn_env(**extra: str) -> dict[str, str]:
    """Only what a deployed web process gets (the suite's own settings must not leak into it)."""
    keep = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    return {
        **keep,
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": str(settings.CACHES["default"]["LOCATION"]),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        "SAGA_UNAUTHENTICATED_RATE": f"{UNAUTHENTICATED_RATE}/m",
        # Count refusals per X-Forwarded-For address, so each test counts from a fresh address.
        "SAGA_TRUSTED_PROXY_HOPS": "1",
        **extra,
    }


@pytest.fixture(scope="module", params=["prefix-in-environment", "prefix-sent-by-the-client"])
def mounted(request, django_db_setup, tmp_path_factory) -> Iterator[Mounted]:
    """The Procfile's web command, on a free port, on the test database: mounted under
    ``SCRIPT_NAME=/saga``, or as deployed with no prefix and a client that sends a ``SCRIPT_NAME``
    header of its own. Started once per module and kind (a web process boots in seconds)."""
    tmp_path = tmp_path_factory.mktemp("gunicorn")
    port = free_port()
    in_environment = request.param == "prefix-in-environment"
    env = _gunicorn_env(**({"SCRIPT_NAME": "/saga"} if in_environment else {}))
    log = tmp_path / "gunicorn.log"
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "saga_admin.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--worker-class",
            "gthread",
            "--threads",
            "2",
            "--forwarded-allow-ips",
            "*",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    prefix = "/saga" if in_environment else "/x"
    headers = {} if in_environment else {"SCRIPT_NAME": prefix}

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"gunicorn exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            return httpx.get(f"{base}{prefix}/healthz", headers=headers, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, timeout=60, what="gunicorn to answer /healthz")
        yield Mounted(base=base, prefix=prefix, headers=headers)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _read_response(sock: socket.socket) -> str:
    """One HTTP/1.1 response, head and Content-Length body, from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def _fresh_address() -> str:
    # The client's own claim, then what our (trusted) proxy saw: a fresh address per test.
    octets = ".".join(str(secrets.randbelow(250) + 1) for _ in range(3))
    return f"198.51.100.7, 10.{octets}"


def test_without_a_key_under_a_prefix_it_is_refused_unread_and_throttled(mounted: Mounted):
    """Pass: under the prefix, a POST declaring 5 MB without a key is answered 401 in the error
    shape while its body is still unsent; an unknown API path without a key is a 401 too (not
    Django's HTML 404); and refusals from one address turn into 429 with Retry-After after
    ``SAGA_UNAUTHENTICATED_RATE``, as they do without a prefix."""
    forwarded = _fresh_address()
    with socket.create_connection(("127.0.0.1", int(mounted.base.rsplit(":", 1)[1])), timeout=10) as sock:
        head = (
            f"POST {mounted.prefix}/api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: 5000000\r\n"
            f"X-Forwarded-For: {forwarded}\r\n"
            + "".join(f"{name}: {value}\r\n" for name, value in mounted.headers.items())
            + "\r\n"
        )
        sock.sendall(head.encode())
        answer = _read_response(sock)  # times out (fails) if the server waits for the body
    assert answer.startswith("HTTP/1.1 401"), answer[:300]
    assert '"code":"unauthorized"' in answer.replace(" ", "")

    with httpx.Client(
        base_url=mounted.base, headers={**mounted.headers, "X-Forwarded-For": forwarded}
    ) as client:
        unknown = client.get(f"{mounted.prefix}/api/v1/no-such-endpoint")
        assert unknown.status_code == 401 and unknown.json()["error"]["code"] == "unauthorized"
        statuses = [
            client.get(f"{mounted.prefix}/api/v1/runs").status_code for _ in range(UNAUTHENTICATED_RATE)
        ]
        throttled = client.get(f"{mounted.prefix}/api/v1/runs")
    assert statuses[-1] in (401, 429) and throttled.status_code == 429, (statuses, throttled.text)
    assert throttled.json()["error"]["code"] == "rate_limited" and int(throttled.headers["Retry-After"]) >= 1


@pytest.mark.django_db(transaction=True)  # the key must be committed for the web process to see it
def test_with_a_key_under_a_prefix_the_body_checks_still_apply(mounted: Mounted, agent_key):
    """Pass: under the prefix, an authenticated body that is not JSON is refused with 415 before
    any view runs (no run is created), as without a prefix; a JSON body still creates the run."""
    from ledger.models import Run

    headers = {
        **mounted.headers,
        "Authorization": f"Bearer {agent_key[1]}",
        "X-Forwarded-For": _fresh_address(),
    }
    with httpx.Client(base_url=mounted.base, headers=headers, timeout=30) as client:
        refused = client.post(
            f"{mounted.prefix}/api/v1/runs",
            content=b'{"agent": "onboarding", "request": "Onboard Ashu"}',
            headers={"Content-Type": "text/plain"},
        )
        assert refused.status_code == 415, refused.text
        assert refused.json()["error"]["code"] == "unsupported_media_type"
        assert not Run.objects.exists()
        created = client.post(
            f"{mounted.prefix}/api/v1/runs", json={"agent": "onboarding", "request": "Onboard Ashu"}
        )
    assert created.status_code == 201, created.text
    assert Run.objects.count() == 1
