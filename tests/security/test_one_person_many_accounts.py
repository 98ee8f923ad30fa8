"""One person with a local account and a single sign-on account is one approver.

An SSO rollout gives every person who had a local account a second one (the provider's account,
keyed by issuer and ``sub``), and the local account's approver keys keep working with
``SAGA_LOCAL_LOGIN=0``. Each used to count as a person of its own: Bob could grant a two-person
approval twice, and grant through one account what he asked for through the other. Now accounts
sharing an e-mail address — the provider's only when it says it verified it — are one person for
the approval rules, and an address the provider did not verify is neither identity nor a place
approval details are sent to.

Every sign-in goes through the real callback against a real (test) OpenID provider over HTTP;
Bob's approver key decides over the API.
"""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.models import SsoIdentity
from dashboard.sso import discovery
from dashboard.sso.conf import SsoSettings
from infra import errors
from ledger.audit import Actor
from ledger.models import Membership
from ledger.services import runs
from recovery.actions.approvals import action_record_gated, approval_approve
from recovery.models import Approval
from recovery.transitions import approvals
from tests.factories import charge_policy, issue_key, load_policy_file
from tests.support.api import Api
from tests.support.hostile_oidc import CLIENT_ID, CLIENT_SECRET, HostileProvider, hostile_provider

pytestmark = pytest.mark.django_db

BOBS_EMAIL = "bob@acme.example"
TWO_FOR_BIG = [{"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approvers": 2}}]


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


def _sso_sign_in(client, provider: HostileProvider, subject: str, **claims: Any):
    """A sign-in as a browser makes it, the provider answering ``claims``: the user it made."""
    provider.subject = subject
    provider.userinfo = {"sub": subject, "groups": ["saga:acme:approver"], **claims}
    started = client.get("/oidc/authenticate/")
    assert started.status_code == 302 and started["Location"].startswith(provider.issuer)
    state, stored = next(iter(client.session["oidc_states"].items()))
    provider.nonce = stored["nonce"]
    response = client.get("/oidc/callback/", {"code": "a-code", "state": state})
    assert (response.status_code, response["Location"]) == (302, "/"), response
    client.logout()
    return SsoIdentity.objects.select_related("user").get(subject=subject).user


@pytest.fixture
def bob_at_the_provider(client, provider, bob):
    """The rollout: Bob had a local account (and an approver key of it); now he signs in through
    the provider, which verified his address (spelled in another case), and gets a second one."""
    bob.email = BOBS_EMAIL
    bob.save(update_fields=["email"])
    sso_bob = _sso_sign_in(
        client, provider, "idp|bob", preferred_username="bob", email="Bob@Acme.example", email_verified=True
    )
    assert sso_bob.pk != bob.pk and Membership.objects.get(user=sso_bob).role == "approver"
    return sso_bob


def _big_charge(tenant, actor: Actor) -> Approval:
    load_policy_file({"policies": [charge_policy(rules=TWO_FOR_BIG)]})
    run = runs.run_create(tenant=tenant, actor=actor, agent="billing", request="Charge ACME-9")
    action = action_record_gated(
        run=run, actor=actor, tool="payments.charge", idempotency_key="big", args={"amount": 50000}
    ).action
    return action.approvals.get()


def test_a_local_account_and_an_sso_account_of_one_person_are_one_approver(
    tenant, agent, bob, bob_at_the_provider
):
    """Bob grants as his SSO account; his local account's approver key (which SAGA_LOCAL_LOGIN=0
    does not stop) is refused as the same person, and so is his local login."""
    _key, secret = issue_key(tenant, "bobs-bot", "approver", owner=bob)
    approval = _big_charge(tenant, agent)
    assert (
        approval_approve(
            approval=approval, actor=Actor.for_user(bob_at_the_provider), reason="as SSO bob"
        ).status
        == Approval.Status.PENDING
    )

    by_key = Api(secret).post(f"/approvals/{approval.pk}/approve", {"reason": "as local bob's key"})
    assert (by_key.status_code, by_key.json()["error"]["code"]) == (409, "already_granted"), by_key.content
    with pytest.raises(errors.AlreadyGranted):
        approval_approve(
            approval=Approval.objects.get(pk=approval.pk), actor=Actor.for_user(bob), reason="as local bob"
        )
    current = Approval.objects.get(pk=approval.pk)
    assert current.status == Approval.Status.PENDING and current.grants.count() == 1


def test_a_persons_other_account_cannot_grant_what_they_asked_for(tenant, bob, bob_at_the_provider):
    """Bob's local account owns the agent key that asked; his SSO account is no second pair of
    eyes on it."""
    key, _secret = issue_key(tenant, "billing", "agent", owner=bob)
    approval = _big_charge(tenant, Actor.for_key(key))
    with pytest.raises(errors.SelfApproval):
        approval_approve(approval=approval, actor=Actor.for_user(bob_at_the_provider), reason="four eyes?")
    assert not Approval.objects.get(pk=approval.pk).grants.exists()


@pytest.mark.parametrize("verified", [False, "false", None], ids=["false", "the string false", "absent"])
def test_an_unverified_email_is_neither_identity_nor_where_approval_details_go(
    client, provider, tenant, bob, verified
):
    """The provider did not verify the address: it is not stored, so it neither makes the account
    anyone's (identity) nor receives an escalated approval's details."""
    bob.email = BOBS_EMAIL
    bob.save(update_fields=["email"])
    claims: dict[str, Any] = {"email": "mallory@acme.example"}
    if verified is not None:
        claims["email_verified"] = verified
    user = _sso_sign_in(client, provider, "idp|mallory", preferred_username="mallory", **claims)
    assert user.email == ""
    matching = _sso_sign_in(
        client,
        provider,
        "idp|not-bob",
        preferred_username="notbob",
        email=BOBS_EMAIL,
        email_verified=verified,
    )
    assert matching.email == "" and approvals.same_person(matching.pk) == {matching.pk}
    approval = _big_charge(tenant, Actor.system("tests"))
    approval.escalate_to = "approver"
    assert "mallory@acme.example" not in approvals.escalation_emails(approval)
    assert approvals.escalation_emails(approval) == [BOBS_EMAIL]
