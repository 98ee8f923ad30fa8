"""Behind a reverse proxy, as every shipped deployment runs: the Procfile's web line (gunicorn, the
real WSGI stack) with the proxy settings compose.yaml and deploy/kubernetes/ ship
(``SAGA_TRUSTED_PROXY_HOPS=1``, ``SAGA_TRUSTED_PROXY_IPS`` naming the proxy), and a real proxy hop
in front (tests/support/reverse_proxy.py) that appends the client's address to X-Forwarded-For and
says X-Forwarded-Proto: https.

- One client's wrong passwords lock out that client, not the admin signing in from elsewhere:
  before, with no hop trusted, every client had the proxy's address, and five guesses from anyone
  locked the admin out for everyone.
- Left unset (the failure mode of a deployment that forgets it), the proxy's address is every
  client's, and five guesses lock it out: the admin's own browser, which signed in before, still
  signs in (dashboard.known_devices).
- X-Forwarded-Proto is believed from the proxy only: a client that reaches the web directly and
  claims https is redirected to https like any plain-HTTP request. Before, gunicorn ran with
  ``--forwarded-allow-ips '*'`` and Django read the header itself (SECURE_PROXY_SSL_HEADER), so
  any client could."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.support.processes import ROOT, database_url_for_subprocesses, free_port, procfile_web
from tests.support.reverse_proxy import Proxy, client, reverse_proxy

pytestmark = pytest.mark.django_db(transaction=True)

HOST = "saga.example.com"
PROXY_ADDRESS = "127.0.0.1"  # where the proxy's connections to the web come from
PASSWORD = "correct-horse-battery"  # tests/conftest.py's _user


@dataclass(frozen=True)
class Deployment:
    web: str  # the web's own address (a client that goes around the proxy)
    proxy: Proxy


@pytest.fixture(scope="module")
def static_root(tmp_path_factory) -> Path:
    """The login page needs the static files' manifest a deployment's collectstatic writes."""
    static = tmp_path_factory.mktemp("static")
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v", "0"],
        env={
            **os.environ,
            "DEBUG": "0",
            "SECRET_KEY": "collectstatic-signs-nothing",
            "STATIC_ROOT": str(static),
        },
        check=True,
        capture_output=True,
        timeout=240,
    )
    return static


@contextmanager
def _deployed(tmp_path: Path, static: Path, **proxy_settings: str) -> Iterator[Deployment]:
    port = free_port()
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": str(settings.CACHES["default"]["LOCATION"]),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",  # HTTPS redirect on, Secure cookies: production's defaults
        "ALLOWED_HOSTS": HOST,
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        "PORT": str(port),
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "4",
        "STATIC_ROOT": str(static),
        **proxy_settings,
    }
    with procfile_web(env, tmp_path / "web.log"), reverse_proxy(port, source=PROXY_ADDRESS) as proxy:
        yield Deployment(web=f"http://127.0.0.1:{port}", proxy=proxy)


@pytest.fixture(scope="module")
def deployment(django_db_setup, tmp_path_factory, static_root: Path) -> Iterator[Deployment]:
    """As shipped: one proxy of ours in front, and its address."""
    with _deployed(
        tmp_path_factory.mktemp("shipped"),
        static_root,
        SAGA_TRUSTED_PROXY_HOPS="1",
        SAGA_TRUSTED_PROXY_IPS=PROXY_ADDRESS,
    ) as deployed:
        yield deployed


@pytest.fixture(scope="module")
def misconfigured(django_db_setup, tmp_path_factory, static_root: Path) -> Iterator[Deployment]:
    """Behind the same proxy with SAGA_TRUSTED_PROXY_HOPS left unset: every client has the
    proxy's address."""
    with _deployed(
        tmp_path_factory.mktemp("misconfigured"), static_root, SAGA_TRUSTED_PROXY_IPS=PROXY_ADDRESS
    ) as deployed:
        yield deployed


def _login(base: str, username: str, password: str, *, address: str, device: str = "") -> httpx.Response:
    """The login form, GET then POST, from ``address`` (with a known-device cookie when given).
    The cookies are Secure (DEBUG=0) and these are plain-HTTP hops, so they are carried by hand,
    as a browser would over https."""
    with client(address, base_url=base, headers={"Host": HOST}, timeout=30) as http:
        form = http.get("/login/")
        assert form.status_code == 200, (form.status_code, form.headers)
        token = form.cookies["csrftoken"]
        cookies = f"csrftoken={token}" + (f"; saga_known_device={device}" if device else "")
        return http.post(
            "/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token},
            headers={"Cookie": cookies, "Origin": f"https://{HOST}"},
        )


def _admin(tenant) -> None:
    from django.contrib.auth import get_user_model

    from ledger.models import Membership

    admin = get_user_model().objects.create_user(username="ops", password=PASSWORD)
    Membership.objects.create(user=admin, tenant=tenant, role="admin")


def _signed_in(response: httpx.Response) -> bool:
    return (
        response.status_code == 302
        and response.headers["Location"] == "/"
        and "sessionid" in response.cookies
    )


def test_five_wrong_passwords_from_one_client_do_not_lock_the_admin_out_from_another(
    deployment: Deployment, tenant
) -> None:
    """Pass: through the proxy, five wrong passwords for ``ops`` from 127.0.0.10 lock that client
    out (429, even with the right password), and ``ops`` signs in from 127.0.0.11 through the same
    proxy. Fails if the web counted the proxy's address (SAGA_TRUSTED_PROXY_HOPS unset)."""
    _admin(tenant)
    base = deployment.proxy.url
    answers = [_login(base, "ops", f"guess-{n}", address="127.0.0.10").status_code for n in range(5)]
    assert answers == [200, 200, 200, 200, 429]
    assert _login(base, "ops", PASSWORD, address="127.0.0.10").status_code == 429
    assert _signed_in(_login(base, "ops", PASSWORD, address="127.0.0.11"))


def test_left_unset_the_admins_own_browser_still_signs_in(misconfigured: Deployment, tenant) -> None:
    """Pass: with SAGA_TRUSTED_PROXY_HOPS left unset behind the proxy, five wrong passwords for
    ``ops`` from 127.0.0.10 lock the proxy's address out: a browser that never signed in gets 429
    from 127.0.0.11 even with the right password. The admin's own browser, which signed in before
    (its known-device cookie), still signs in. Before, the admin was locked out everywhere."""
    _admin(tenant)
    base = misconfigured.proxy.url
    first = _login(base, "ops", PASSWORD, address="127.0.0.11")
    assert _signed_in(first)
    device = first.cookies["saga_known_device"]
    answers = [_login(base, "ops", f"guess-{n}", address="127.0.0.10").status_code for n in range(5)]
    assert answers == [200, 200, 200, 200, 429]
    assert _login(base, "ops", PASSWORD, address="127.0.0.11").status_code == 429
    assert _signed_in(_login(base, "ops", PASSWORD, address="127.0.0.11", device=device))


def test_a_direct_clients_x_forwarded_proto_is_not_trusted(deployment: Deployment) -> None:
    """Pass: a client reaching the web directly from 127.0.0.12 with ``X-Forwarded-Proto: https``
    is redirected to https (its claim ignored); the same request through the proxy is served; and
    from the proxy's own address the header is believed (the setting decides, not the header)."""
    claims_https = {"Host": HOST, "X-Forwarded-Proto": "https"}
    with client("127.0.0.12", base_url=deployment.web, timeout=30) as direct:
        refused = direct.get("/login/", headers=claims_https)
    assert refused.status_code == 301, refused.status_code
    assert refused.headers["Location"] == f"https://{HOST}/login/"
    with client("127.0.0.12", base_url=deployment.proxy.url, timeout=30) as proxied:
        assert proxied.get("/login/", headers={"Host": HOST}).status_code == 200
    with client(PROXY_ADDRESS, base_url=deployment.web, timeout=30) as from_the_proxy_address:
        assert from_the_proxy_address.get("/login/", headers=claims_https).status_code == 200
