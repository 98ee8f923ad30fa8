"""manage.py bootstrap: the first tenant, its admin, keys and policies from SAGA_BOOTSTRAP_*
variables and files; a second run changes nothing; every refusal changes nothing."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection

from ledger.models import AgentKey, Compensator, Event, Membership, PolicySet, Tenant, ToolPolicy
from ledger.services import keys

FIXTURES = Path(__file__).parent / "fixtures"
PASSWORD = "lilac-orbit-7-canoe"


def run() -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("bootstrap", stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def snapshot() -> dict[str, Any]:
    """Every row bootstrap may write, and the stamps a write would move."""
    return {
        "tenants": list(Tenant.objects.values_list("slug", "name")),
        "users": list(get_user_model().objects.values_list("username", "password", "email", "is_staff")),
        "memberships": list(Membership.objects.values_list("user__username", "tenant__slug", "role")),
        "keys": list(
            AgentKey.objects.order_by("prefix").values_list("prefix", "key_hash", "scopes", "revoked_at")
        ),
        "events": Event.objects.count(),
        "policy_sets": list(PolicySet.objects.values_list("tenant_id", "content_hash", "loaded_at")),
        "policies": list(ToolPolicy.objects.order_by("tool").values_list("tool", "loaded_at")),
        "compensators": list(Compensator.objects.order_by("tool").values_list("tool", "loaded_at")),
        "policy_stamp": _policy_stamp(),
    }


def _policy_stamp() -> int:
    """The version every policy write moves (ledger.policies.resolve): a repeat load must not."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT version FROM ledger_policystamp WHERE id = 1")
        return cursor.fetchone()[0]


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    """A GitOps-style set-up: variables plus mounted files (admin password, key material, keys
    file, policy file)."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "admin-password").write_text(PASSWORD + "\n")
    material = keys.agent_key_new_secret()
    (secrets_dir / "onboarding.key").write_text(material + "\n")
    keys_file = secrets_dir / "keys.json"
    keys_file.write_text(
        json.dumps(
            {
                "keys": [
                    {"name": "onboarding-agent", "scopes": ["agent"], "secret_file": "onboarding.key"},
                    {"name": "ops-approver", "scopes": ["approver"], "owner": "root-admin"},
                ]
            }
        )
    )
    policy = tmp_path / "policies.json"
    shutil.copy(FIXTURES / "policies_native.json", policy)
    env = {
        "SAGA_BOOTSTRAP_TENANT": "acme",
        "SAGA_BOOTSTRAP_TENANT_NAME": "Acme Corp",
        "SAGA_BOOTSTRAP_ADMIN_USERNAME": "root-admin",
        "SAGA_BOOTSTRAP_ADMIN_EMAIL": "ops@acme.example",
        "SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE": str(secrets_dir / "admin-password"),
        "SAGA_BOOTSTRAP_AGENT_KEYS_FILE": str(keys_file),
        "SAGA_BOOTSTRAP_POLICY_FILE": str(policy),
        "SAGA_BOOTSTRAP_POLICY_SCOPE": "tenant",
        # The job's output is a log: keys the server issues go to this file, not to stdout.
        "SAGA_BOOTSTRAP_ISSUED_KEYS_FILE": str(tmp_path / "issued-keys.jsonl"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {"env": env, "material": material, "dir": secrets_dir, "keys_file": keys_file, "policy": policy}


def test_the_first_run_creates_everything_through_the_services(deployment, db):
    out, _ = run()
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.name == "Acme Corp"
    admin = get_user_model().objects.get(username="root-admin")
    # The trailing newline of the mounted file is not part of the password.
    assert admin.check_password(PASSWORD) and admin.email == "ops@acme.example" and admin.is_staff
    assert Membership.objects.get(user=admin, tenant=tenant).role == "admin"
    imported = keys.agent_key_authenticate(raw_key=deployment["material"])
    assert imported is not None and (imported.name, imported.scopes) == ("onboarding-agent", ["agent"])
    # The key without a secret_file was issued by the server and written once, to the issued-keys file.
    [written] = [
        json.loads(line)
        for line in Path(deployment["env"]["SAGA_BOOTSTRAP_ISSUED_KEYS_FILE"]).read_text().splitlines()
    ]
    assert (
        written["name"] == "ops-approver"
        and written["key"] not in out
        and f"{written['prefix']} (ops-approver" in out
    )
    issued = keys.agent_key_authenticate(raw_key=written["key"])
    assert issued is not None and issued.name == "ops-approver" and issued.owner == admin
    assert ToolPolicy.objects.filter(tenant=tenant).count() == 3
    assert PolicySet.objects.filter(tenant=tenant).exists()
    kinds = sorted(Event.objects.values_list("kind", flat=True))
    assert kinds == [
        "agent_key.created",
        "agent_key.imported",
        "membership.set",
        "policies.loaded",
    ]
    assert "Bootstrap done." in out and "Created tenant acme" in out


def test_the_second_run_changes_nothing_and_says_so(deployment, db):
    run()
    before = snapshot()
    out, err = run()
    assert snapshot() == before
    assert out.rstrip("\n").splitlines()[-1] == "Nothing changed."
    assert "User root-admin exists: left as it is (password not reset; admin at acme)." in out
    assert "Tenant acme exists: left as it is." in out
    assert "(onboarding-agent) exists: left as it is." in out and "(ops-approver) exists" in out
    assert "into tenant acme scope: unchanged (" in out
    assert "sk_" not in out.replace(AgentKey.objects.get(name="ops-approver").prefix, "").replace(
        AgentKey.objects.get(name="onboarding-agent").prefix, ""
    )
    assert err == ""


def test_an_existing_user_keeps_their_password(deployment, db, monkeypatch):
    run()
    monkeypatch.setenv("SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE", "")
    monkeypatch.setenv("SAGA_BOOTSTRAP_ADMIN_PASSWORD", "another-long-passphrase-9")
    before = snapshot()
    out, _ = run()
    assert snapshot() == before
    assert get_user_model().objects.get(username="root-admin").check_password(PASSWORD)
    assert "password not reset" in out


def test_nothing_set_does_nothing(db):
    out, _ = run()
    assert out.strip() == "No SAGA_BOOTSTRAP_* variable is set: nothing to bootstrap."
    assert not Tenant.objects.exists()


def refused(match: str) -> None:
    before = snapshot()
    with pytest.raises(CommandError) as caught:
        run()
    assert match in str(caught.value), str(caught.value)
    assert "nothing was changed" in str(caught.value)
    assert snapshot() == before


def test_a_provided_secret_that_does_not_match_the_stored_key_is_refused(deployment, db):
    run()
    material = deployment["material"]
    prefix = material.rsplit("_", 1)[0]
    forged = f"{prefix}_{keys.agent_key_new_secret().rsplit('_', 1)[1]}"
    (deployment["dir"] / "onboarding.key").write_text(forged)
    refused(f"keys[0] (onboarding-agent): the secret_file does not match the stored key {prefix}")


def test_new_material_for_a_name_with_an_active_key_is_not_a_silent_rotation(deployment, db):
    run()
    (deployment["dir"] / "onboarding.key").write_text(keys.agent_key_new_secret())
    refused("already has an active key named onboarding-agent")


def test_new_material_after_the_old_key_was_revoked_is_imported(deployment, db):
    run()
    old = AgentKey.objects.get(name="onboarding-agent")
    call_command("revoke_agent_key", "--prefix", old.prefix, stdout=StringIO())
    new_material = keys.agent_key_new_secret()
    (deployment["dir"] / "onboarding.key").write_text(new_material)
    out, _ = run()
    assert "Imported key" in out
    assert keys.agent_key_authenticate(raw_key=new_material).name == "onboarding-agent"
    # The revoked key's own material again is refused, naming it.
    (deployment["dir"] / "onboarding.key").write_text(deployment["material"])
    refused(f"key {old.prefix} was revoked")


@pytest.mark.parametrize(
    ("material", "message"),
    [
        ("sk_abc_def", "not in the format of a key this server issues"),
        ("SK_" + "a" * 57, "not in the format"),
        ("sk_0123456789ab_" + "x" * 42 + "_", "not in the format"),
        ("sk_0123456789AB_" + "x" * 43, "not in the format"),
    ],
)
def test_malformed_key_material_is_refused_without_echoing_it(deployment, db, material, message):
    (deployment["dir"] / "onboarding.key").write_text(material)
    refused(message)
    with pytest.raises(CommandError) as caught:
        run()
    assert material not in str(caught.value)
    assert not Tenant.objects.exists()


def test_a_missing_secret_file_is_refused_naming_it(deployment, db):
    (deployment["dir"] / "onboarding.key").unlink()
    refused("onboarding.key: the file cannot be read (No such file or directory)")


def test_both_a_variable_and_its_file_are_refused_naming_both(deployment, db, monkeypatch):
    monkeypatch.setenv("SAGA_BOOTSTRAP_ADMIN_PASSWORD", PASSWORD)
    refused("Both SAGA_BOOTSTRAP_ADMIN_PASSWORD and SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE are set")


def test_an_unreadable_password_file_is_refused_naming_it(deployment, db, monkeypatch, tmp_path):
    monkeypatch.setenv("SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE", str(tmp_path / "nope"))
    refused(f"SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE={tmp_path / 'nope'}: the file cannot be read")


def test_a_weak_password_is_refused_and_nothing_is_created(deployment, db):
    (deployment["dir"] / "admin-password").write_text("password1234")
    refused("The password is too weak")
    assert not Tenant.objects.exists()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "SAGA_BOOTSTRAP_ADMIN_USERNAME",
            "root admin!",
            "SAGA_BOOTSTRAP_ADMIN_USERNAME: Enter a valid username",
        ),
        (
            "SAGA_BOOTSTRAP_ADMIN_USERNAME",
            "r" * 151,
            "SAGA_BOOTSTRAP_ADMIN_USERNAME: Ensure this value has at most 150",
        ),
        ("SAGA_BOOTSTRAP_ADMIN_EMAIL", "not-an-address", "SAGA_BOOTSTRAP_ADMIN_EMAIL: not an e-mail address"),
        ("SAGA_BOOTSTRAP_ADMIN_USERNAME", "", "is set but SAGA_BOOTSTRAP_ADMIN_USERNAME is not"),
    ],
)
def test_a_bad_admin_is_refused(deployment, db, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    refused(message)
    assert not Tenant.objects.exists()


def test_a_new_admin_needs_a_password(deployment, db, monkeypatch):
    monkeypatch.delenv("SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE")
    refused("User root-admin does not exist: set SAGA_BOOTSTRAP_ADMIN_PASSWORD")


def test_a_bad_policy_file_is_refused_before_anything_is_written(deployment, db):
    shutil.copy(FIXTURES / "policies_bad.json", deployment["policy"])
    refused("SAGA_BOOTSTRAP_POLICY_FILE:")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", 'must be a JSON object {"keys": [...]}'),
        ("{", "invalid JSON at line 1"),
        ('{"keys": [{"name": "a", "scope": ["agent"]}]}', "unknown field(s) scope"),
        ('{"keys": [{"name": "a"}, {"name": "a"}]}', "the key name 'a' is listed more than once"),
        ('{"keys": [{"name": "a", "scopes": ["agent", "root"]}]}', "Scopes must be a non-empty subset"),
        ('{"keys": [{"name": "a", "scopes": ["agent", "approver"]}]}', "cannot hold both"),
        ('{"keys": [{"name": "a", "scopes": ["approver"]}]}', "An approver key belongs to a person"),
        ('{"keys": [{"name": "a", "owner": "nobody"}]}', "no user is named 'nobody'"),
        ('{"keys": [{"name": ""}]}', "name must be a non-empty string"),
    ],
)
def test_a_bad_keys_file_is_refused_and_changes_nothing(deployment, db, content, message):
    deployment["keys_file"].write_text(content)
    refused(message)
    assert not Tenant.objects.exists()


def test_the_same_material_for_two_keys_is_refused(deployment, db):
    material = deployment["material"]
    (deployment["dir"] / "second.key").write_text(material)
    deployment["keys_file"].write_text(
        json.dumps(
            {
                "keys": [
                    {"name": "a", "secret_file": "onboarding.key"},
                    {"name": "b", "secret_file": "second.key"},
                ]
            }
        )
    )
    refused("is given to more than one key")


def test_a_key_of_another_tenant_is_not_taken_over(deployment, db, monkeypatch):
    run()
    monkeypatch.setenv("SAGA_BOOTSTRAP_TENANT", "globex")
    for name in (
        "SAGA_BOOTSTRAP_ADMIN_USERNAME",
        "SAGA_BOOTSTRAP_ADMIN_EMAIL",
        "SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE",
    ):
        monkeypatch.delenv(name)
    deployment["keys_file"].write_text(
        json.dumps({"keys": [{"name": "onboarding-agent", "secret_file": "onboarding.key"}]})
    )
    refused("is the key of another agent")


def test_a_bad_tenant_slug_and_missing_tenant_are_refused(deployment, db, monkeypatch):
    monkeypatch.setenv("SAGA_BOOTSTRAP_TENANT", "acme corp; drop")
    refused("a tenant slug is letters, digits, - and _ only")
    monkeypatch.delenv("SAGA_BOOTSTRAP_TENANT")
    refused("need(s) a tenant: set SAGA_BOOTSTRAP_TENANT")


def test_drift_is_reported_not_corrected(deployment, db, monkeypatch):
    run()
    monkeypatch.setenv("SAGA_BOOTSTRAP_TENANT_NAME", "Acme Renamed")
    deployment["keys_file"].write_text(
        json.dumps(
            {"keys": [{"name": "onboarding-agent", "scopes": ["operator"], "secret_file": "onboarding.key"}]}
        )
    )
    before = snapshot()
    out, err = run()
    assert snapshot() == before and "Nothing changed." in out
    assert "bootstrap does not rename it" in err
    assert "has scopes agent, not what the keys file says" in err


def test_a_global_policy_scope_loads_into_the_global_set(deployment, db, monkeypatch):
    monkeypatch.setenv("SAGA_BOOTSTRAP_POLICY_SCOPE", "global")
    out, _ = run()
    assert (
        PolicySet.objects.filter(tenant=None).exists() and not PolicySet.objects.exclude(tenant=None).exists()
    )
    assert "into the global scope: " in out and " created, " in out
    before = snapshot()
    run()
    assert snapshot() == before
    monkeypatch.setenv("SAGA_BOOTSTRAP_POLICY_SCOPE", "everyone")
    refused("SAGA_BOOTSTRAP_POLICY_SCOPE='everyone': must be global or tenant")


def test_print_new_key_prints_material_the_import_accepts(db):
    out = StringIO()
    call_command("bootstrap", "--print-new-key", stdout=out)
    material = out.getvalue().strip()
    assert keys.agent_key_material_check(material)[0] == material.rsplit("_", 1)[0]
    assert not Tenant.objects.exists()


def test_issued_and_imported_keys_share_one_format(tenant):
    from ledger.audit import Actor

    issued = keys.agent_key_create(tenant=tenant, name="x", actor=Actor.system("tests"))
    assert keys.KEY_FORMAT.fullmatch(issued.secret)


def test_an_issued_key_never_reaches_a_job_log(deployment, db, monkeypatch, tmp_path):
    """A deploy Job's stdout is its log, kept and shown to whoever may read the
    Job. Run as a Job runs it (stdout not a terminal) with no file for issued keys, bootstrap
    refuses to issue one (nothing is created, no key printed); with the file, the key is written
    there (0600) and stdout names only its prefix."""
    monkeypatch.delenv("SAGA_BOOTSTRAP_ISSUED_KEYS_FILE")
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="would be printed into a log") as refused:
        call_command("bootstrap", stdout=out, stderr=err)
    assert "SAGA_BOOTSTRAP_ISSUED_KEYS_FILE" in str(refused.value)
    assert not Tenant.objects.exists() and not AgentKey.objects.exists()
    assert not keys.KEY_FORMAT.search(out.getvalue() + err.getvalue() + str(refused.value))

    issued_file = tmp_path / "issued" / "keys.jsonl"
    issued_file.parent.mkdir()
    monkeypatch.setenv("SAGA_BOOTSTRAP_ISSUED_KEYS_FILE", str(issued_file))
    out_text, err_text = run()
    [written] = [json.loads(line) for line in issued_file.read_text().splitlines()]
    assert issued_file.stat().st_mode & 0o777 == 0o600
    assert keys.agent_key_authenticate(raw_key=written["key"]) is not None
    assert not keys.KEY_FORMAT.search(out_text + err_text)
    [line] = [
        line
        for line in out_text.splitlines()
        if line.startswith(f"Created key {written['prefix']} (ops-approver, ")
    ]
    assert line.endswith(f"): written to {issued_file}.")
    # A second run issues nothing more and writes nothing more.
    run()
    assert len(issued_file.read_text().splitlines()) == 1
