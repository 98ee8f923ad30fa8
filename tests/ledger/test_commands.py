"""create_agent_key, revoke_agent_key, create_staff and the production settings check."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from ledger.models import AgentKey, Event, Membership, Tenant
from ledger.services import keys
from tests.support.processes import ROOT


def run_command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_it_creates_a_key_and_the_tenant_and_prints_the_key_alone_on_the_last_line(db):
    out = run_command(
        "create_agent_key", "--tenant", "initech", "--name", "billing-agent", "--scopes", "agent,operator"
    )
    raw = out.rstrip("\n").splitlines()[-1]
    assert raw == raw.strip() and " " not in raw
    key = keys.agent_key_authenticate(raw_key=raw)
    assert key is not None
    assert (key.tenant.slug, key.name, key.scopes) == ("initech", "billing-agent", ["agent", "operator"])
    # Stored hashed: the secret part appears nowhere in the row.
    assert (
        raw.split("_")[-1] not in AgentKey.objects.filter(pk=key.pk).values_list("key_hash", flat=True).get()
    )


def test_it_reuses_an_existing_tenant(tenant):
    run_command("create_agent_key", "--tenant", tenant.slug, "--name", "second")
    assert Tenant.objects.filter(slug=tenant.slug).count() == 1
    assert AgentKey.objects.filter(tenant=tenant, name="second", scopes=["agent"]).exists()


def test_it_refuses_an_unknown_scope(db):
    with pytest.raises(CommandError, match="Scopes must be a non-empty subset of agent, operator"):
        run_command("create_agent_key", "--tenant", "initech", "--name", "x", "--scopes", "agent,root")
    assert not AgentKey.objects.exists()


def test_it_revokes_a_key_which_then_no_longer_authenticates(agent_key):
    key, raw = agent_key
    assert keys.agent_key_authenticate(raw_key=raw) == key
    out = run_command("revoke_agent_key", "--prefix", key.prefix)
    assert f"Revoked key {key.prefix}" in out
    assert keys.agent_key_authenticate(raw_key=raw) is None
    assert Event.objects.filter(kind="agent_key.revoked", subject_id=key.pk).count() == 1
    with pytest.raises(CommandError, match="already revoked"):
        run_command("revoke_agent_key", "--prefix", key.prefix)


def test_it_refuses_to_revoke_an_unknown_prefix(db):
    with pytest.raises(CommandError, match="No key has the prefix"):
        run_command("revoke_agent_key", "--prefix", "sk_nope")


@pytest.mark.parametrize("raw", ["", "sk_abc", "nope", "sk__x", "sk_abc_wrong-secret"])
def test_it_does_not_authenticate_malformed_or_wrong_keys(agent_key, raw):
    assert keys.agent_key_authenticate(raw_key=raw) is None


def test_it_does_not_authenticate_a_right_prefix_with_a_wrong_secret(agent_key):
    key, raw = agent_key
    assert keys.agent_key_authenticate(raw_key=f"{key.prefix}_{'x' * 43}") is None


def test_it_creates_staff_with_a_role(db):
    out = run_command(
        "create_staff",
        "erin",
        "--password",
        "correct-horse-battery",
        "--tenant",
        "acme",
        "--role",
        "operator",
    )
    assert "Created user erin: operator at acme" in out
    user = get_user_model().objects.get(username="erin")
    assert user.check_password("correct-horse-battery")
    assert not user.is_staff and not user.is_superuser
    assert Membership.objects.get(user=user).role == "operator"
    assert Event.objects.filter(kind="membership.set", to_state="operator").count() == 1


def test_it_updates_an_existing_users_role_and_password(alice, tenant):
    out = run_command(
        "create_staff",
        "alice",
        "--password",
        "another-long-passphrase",
        "--tenant",
        tenant.slug,
        "--role",
        "approver",
    )
    assert "Updated user alice: approver" in out
    alice.refresh_from_db()
    assert alice.check_password("another-long-passphrase")
    assert Membership.objects.get(user=alice, tenant=tenant).role == "approver"
    assert Membership.objects.filter(user=alice).count() == 1
    event = Event.objects.get(kind="membership.set")
    assert (event.from_state, event.to_state) == ("operator", "approver")


def test_it_gives_only_admins_the_django_admin(dave, tenant):
    run_command(
        "create_staff",
        "dave",
        "--password",
        "correct-horse-battery",
        "--tenant",
        tenant.slug,
        "--role",
        "admin",
    )
    dave.refresh_from_db()
    assert dave.is_staff and not dave.is_superuser
    assert dave.has_perm("ledger.view_run") and not dave.has_perm("ledger.change_run")
    run_command(
        "create_staff",
        "dave",
        "--password",
        "correct-horse-battery",
        "--tenant",
        tenant.slug,
        "--role",
        "viewer",
    )
    dave = get_user_model().objects.get(pk=dave.pk)
    assert not dave.is_staff and not dave.has_perm("ledger.view_run")


def test_it_keeps_admin_access_while_admin_of_another_tenant(dave, tenant, other_tenant):
    run_command(
        "create_staff",
        "dave",
        "--password",
        "correct-horse-battery",
        "--tenant",
        tenant.slug,
        "--role",
        "admin",
    )
    run_command(
        "create_staff",
        "dave",
        "--password",
        "correct-horse-battery",
        "--tenant",
        other_tenant.slug,
        "--role",
        "viewer",
    )
    dave.refresh_from_db()
    assert dave.is_staff


def test_it_does_not_audit_a_role_that_did_not_change(alice, tenant):
    run_command(
        "create_staff",
        "alice",
        "--password",
        "correct-horse-battery",
        "--tenant",
        tenant.slug,
        "--role",
        "operator",
    )
    assert not Event.objects.filter(kind="membership.set").exists()


def test_it_refuses_a_weak_password(db):
    with pytest.raises(CommandError, match="too weak"):
        run_command("create_staff", "erin", "--password", "short", "--tenant", "acme", "--role", "viewer")
    assert not get_user_model().objects.filter(username="erin").exists()


def test_it_refuses_an_unknown_role(db):
    with pytest.raises(CommandError, match="invalid choice"):
        run_command(
            "create_staff",
            "erin",
            "--password",
            "correct-horse-battery",
            "--tenant",
            "acme",
            "--role",
            "overlord",
        )


def production_env(**extra: str) -> dict[str, str]:
    """Only what a Procfile process would get: not the test runner's variables (conftest sets
    DJANGO_ALLOW_ASYNC_UNSAFE, which the deploy check rightly refuses)."""
    keep = {
        name: os.environ[name] for name in ("PATH", "HOME", "DATABASE_URL", "REDIS_URL") if name in os.environ
    }
    return {**keep, "DEBUG": "0", "ALLOWED_HOSTS": "example.com", **extra}


def test_it_passes_the_deploy_check_with_production_settings():
    env = production_env(SECRET_KEY=secrets.token_urlsafe(64))
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_it_fails_the_deploy_check_with_a_weak_secret():
    # The check above must be able to fail: the same run with a short key does. (Without any key
    # nothing starts at all: tests/security/test_ops_and_config.py.)
    env = production_env(SECRET_KEY="too-short-to-sign-sessions")
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "security.W009" in result.stderr + result.stdout
