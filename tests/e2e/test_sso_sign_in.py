"""Single sign-on end to end: Chromium signs in through a real OpenID Provider (oidc-provider,
started here) on the provider's own login and consent pages, lands on the recovery queue with the
role its groups claim maps to; after the group changes, the next sign-in has lost the role, and
with no group left it meets the no-access page. The same provider also answers the callback's
hostile requests (a forged state, a code it never issued, an error)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from dashboard.models import SsoIdentity
from dashboard.sso import discovery
from dashboard.sso.conf import SsoSettings
from ledger.models import Membership, Tenant
from tests.support.browser import screenshot
from tests.support.oidc import CLIENT_ID, CLIENT_SECRET, SCOPES, OidcPeer, oidc_peer
from tests.support.parallel import per_worker
from tests.support.processes import ROOT

PROVIDER = "Test IdP"
ALICE = {
    "email": "alice@example.com",
    "email_verified": True,  # an unverified address is not stored
    "preferred_username": "alice",
    "name": "Alice Approver",
}


@pytest.fixture(scope="module")
def peer(live_server):
    workdir = per_worker(ROOT / "artifacts" / "oidc-peer")
    with oidc_peer(
        redirect_uris=[f"{live_server.url}/oidc/callback/", "http://testserver/oidc/callback/"],
        accounts={"alice": {**ALICE, "groups": ["saga:acme:approver", "staff-wiki", "saga:initech:admin"]}},
        workdir=workdir,
    ) as running:
        yield running


@pytest.fixture
def sso_on(settings, peer: OidcPeer):
    settings.SAGA_SSO = SsoSettings(
        issuer=peer.issuer,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        scopes=SCOPES,
        provider_name=PROVIDER,
        timeout_s=10,
    )
    settings.AUTHENTICATION_BACKENDS = ["dashboard.sso.backend.SsoBackend", *settings.AUTHENTICATION_BACKENDS]
    discovery.forget_metadata()
    yield peer
    discovery.forget_metadata()


@pytest.fixture
def acme(transactional_db):
    return Tenant.objects.create(slug="acme", name="Acme Corp")


def _sign_in_with_provider(page, live_server, *, first_time: bool) -> None:
    page.goto("/login/")
    page.get_by_role("link", name=f"Sign in with {PROVIDER}").click()
    if first_time:
        # The provider's own pages: its login form, then its consent.
        page.wait_for_selector("input[name=login]")
        page.fill("input[name=login]", "alice")
        page.fill("input[name=password]", "whatever-the-provider-checks")
        page.click("button[type=submit]")
        page.wait_for_selector("button[type=submit]:has-text('Continue')")
        page.click("button[type=submit]:has-text('Continue')")


def _role(tenant: Tenant) -> str | None:
    user = SsoIdentity.objects.get(subject="alice").user
    return Membership.objects.filter(user=user, tenant=tenant).values_list("role", flat=True).first()


def test_sign_in_maps_the_group_and_a_changed_group_is_lost_at_the_next_sign_in(
    page, live_server, sso_on, acme, client, settings
):
    # Failed callbacks from this address first, up to axes' lockout: a real sign-in from the same
    # address is not held by it (the SSO backend answers before the lockout is consulted).
    client.peer_issuer = sso_on.issuer
    for _ in range(settings.AXES_FAILURE_LIMIT):
        last = client.get("/oidc/callback/", {"code": "forged-code", "state": _started(client)})
    assert last.status_code == 429

    _sign_in_with_provider(page, live_server, first_time=True)
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator(".whoami").inner_text() == "alice"
    assert page.get_by_role("heading", name="Recovery queue").is_visible()
    assert _role(acme) == "approver"
    assert not Tenant.objects.filter(slug="initech").exists()  # a claim creates no tenant
    assert get_user_model().objects.filter(email="alice@example.com").count() == 1
    screenshot(page, "sso-signed-in-queue")
    assert page.csp_violations == []

    # Alice moves from the approvers' group to the viewers' at the provider.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login/")
    sso_on.set_account("alice", **ALICE, groups=["saga:acme:viewer"])
    _sign_in_with_provider(page, live_server, first_time=False)  # the provider remembers her
    page.wait_for_url(f"{live_server.url}/")
    assert _role(acme) == "viewer"
    assert get_user_model().objects.filter(email="alice@example.com").count() == 1

    # And out of every Saga group: signed in at the provider, no access here.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login/")
    sso_on.set_account("alice", **ALICE, groups=["staff-wiki"])
    _sign_in_with_provider(page, live_server, first_time=False)
    page.wait_for_selector("h1:has-text('No access')")
    assert "gives you no role in Saga Admin" in page.content()
    screenshot(page, "sso-no-access")
    assert _role(acme) is None
    page.goto("/")
    page.wait_for_url("**/login/?next=/")  # not signed in here


def test_the_login_page_offers_only_the_provider_when_local_login_is_off(page, live_server, sso_on, settings):
    settings.SAGA_SSO = SsoSettings(**{**settings.SAGA_SSO.__dict__, "local_login": False})
    page.goto("/login/")
    assert page.get_by_role("link", name=f"Sign in with {PROVIDER}").is_visible()
    assert page.locator("input[type=password]").count() == 0
    screenshot(page, "sso-login-only")


# --- The callback under hostile requests, against the same provider (no browser) ---------------


def _started(client) -> str:
    """Start a sign-in as a browser would; the state the callback must come back with."""
    response = client.get("/oidc/authenticate/")
    assert response.status_code == 302
    assert response["Location"].startswith(client.peer_issuer)
    assert "code_challenge_method=S256" in response["Location"]
    return next(iter(client.session["oidc_states"]))


@pytest.fixture
def sso_client(client, sso_on):
    client.peer_issuer = sso_on.issuer
    return client


def test_a_code_the_provider_never_issued_fails_cleanly(sso_client, acme):
    state = _started(sso_client)
    response = sso_client.get("/oidc/callback/", {"code": "forged-code", "state": state})
    assert (response.status_code, response["Location"]) == (302, "/login/?sso=failed")
    assert not SsoIdentity.objects.exists()
    page = sso_client.get(response["Location"])
    assert f"Signing in with {PROVIDER} did not complete" in page.content.decode()


def test_a_state_this_session_never_started_is_refused(sso_client, acme):
    _started(sso_client)
    response = sso_client.get("/oidc/callback/", {"code": "x", "state": "not-ours"})
    assert response.status_code == 400
    assert not SsoIdentity.objects.exists()


def test_the_providers_error_answer_goes_back_to_the_login_page(sso_client, acme):
    state = _started(sso_client)
    response = sso_client.get("/oidc/callback/", {"error": "access_denied", "state": state})
    assert (response.status_code, response["Location"]) == (302, "/login/?sso=failed")


def test_a_next_address_elsewhere_is_not_kept(sso_client, acme):
    sso_client.get("/oidc/authenticate/", {"next": "https://evil.example.com/phish"})
    assert sso_client.session["oidc_login_next"] is None
    sso_client.get("/oidc/authenticate/", {"next": "/approvals/"})
    assert sso_client.session["oidc_login_next"] == "/approvals/"


def test_failed_callbacks_count_in_the_lockout_without_locking_out_passwords(sso_client, acme, settings):
    alice = get_user_model().objects.create_user(username="alice", password="correct-horse-battery")
    Membership.objects.create(user=alice, tenant=acme, role="operator")
    answers = []
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        state = _started(sso_client)
        answers.append(sso_client.get("/oidc/callback/", {"code": "forged-code", "state": state}).status_code)
    # Refused each time, and from the limit on locked out for this address (axes' page, not a 500),
    # as failed passwords are.
    limit = settings.AXES_FAILURE_LIMIT
    assert answers == [302] * (limit - 1) + [429, 429]
    # The lock is on failed single sign-on from here, not on Alice's password.
    signed_in = sso_client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert (signed_in.status_code, signed_in["Location"]) == (302, "/")


def test_metadata_naming_another_issuer_is_not_used(client, peer, settings, acme):
    """The same provider reached by another name: its discovery document names its own issuer,
    which is not the configured one, so no sign-in starts (OIDC Discovery 4.3)."""
    other_name = peer.issuer.replace("127.0.0.1", "localhost")
    settings.SAGA_SSO = SsoSettings(
        issuer=other_name, client_id=CLIENT_ID, client_secret=CLIENT_SECRET, provider_name=PROVIDER
    )
    discovery.forget_metadata()
    response = client.get("/oidc/authenticate/")
    discovery.forget_metadata()
    assert (response.status_code, response["Location"]) == (302, "/login/?sso=unavailable")
    page = client.get(response["Location"]).content.decode()
    assert f"{PROVIDER} cannot be reached just now" in page


def test_an_email_link_above_the_risk_threshold_signs_in_through_the_provider_and_comes_back(
    page, live_server, sso_on, acme, settings
):
    """Above ``SAGA_EMAIL_LINK_MAX_RISK`` a decision link signs its person in first, through SSO
    where it is configured: Alice opens the Approve link of her e-mail, signs in at the provider,
    lands back on the link's confirmation page and confirms; the approval is hers, via e-mail."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create
    from recovery.models import Approval
    from tests.support.email_links import (
        ask_approval,
        deliver_mail,
        email_channel,
        link,
        mail_settings,
        only_mail,
    )
    from tests.support.smtp import smtp_server

    _sign_in_with_provider(page, live_server, first_time=True)  # her account, from the claims
    page.wait_for_url(f"{live_server.url}/")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login/")
    key = agent_key_create(
        tenant=acme, name="billing-agent", scopes=["agent"], actor=Actor.system("tests")
    ).key
    with smtp_server() as smtp:
        mail_settings(settings, smtp, live_server)
        email_channel(acme, ALICE["email"])
        approval = ask_approval(acme, Actor.for_key(key), risk="critical")
        deliver_mail()
        approve = link(only_mail(smtp, ALICE["email"]), "Approve")

    page.goto(approve)
    page.wait_for_url(lambda url: "/login/?next=" in url)
    page.get_by_role("link", name=f"Sign in with {PROVIDER}").click()  # the provider remembers her
    page.wait_for_url(approve)
    page.get_by_role("button", name="Confirm: approve these arguments").click()
    page.wait_for_selector("text=Approved")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert approval.decided_by == SsoIdentity.objects.get(subject="alice").user
    assert approval.reason.startswith("Approved via e-mail by alice")
    assert page.csp_violations == []
