"""With single sign-on on, every anonymous ``GET /oidc/authenticate/`` wrote a
session row (the sign-in's state, nonce and PKCE verifier) that lived SESSION_COOKIE_AGE, and
nothing ever removed it: anyone could fill the sessions table. Now one client address starts only
``SAGA_OIDC_START_RATE`` sign-ins per window (429 after), the row an anonymous start writes
expires with its state (``SSO_STATE_MAX_AGE_S``), and the worker's hourly ``sessions_prune``
deletes expired sessions as ``clearsessions`` does. Signing in still gives the session its full
lifetime."""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from dashboard.sso import discovery
from dashboard.sso.conf import SsoSettings
from dashboard.views.sso import SSO_STATE_MAX_AGE_S
from recovery import jobs, scheduling
from tests.support.hostile_oidc import CLIENT_ID, CLIENT_SECRET, hostile_provider

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider(settings, tenant):
    with hostile_provider() as running:
        settings.SAGA_SSO = SsoSettings(
            issuer=running.issuer, client_id=CLIENT_ID, client_secret=CLIENT_SECRET, timeout_s=5
        )
        settings.AUTHENTICATION_BACKENDS = [
            "dashboard.sso.backend.SsoBackend",
            *settings.AUTHENTICATION_BACKENDS,
        ]
        discovery.forget_metadata()
        yield running
        discovery.forget_metadata()


def _address() -> str:
    # An address of this test run alone: the throttle's window outlives the test in Redis.
    return str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("198.18.0.0")) + uuid.uuid4().int % 2**17))


def test_anonymous_sign_in_starts_from_one_address_are_throttled(provider, settings):
    settings.SAGA_SSO = replace(settings.SAGA_SSO, start_rate="5/m")
    attacker = _address()
    rows = Session.objects.count()
    first = Client(REMOTE_ADDR=attacker)
    assert first.get("/oidc/authenticate/").status_code == 302
    for _ in range(4):  # each a new cookie-less client, as a script sends them
        assert Client(REMOTE_ADDR=attacker).get("/oidc/authenticate/").status_code == 302
    assert Session.objects.count() == rows + 5
    for cookie in ({}, {"sessionid": "made-up-session-key"}):
        refused = Client(REMOTE_ADDR=attacker, cookies=cookie).get("/oidc/authenticate/")
        assert refused.status_code == 429
        assert 0 < int(refused["Retry-After"]) <= 60
    assert Session.objects.count() == rows + 5
    # A browser with its sign-in under way may start again (its own row, no new one) …
    assert first.get("/oidc/authenticate/").status_code == 302
    # … and another address is not held back by this one.
    assert Client(REMOTE_ADDR=_address()).get("/oidc/authenticate/").status_code == 302
    assert Session.objects.count() == rows + 6


def test_the_row_an_anonymous_start_writes_expires_with_its_state_and_is_pruned(provider):
    client = Client(REMOTE_ADDR=_address())
    before = timezone.now()
    assert client.get("/oidc/authenticate/").status_code == 302
    row = Session.objects.get(session_key=client.cookies[django_settings.SESSION_COOKIE_NAME].value)
    assert row.expire_date <= before + timedelta(seconds=SSO_STATE_MAX_AGE_S + 5)
    assert "oidc_states" in row.get_decoded()
    # One that started long enough ago (its state expired), left by a client that never came back.
    stale = SessionStore()
    stale["oidc_states"] = {"s": {"nonce": "n", "code_verifier": "v"}}
    stale.set_expiry(timezone.now() - timedelta(seconds=1))
    stale.create()
    assert Session.objects.filter(session_key=stale.session_key).exists()
    every = {p.func: p.every_s for p in scheduling.periodic_jobs()}
    assert every["recovery.jobs.sessions_prune"] == scheduling.PRUNE_EVERY_S
    jobs.sessions_prune()
    assert not Session.objects.filter(session_key=stale.session_key).exists()
    assert Session.objects.filter(pk=row.pk).exists()


def test_signing_in_gives_the_session_its_full_lifetime(provider, settings):
    provider.userinfo = {"sub": "mallory", "groups": ["saga:acme:viewer"], "preferred_username": "mallory"}
    client = Client(REMOTE_ADDR=_address())
    assert client.get("/oidc/authenticate/").status_code == 302
    state, stored = next(iter(client.session["oidc_states"].items()))
    provider.nonce = stored["nonce"]
    before = timezone.now()
    response = client.get("/oidc/callback/", {"code": "a-code", "state": state})
    assert (response.status_code, response["Location"]) == (302, "/")
    row = Session.objects.get(session_key=client.cookies[settings.SESSION_COOKIE_NAME].value)
    assert "_auth_user_id" in row.get_decoded()
    assert row.expire_date >= before + timedelta(seconds=settings.SESSION_COOKIE_AGE - 5)
