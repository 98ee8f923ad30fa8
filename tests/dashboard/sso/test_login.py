"""Signing in with single sign-on configured or not: off, nothing changes (no button, the callback
404, the password form as before); SAGA_LOCAL_LOGIN=0 takes the password form away and refuses its
POSTs (the dashboard's and the Django admin's); the configuration refuses to start half set."""

from __future__ import annotations

import os

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard.sso.conf import SsoSettings, sso_settings_from_env

SSO = SsoSettings(
    issuer="https://idp.example.com/realms/acme",
    client_id="saga",
    client_secret="s3cret",
    provider_name="Keycloak",
)


@pytest.fixture
def local_login_off(settings):
    settings.SAGA_SSO = SsoSettings(**{**SSO.__dict__, "local_login": False})


def test_without_sso_the_login_page_is_as_before(client, db):
    page = client.get("/login/").content.decode()
    assert 'type="password"' in page
    assert "Sign in with" not in page
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/", {"code": "x", "state": "y"}).status_code == 404


def test_without_sso_password_sign_in_works(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert (response.status_code, response["Location"]) == (302, "/")


def test_with_sso_the_page_offers_both(client, db, settings):
    settings.SAGA_SSO = SSO
    page = client.get("/login/?next=/approvals/").content.decode()
    assert 'href="/oidc/authenticate/?next=/approvals/"' in page
    assert "Sign in with Keycloak" in page
    assert 'type="password"' in page


def test_with_local_login_off_the_password_form_is_gone(client, db, local_login_off):
    page = client.get("/login/").content.decode()
    assert "Sign in with Keycloak" in page
    assert 'type="password"' not in page


def test_with_local_login_off_a_password_post_is_refused_unchecked(client, alice, local_login_off):
    response = client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert response.status_code == 403
    assert "Password sign-in is turned off" in response.content.decode()
    assert "_auth_user_id" not in client.session
    # Refused before any password is checked: no failure counted against Alice either.
    from axes.models import AccessAttempt

    assert not AccessAttempt.objects.exists()


def test_with_local_login_off_the_admin_login_sends_to_the_login_page(client, alice, local_login_off):
    response = client.get("/admin/login/?next=/admin/")
    assert (response.status_code, response["Location"]) == (302, "/login/?next=%2Fadmin%2F")
    refused = client.post("/admin/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert refused.status_code == 302
    assert "_auth_user_id" not in client.session


def test_with_local_login_on_the_admin_login_is_the_admins(client, db):
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert "Django administration" in response.content.decode()


def test_the_lockout_page_still_shows_the_form(client, alice, settings):
    settings.SAGA_SSO = SSO
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/login/", {"username": "alice", "password": "wrong-password-guess"})
    locked = client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert locked.status_code == 429
    page = locked.content.decode()
    assert 'type="password"' in page and "Sign in with Keycloak" in page


# --- The configuration, from the environment ------------------------------------------------------

OIDC_VARIABLES = (
    "SAGA_OIDC_ISSUER",
    "SAGA_OIDC_CLIENT_ID",
    "SAGA_OIDC_CLIENT_SECRET",
    "SAGA_OIDC_CLIENT_SECRET_FILE",
    "SAGA_OIDC_SCOPES",
    "SAGA_OIDC_ROLES_CLAIM",
    "SAGA_OIDC_ROLE_PREFIX",
    "SAGA_OIDC_PROVIDER_NAME",
    "SAGA_OIDC_TIMEOUT_S",
    "SAGA_LOCAL_LOGIN",
)


@pytest.fixture
def env(monkeypatch):
    for name in OIDC_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_unset_is_off(env):
    assert sso_settings_from_env() == SsoSettings()
    assert not sso_settings_from_env().enabled


def test_a_full_configuration(env, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    env.setenv("SAGA_OIDC_ISSUER", "https://login.example.com/realms/ops")
    env.setenv("SAGA_OIDC_CLIENT_ID", "saga-admin")
    env.setenv("SAGA_OIDC_CLIENT_SECRET_FILE", str(secret))
    env.setenv("SAGA_OIDC_SCOPES", "openid  email groups")
    env.setenv("SAGA_OIDC_ROLES_CLAIM", "roles")
    env.setenv("SAGA_OIDC_PROVIDER_NAME", "Entra ID")
    env.setenv("SAGA_LOCAL_LOGIN", "0")
    conf = sso_settings_from_env()
    assert (conf.enabled, conf.client_secret, conf.scopes, conf.claim, conf.prefix, conf.local_login) == (
        True,
        "from-a-file",
        "openid email groups",
        "roles",
        "saga",
        False,
    )


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"SAGA_OIDC_ISSUER": "https://idp.example.com"}, "SAGA_OIDC_CLIENT_ID and SAGA_OIDC_CLIENT_SECRET"),
        ({"SAGA_OIDC_CLIENT_ID": "saga"}, "SAGA_OIDC_ISSUER"),
        ({"SAGA_LOCAL_LOGIN": "0"}, "nobody could sign in"),
        ({"SAGA_LOCAL_LOGIN": "maybe"}, "SAGA_LOCAL_LOGIN"),
        (
            {
                "SAGA_OIDC_ISSUER": "http://idp.example.com",
                "SAGA_OIDC_CLIENT_ID": "a",
                "SAGA_OIDC_CLIENT_SECRET": "b",
            },
            "https:// URL is required",
        ),
        (
            {
                "SAGA_OIDC_ISSUER": "https://idp.example.com",
                "SAGA_OIDC_CLIENT_ID": "a",
                "SAGA_OIDC_CLIENT_SECRET": "b",
                "SAGA_OIDC_SCOPES": "email groups",
            },
            "must include openid",
        ),
        (
            {
                "SAGA_OIDC_ISSUER": "https://idp.example.com",
                "SAGA_OIDC_CLIENT_ID": "a",
                "SAGA_OIDC_CLIENT_SECRET": "b",
                "SAGA_OIDC_ROLE_PREFIX": "saga:x",
            },
            "no colon",
        ),
    ],
)
def test_a_half_configuration_refuses_to_start(env, variables, named):
    for name, value in variables.items():
        env.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=named):
        sso_settings_from_env()


def test_plain_http_only_to_this_machine(env):
    env.setenv("SAGA_OIDC_ISSUER", "http://127.0.0.1:9000")
    env.setenv("SAGA_OIDC_CLIENT_ID", "a")
    env.setenv("SAGA_OIDC_CLIENT_SECRET", "b")
    assert sso_settings_from_env().enabled


def test_a_provider_that_does_not_answer_sends_back_to_the_login_page(client, db, settings):
    from dashboard.sso import discovery
    from tests.support.processes import free_port

    settings.SAGA_SSO = SsoSettings(
        **{**SSO.__dict__, "issuer": f"http://127.0.0.1:{free_port()}", "timeout_s": 2}
    )
    discovery.forget_metadata()
    response = client.get("/oidc/authenticate/")
    assert (response.status_code, response["Location"]) == (302, "/login/?sso=unavailable")
    assert "Keycloak cannot be reached just now" in client.get(response["Location"]).content.decode()
    # The callback too: a failed sign-in, not a 500.
    settings.AUTHENTICATION_BACKENDS = ["dashboard.sso.backend.SsoBackend", *settings.AUTHENTICATION_BACKENDS]
    session = client.session
    session["oidc_states"] = {"s": {"nonce": "n", "code_verifier": "v"}}
    session.save()
    callback = client.get("/oidc/callback/", {"code": "c", "state": "s"})
    assert (callback.status_code, callback["Location"]) == (302, "/login/?sso=unavailable")


# --- Which backends authenticate ---------------------------------------------------------------


def test_the_backends_follow_the_configuration():
    from dashboard.sso.conf import PASSWORD_BACKEND, SSO_BACKEND, authentication_backends

    axes = "axes.backends.AxesStandaloneBackend"
    assert authentication_backends(SsoSettings()) == [axes, PASSWORD_BACKEND]
    assert authentication_backends(SSO) == [SSO_BACKEND, axes, PASSWORD_BACKEND]
    assert authentication_backends(SsoSettings(**{**SSO.__dict__, "local_login": False})) == [
        SSO_BACKEND,
        axes,
    ]


def test_with_local_login_off_no_password_authenticates_anywhere(rf, alice, settings):
    from django.contrib.auth import authenticate

    from dashboard.sso.conf import authentication_backends

    off = SsoSettings(**{**SSO.__dict__, "local_login": False})
    settings.SAGA_SSO = off
    settings.AUTHENTICATION_BACKENDS = authentication_backends(off)
    # Not through Django's authenticate(), which every login form and view calls.
    request = rf.post("/admin/login/")
    assert authenticate(request, username="alice", password="correct-horse-battery") is None
    # The same password, with password sign-in on, does.
    settings.SAGA_SSO = SSO
    settings.AUTHENTICATION_BACKENDS = authentication_backends(SSO)
    assert authenticate(rf.post("/admin/login/"), username="alice", password="correct-horse-battery") == alice


def test_the_settings_list_no_password_backend_when_local_login_is_off():
    import subprocess
    import sys

    from tests.support.processes import ROOT

    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "SECRET_KEY": "k" * 50,
        "SAGA_OIDC_ISSUER": "https://idp.example.com",
        "SAGA_OIDC_CLIENT_ID": "saga",
        "SAGA_OIDC_CLIENT_SECRET": "s3cret",
        "SAGA_LOCAL_LOGIN": "0",
    }
    shown = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(*settings.AUTHENTICATION_BACKENDS)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["dashboard.sso.backend.SsoBackend", "axes.backends.AxesStandaloneBackend"]


def test_a_deactivated_accounts_sso_session_ends_at_its_next_request(client, alice, settings):
    settings.AUTHENTICATION_BACKENDS = ["dashboard.sso.backend.SsoBackend", *settings.AUTHENTICATION_BACKENDS]
    client.force_login(alice, backend="dashboard.sso.backend.SsoBackend")
    assert client.get("/").status_code == 200
    alice.is_active = False
    alice.save(update_fields=["is_active"])
    response = client.get("/")
    assert response.status_code == 302 and "/login" in response["Location"]
