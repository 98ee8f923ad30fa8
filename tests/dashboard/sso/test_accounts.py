"""The one Django user per provider account (issuer + sub) and the memberships single sign-on
manages: set from the claim at every sign-in, never touching roles granted here by hand, never
creating a tenant; and an SSO user goes through the approval rules as the person it is."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from dashboard.models import SsoIdentity, SsoMembership
from dashboard.permissions import Capability, can, tenant_ids_for
from dashboard.sso.accounts import Profile, sso_sign_in
from infra import errors
from ledger.audit import Actor
from ledger.models import Event, Membership, Tenant
from recovery.actions.approvals import approval_approve
from recovery.models import Approval
from tests.factories import charge_policy, load_policy_file, new_run
from tests.support.api import Api

ISSUER = "https://idp.example.com"
User = get_user_model()


def _sign_in(subject: str, wanted: dict[str, str] | None = None, **profile: str):
    return sso_sign_in(issuer=ISSUER, subject=subject, profile=Profile(**profile), wanted=wanted or {})


def _roles(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))


def test_the_first_sign_in_makes_a_user_without_a_password(tenant):
    signed = _sign_in("sub-1", {"acme": "approver"}, preferred_username="ana", email="ana@example.com")
    assert signed.created
    user = signed.user
    assert (user.username, user.email) == ("ana", "ana@example.com")
    assert not user.has_usable_password()
    assert SsoIdentity.objects.get(user=user).subject == "sub-1"
    assert _roles(user) == {"acme": "approver"}
    assert signed.added == ["acme"]
    assert tenant_ids_for(User.objects.get(pk=user.pk)) == [tenant.pk]


def test_the_same_subject_is_the_same_user_whatever_it_is_renamed_to(tenant):
    first = _sign_in("sub-1", {"acme": "approver"}, preferred_username="ana", email="ana@example.com").user
    again = _sign_in("sub-1", {"acme": "approver"}, preferred_username="ana.b", email="ana.b@example.org")
    assert not again.created
    assert again.user.pk == first.pk
    assert again.user.email == "ana.b@example.org"  # the profile follows the provider
    assert again.user.username == "ana"  # the name people saw on decisions stays
    assert User.objects.count() == 1


def test_two_accounts_with_one_email_are_two_users(tenant):
    one = _sign_in("sub-1", {"acme": "approver"}, preferred_username="ana", email="shared@example.com").user
    two = _sign_in("sub-2", {"acme": "approver"}, preferred_username="ana", email="shared@example.com").user
    assert one.pk != two.pk
    assert (one.username, two.username) == ("ana", "ana-2")


def test_a_local_user_of_the_same_name_is_never_taken_over(tenant, bob):
    signed = _sign_in("sub-9", {}, preferred_username="bob", email="bob@example.com")
    assert signed.user.pk != bob.pk
    assert signed.user.username == "bob-2"
    assert _roles(bob) == {"acme": "approver"}
    assert bob.has_usable_password()


def test_a_name_taken_by_an_sso_account_gets_no_role_or_password_by_name(tenant):
    """Someone with no role signs in first as "carol" (a name their provider account chose); an
    operator who later runs create_staff for carol must not hand that account the role."""
    from django.core.management import CommandError, call_command

    squatter = _sign_in("sub-squat", {}, preferred_username="carol").user
    assert squatter.username == "carol"
    with pytest.raises(CommandError, match="signs in through single sign-on"):
        call_command(
            "create_staff",
            "carol",
            "--password",
            "correct-horse-battery-9",
            "--tenant",
            "acme",
            "--role",
            "admin",
        )
    squatter.refresh_from_db()
    assert _roles(squatter) == {} and not squatter.has_usable_password()


def test_the_same_subject_at_another_issuer_is_another_user(tenant):
    one = _sign_in("sub-1", preferred_username="ana").user
    other = sso_sign_in(
        issuer="https://other.example.com", subject="sub-1", profile=Profile(), wanted={}
    ).user
    assert one.pk != other.pk


def test_roles_follow_the_claim_at_every_sign_in(tenant, other_tenant):
    user = _sign_in("sub-1", {"acme": "approver", "globex": "viewer"}).user
    assert _roles(user) == {"acme": "approver", "globex": "viewer"}

    changed = _sign_in("sub-1", {"acme": "viewer"})
    assert (changed.changed, changed.removed, changed.added) == (["acme"], ["globex"], [])
    assert _roles(user) == {"acme": "viewer"}

    gone = _sign_in("sub-1", {})
    assert gone.removed == ["acme"]
    assert _roles(user) == {}
    assert not SsoMembership.objects.exists()
    assert tenant_ids_for(User.objects.get(pk=user.pk)) == []
    # Each change is audited as any role change is, by single sign-on.
    kinds = list(
        Event.objects.filter(kind__startswith="membership.").order_by("id").values_list("kind", "actor_label")
    )
    assert [kind for kind, _ in kinds] == [
        "membership.set",
        "membership.set",
        "membership.set",
        "membership.removed",
        "membership.removed",
    ]
    assert {label for _, label in kinds} == {f"sso {ISSUER}"}


def test_a_claim_never_creates_a_tenant(tenant):
    signed = _sign_in("sub-1", {"acme": "viewer", "initech": "admin"})
    assert signed.unknown_tenants == ["initech"]
    assert not Tenant.objects.filter(slug="initech").exists()
    assert _roles(signed.user) == {"acme": "viewer"}


def test_a_role_granted_here_by_hand_is_left_as_granted(tenant, other_tenant):
    user = _sign_in("sub-1", {"acme": "viewer"}).user
    # An admin gives the SSO user a role at Globex by hand (create_staff, the Django admin).
    Membership.objects.create(user=user, tenant=other_tenant, role="operator")
    signed = _sign_in("sub-1", {"acme": "viewer", "globex": "admin"})
    assert signed.kept_local == ["globex"]
    assert _roles(user) == {"acme": "viewer", "globex": "operator"}
    # Leaving the group takes away what SSO granted, not what was granted by hand.
    _sign_in("sub-1", {})
    assert _roles(user) == {"globex": "operator"}


def test_an_admin_role_opens_the_django_admin_and_losing_it_closes_it(tenant):
    user = _sign_in("sub-1", {"acme": "admin"}).user
    user.refresh_from_db()
    assert user.is_staff and not user.is_superuser
    _sign_in("sub-1", {"acme": "viewer"})
    user.refresh_from_db()
    assert not user.is_staff


# --- One person, one approver ------------------------------------------------------------------

TWO_PEOPLE = [{"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approvers": 2}}]


@pytest.fixture
def big_charge(tenant, agent_key):
    """A charge two distinct people must approve."""
    api = Api(agent_key[1])
    load_policy_file({"policies": [charge_policy(rules=TWO_PEOPLE)]})
    run = new_run(api)
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "args": {"amount": 50000}, "idempotency_key": "big"},
    )
    assert response.status_code == 201, response.content
    return Approval.objects.get(pk=response.json()["approval"]["id"])


def test_a_renamed_sso_approver_still_counts_once(big_charge):
    ana = _sign_in("sub-1", {"acme": "approver"}, preferred_username="ana", email="ana@example.com").user
    approval_approve(approval=big_charge, actor=Actor.for_user(ana), reason="checked")
    # Ana's e-mail and name change at the provider: still Ana, still one approver.
    renamed = _sign_in(
        "sub-1", {"acme": "approver"}, preferred_username="ana2", email="ana2@example.com"
    ).user
    with pytest.raises(errors.SagaError) as refused:
        approval_approve(
            approval=Approval.objects.get(pk=big_charge.pk), actor=Actor.for_user(renamed), reason="again"
        )
    assert refused.value.code == "already_granted"
    assert Approval.objects.get(pk=big_charge.pk).status == "pending"


def test_two_sso_accounts_sharing_a_verified_email_are_one_approver(big_charge):
    """Two users (two provider accounts), but one address the provider verified: one person for
    the approval rules, never a second pair of eyes."""
    one = _sign_in("sub-1", {"acme": "approver"}, email="team@example.com").user
    two = _sign_in("sub-2", {"acme": "approver"}, email="Team@Example.com").user
    assert one.pk != two.pk
    approval_approve(approval=big_charge, actor=Actor.for_user(one), reason="first")
    with pytest.raises(errors.AlreadyGranted):
        approval_approve(
            approval=Approval.objects.get(pk=big_charge.pk), actor=Actor.for_user(two), reason="second"
        )
    assert Approval.objects.get(pk=big_charge.pk).status == "pending"


def test_an_sso_user_who_lost_the_role_may_no_longer_approve(big_charge):
    """The approval pages' gate (``dashboard.permissions``) reads the memberships the sign-in set."""
    ana = _sign_in("sub-1", {"acme": "approver"}).user
    assert can(User.objects.get(pk=ana.pk), Capability.APPROVE, big_charge.tenant_id)
    _sign_in("sub-1", {"acme": "viewer"})
    assert not can(User.objects.get(pk=ana.pk), Capability.APPROVE, big_charge.tenant_id)


# --- Two first sign-ins at once ----------------------------------------------------------------


def _meanwhile(monkeypatch, happen, *, times: int = 1) -> None:
    """Run ``happen(username)`` in another connection, committed, right after this sign-in chose
    its username and before it saves it (the first ``times`` choices): the other process's
    sign-in winning the race."""
    from dashboard.sso import accounts

    choose = accounts._free_username
    ours = threading.current_thread()
    calls: list[str] = []

    def chosen_then_taken(profile: Profile) -> str:
        name = choose(profile)
        if threading.current_thread() is not ours:
            return name  # the other sign-in's own choice
        calls.append(name)
        if len(calls) <= times:
            failures: list[BaseException] = []

            def other() -> None:
                try:
                    happen(name)
                except BaseException as exc:  # noqa: BLE001 - reported to the test below
                    failures.append(exc)
                finally:
                    connection.close()

            thread = threading.Thread(target=other)
            thread.start()
            thread.join(30)
            assert not thread.is_alive() and not failures, failures
        return name

    monkeypatch.setattr(accounts, "_free_username", chosen_then_taken)


@pytest.mark.django_db(transaction=True)
def test_two_accounts_signing_in_first_at_once_under_one_name_are_two_users(monkeypatch):
    Tenant.objects.create(slug="acme", name="Acme Corp")
    _meanwhile(monkeypatch, lambda name: _sign_in("sub-other", {}, preferred_username=name))
    signed = _sign_in("sub-1", {"acme": "approver"}, preferred_username="ana")
    other = SsoIdentity.objects.get(subject="sub-other").user
    assert signed.created
    assert (other.username, signed.user.username) == ("ana", "ana-2")
    assert _roles(signed.user) == {"acme": "approver"}
    assert SsoIdentity.objects.get(subject="sub-1").user == signed.user


@pytest.mark.django_db(transaction=True)
def test_one_account_signing_in_first_in_two_tabs_is_one_user(monkeypatch):
    Tenant.objects.create(slug="acme", name="Acme Corp")
    _meanwhile(monkeypatch, lambda name: _sign_in("sub-1", {}, preferred_username=name))
    signed = _sign_in("sub-1", {"acme": "viewer"}, preferred_username="ana")
    assert signed.user.username == "ana"
    assert User.objects.count() == 1
    assert _roles(signed.user) == {"acme": "viewer"}


@pytest.mark.django_db(transaction=True)
def test_a_sign_in_that_keeps_losing_the_race_fails_as_a_refused_sign_in(monkeypatch):
    from dashboard.sso.accounts import NoFreeUsername

    taken = iter(range(100))
    _meanwhile(
        monkeypatch, lambda name: _sign_in(f"sub-other-{next(taken)}", {}, preferred_username=name), times=99
    )
    with pytest.raises(NoFreeUsername):
        _sign_in("sub-1", {}, preferred_username="ana")
    assert not SsoIdentity.objects.filter(subject="sub-1").exists()
