"""Secrets from mounted files: every secret setting NAME may come from NAME_FILE instead
(infra.env); both set, or a file that cannot be used, refuse to start naming them. And
manage.py bootstrap run as a deploy job runs it: from variables and files only, twice."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured

from infra.env import MAX_SECRET_FILE_BYTES, env_secret
from ledger.models import AgentKey, Event, Membership, Tenant
from ledger.services import keys
from tests.support.processes import ROOT, database_url_for_subprocesses


def test_the_variable_itself_and_the_default(monkeypatch):
    monkeypatch.delenv("SAGA_T_SECRET", raising=False)
    monkeypatch.delenv("SAGA_T_SECRET_FILE", raising=False)
    assert env_secret("SAGA_T_SECRET", "fallback") == "fallback"
    monkeypatch.setenv("SAGA_T_SECRET", "direct")
    assert env_secret("SAGA_T_SECRET", "fallback") == "direct"


def test_the_file_with_its_trailing_newline_stripped(monkeypatch, tmp_path):
    path = tmp_path / "secret"
    path.write_text("s3cret value\r\n")
    monkeypatch.delenv("SAGA_T_SECRET", raising=False)
    monkeypatch.setenv("SAGA_T_SECRET_FILE", str(path))
    assert env_secret("SAGA_T_SECRET") == "s3cret value"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "the file cannot be read (No such file or directory)"),
        (b"", "the file is empty"),
        (b"\n", "the file is empty"),
        (b"\xff\xfe", "the file is not UTF-8 text"),
        (b"x" * (MAX_SECRET_FILE_BYTES + 1), f"larger than {MAX_SECRET_FILE_BYTES} bytes"),
    ],
)
def test_an_unusable_file_is_refused_naming_the_variable_and_the_path(
    monkeypatch, tmp_path, content, message
):
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.delenv("SAGA_T_SECRET", raising=False)
    monkeypatch.setenv("SAGA_T_SECRET_FILE", str(path))
    with pytest.raises(ImproperlyConfigured) as refused:
        env_secret("SAGA_T_SECRET")
    assert str(refused.value).startswith(f"SAGA_T_SECRET_FILE={path}: ") and message in str(refused.value)


def test_both_set_is_refused_naming_both(monkeypatch, tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-file")
    monkeypatch.setenv("SAGA_T_SECRET", "direct")
    monkeypatch.setenv("SAGA_T_SECRET_FILE", str(path))
    with pytest.raises(ImproperlyConfigured, match="Both SAGA_T_SECRET and SAGA_T_SECRET_FILE are set"):
        env_secret("SAGA_T_SECRET")


def _env(**extra: str) -> dict[str, str]:
    """What a deployed process gets: none of the suite's DEBUG/SECRET_KEY."""
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "REDIS_URL") if name in os.environ}
    return {**keep, "DATABASE_URL": database_url_for_subprocesses(), **extra}


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


_SHOW = "from django.conf import settings as s; print(s.SECRET_KEY); print(s.SAGA['RESUME_WEBHOOK_SECRET'])"


def test_settings_read_secret_key_and_saga_secrets_from_files(tmp_path):
    key = secrets.token_urlsafe(50)
    (tmp_path / "secret_key").write_text(key + "\n")
    (tmp_path / "resume").write_text("resume-master\n")
    env = {
        **_env(
            SECRET_KEY_FILE=str(tmp_path / "secret_key"),
            SAGA_RESUME_WEBHOOK_SECRET_FILE=str(tmp_path / "resume"),
        ),
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
    }
    shown = subprocess.run(
        [sys.executable, "-c", _SHOW], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [key, "resume-master"]


def test_manage_py_will_not_start_with_both_or_an_unreadable_file(tmp_path):
    (tmp_path / "secret_key").write_text("k" * 50)
    both = _manage("check", env=_env(SECRET_KEY="k" * 50, SECRET_KEY_FILE=str(tmp_path / "secret_key")))
    assert both.returncode == 1 and "Traceback" not in both.stderr
    assert "Saga Admin will not start: Both SECRET_KEY and SECRET_KEY_FILE are set" in both.stderr
    missing = _manage("check", env=_env(SECRET_KEY_FILE=str(tmp_path / "absent")))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert f"Saga Admin will not start: SECRET_KEY_FILE={tmp_path / 'absent'}: the file cannot be read" in (
        missing.stderr
    )
    works = _manage("check", env=_env(SECRET_KEY_FILE=str(tmp_path / "secret_key")))
    assert works.returncode == 0, works.stderr


def _counts() -> dict[str, int]:
    return {
        "tenants": Tenant.objects.count(),
        "users": get_user_model().objects.count(),
        "memberships": Membership.objects.count(),
        "keys": AgentKey.objects.count(),
        "events": Event.objects.count(),
    }


@pytest.mark.django_db(transaction=True)
def test_bootstrap_as_a_deploy_job_runs_it_from_files_only_twice(tmp_path):
    """The migrate job's second step, as a process: secrets in files only (SECRET_KEY_FILE, the
    admin password file, the key's material), DEBUG off; the second run writes nothing."""
    (tmp_path / "secret_key").write_text(secrets.token_urlsafe(50))
    (tmp_path / "admin-password").write_text("lilac-orbit-7-canoe\n")
    material = keys.agent_key_new_secret()
    (tmp_path / "agent.key").write_text(material + "\n")
    (tmp_path / "keys.json").write_text(
        json.dumps({"keys": [{"name": "onboarding-agent", "scopes": ["agent"], "secret_file": "agent.key"}]})
    )
    env = _env(
        SECRET_KEY_FILE=str(tmp_path / "secret_key"),
        ALLOWED_HOSTS="saga.example.com",
        SAGA_BOOTSTRAP_TENANT="acme",
        SAGA_BOOTSTRAP_ADMIN_USERNAME="root-admin",
        SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE=str(tmp_path / "admin-password"),
        SAGA_BOOTSTRAP_AGENT_KEYS_FILE=str(tmp_path / "keys.json"),
        SAGA_BOOTSTRAP_POLICY_FILE=str(Path(ROOT) / "tests/ledger/fixtures/policies_native.json"),
    )
    first = _manage("bootstrap", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Bootstrap done." in first.stdout and material not in first.stdout + first.stderr
    assert get_user_model().objects.get(username="root-admin").check_password("lilac-orbit-7-canoe")
    assert keys.agent_key_authenticate(raw_key=material).tenant.slug == "acme"
    after_first = _counts()
    second = _manage("bootstrap", env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.splitlines()[-1] == "Nothing changed."
    assert _counts() == after_first
    (tmp_path / "agent.key").write_text(keys.agent_key_new_secret())
    third = _manage("bootstrap", env=env)
    assert third.returncode == 1 and "Traceback" not in third.stderr
    assert "Bootstrap refused, nothing was changed:" in third.stderr and "onboarding-agent" in third.stderr
    assert _counts() == after_first
