"""The callback against a provider that answers malformed JSON where the protocol wants an object
(a token answer, a key set, claims of the wrong types): each is a failed sign-in, back to the
login page, never a 500; claims of the wrong type grant nothing."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.models import SsoIdentity
from dashboard.sso import discovery
from dashboard.sso.conf import SsoSettings
from ledger.models import Membership
from tests.support.hostile_oidc import CLIENT_ID, CLIENT_SECRET, HostileProvider, hostile_provider


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


def _callback(client, provider: HostileProvider) -> Any:
    """A sign-in started as a browser starts it, and the provider sending the person back."""
    started = client.get("/oidc/authenticate/")
    assert started.status_code == 302 and started["Location"].startswith(provider.issuer)
    state, stored = next(iter(client.session["oidc_states"].items()))
    provider.nonce = stored["nonce"]
    return client.get("/oidc/callback/", {"code": "a-code", "state": state})


def test_a_well_formed_answer_signs_in(client, provider):
    """The harness itself: with nothing malformed, the sign-in works."""
    provider.userinfo = {"sub": "mallory", "groups": ["saga:acme:viewer"], "preferred_username": "mallory"}
    response = _callback(client, provider)
    assert (response.status_code, response["Location"]) == (302, "/")
    user = SsoIdentity.objects.get(subject="mallory").user
    assert Membership.objects.get(user=user).role == "viewer"


MALFORMED: dict[str, dict[str, Any]] = {
    "token answer is a list": {"token": ["id_token", "access_token"]},
    "token answer is a string": {"token": "id_token"},
    "token answer is null": {"token": None},
    "key set is a list": {"jwks": [{"kid": "hostile-1"}]},
    "key set's keys are a number": {"jwks": {"keys": 5}},
    "a key is a string": {"jwks": {"keys": ["hostile-1"]}},
    "a key is null": {"jwks": {"keys": [None]}},
    "userinfo is a list": {"userinfo": [{"sub": "mallory"}]},
    "userinfo's sub is a list": {"userinfo": {"sub": ["mallory"]}},
    "ID token's sub is an object": {"id_claims": {"sub": {"id": "mallory"}}},
    "ID token's aud is an object": {"id_claims": {"aud": {"client": CLIENT_ID}}},
    "ID token's iss is a list": {"id_claims": {"iss": ["http://127.0.0.1"]}},
}


@pytest.mark.parametrize("answers", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_answer_is_a_failed_sign_in(client, provider, answers):
    for name, value in answers.items():
        setattr(provider, name, value)
    response = _callback(client, provider)
    assert (response.status_code, response["Location"]) == (302, "/login/?sso=failed")
    assert not SsoIdentity.objects.exists()
    assert "_auth_user_id" not in client.session


WRONG_TYPES: dict[str, dict[str, Any]] = {
    "groups is an object": {"groups": {"saga:acme:admin": True}},
    "groups is a number": {"groups": 7},
    "groups holds objects and lists": {"groups": [{"saga": "acme:admin"}, ["saga:acme:admin"]]},
    "email is a list": {"email": ["mallory@example.com"], "groups": {"x": 1}},
    "names are numbers": {"preferred_username": 42, "given_name": ["M"], "family_name": {"x": 1}},
}


@pytest.mark.parametrize("claims", list(WRONG_TYPES.values()), ids=list(WRONG_TYPES))
def test_claims_of_the_wrong_type_grant_nothing(client, provider, claims):
    provider.userinfo = {"sub": "mallory", **claims}
    response = _callback(client, provider)
    assert response.status_code == 403  # signed in at the provider, no role here
    assert "No access" in response.content.decode()
    user = SsoIdentity.objects.get(subject="mallory").user
    assert not Membership.objects.filter(user=user).exists()
    assert (user.email, user.first_name, user.last_name) == ("", "", "")
    assert "_auth_user_id" not in client.session


# --- Mounted under a prefix ----------------------------------------------------------------------


@pytest.fixture
def mounted_under_saga(settings):
    """The installation mounted under /saga (a reverse proxy's mount, FORCE_SCRIPT_NAME). Django's
    WSGI handler sets the script prefix reverse() uses from it at every request; the test client's
    handler does not, so it is set here as the server would."""
    from django.urls import set_script_prefix

    settings.FORCE_SCRIPT_NAME = "/saga"
    set_script_prefix("/saga/")
    yield "/saga"
    set_script_prefix("/")


def test_under_a_prefix_the_callback_signs_in(client, provider, mounted_under_saga):
    provider.userinfo = {"sub": "mallory", "groups": ["saga:acme:operator"]}
    started = client.get("/oidc/authenticate/")
    assert "redirect_uri=http%3A%2F%2Ftestserver%2Fsaga%2Foidc%2Fcallback%2F" in started["Location"]
    state, stored = next(iter(client.session["oidc_states"].items()))
    provider.nonce = stored["nonce"]
    # The proxy strips /saga: the path the application routes is /oidc/callback/.
    response = client.get("/oidc/callback/", {"code": "a-code", "state": state})
    assert (response.status_code, response["Location"]) == (302, "/saga/")
    assert client.session["_auth_user_id"] == str(SsoIdentity.objects.get(subject="mallory").user_id)


def test_a_superuser_without_a_role_is_still_signed_in(client, provider):
    """No role in any tenant is the no-access page (dashboard.permissions' rule), except for a
    superuser made so here by hand: the Django admin and the workers' pages are theirs."""
    provider.userinfo = {"sub": "mallory", "groups": []}
    assert _callback(client, provider).status_code == 403
    user = SsoIdentity.objects.get(subject="mallory").user
    user.is_superuser = True
    user.save(update_fields=["is_superuser"])
    response = _callback(client, provider)
    assert (response.status_code, response["Location"]) == (302, "/")
    assert client.session["_auth_user_id"] == str(user.pk)
