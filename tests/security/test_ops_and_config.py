"""The dashboard's and the operator's surfaces: the RQ dashboard is for
superusers only; login lockout is per (username, address) pair and the login page says for how
long; staff passwords pass Django's validators; the settings fail closed (no SECRET_KEY with DEBUG
off: nothing starts); and no key, secret or password ever reaches a log line."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.management import CommandError, call_command
from django.test import Client
from saga_client.signing import derive_secret

from ledger.audit import Actor
from ledger.models import Compensator, Event, Membership
from saga_admin.logs import json_formatter
from tests.factories import HR_PATH, RESUME_PATH, WS_PATH, load_onboarding_policies
from tests.support.processes import (
    ROOT,
    database_url_for_subprocesses,
    dump_worker_logs,
    serve_webhooks,
    wait_for,
)

PERSONA_PASSWORD = "correct-horse-battery"  # tests/conftest.py's _user


def _session_client(user: User, base_url: str, **options: Any) -> httpx.Client:
    """An HTTP client holding ``user``'s dashboard session (logged in through Django's own
    session machinery; the requests themselves go over the socket)."""
    django_client = Client()
    django_client.force_login(user)
    client = httpx.Client(base_url=base_url, timeout=30, **options)
    client.cookies.set("sessionid", django_client.cookies["sessionid"].value)
    return client


# --- /django-rq/ ---------------------------------------------------------------------------------

# Sorted queue names are django-rq's indexes: compensations 0, default 1, notifications 2.
DEFAULT_QUEUE = 1


@pytest.fixture
def queued_job(own_redis) -> Iterator[Any]:
    """A job whose arguments only a superuser may see (never run: no worker on this queue)."""
    import django_rq

    queue = django_rq.get_queue("default", commit_mode="auto")
    job = queue.enqueue("tests.nowhere.job", kwargs={"customer": "only-superusers-see-this"})
    yield job
    queue.empty()


def _rq_paths(job_id: str) -> list[str]:
    return [
        "/django-rq/",
        f"/django-rq/queues/{DEFAULT_QUEUE}/",
        f"/django-rq/queues/{DEFAULT_QUEUE}/{job_id}/",
        f"/django-rq/workers/{DEFAULT_QUEUE}/",
        "/django-rq/stats.json",
        "/django-rq/stats.json/sometoken",
    ]


@pytest.mark.django_db(transaction=True)
def test_django_rq_is_for_superusers_only(live_server, tenant, queued_job, alice, dave):
    """Pass: over HTTP, a tenant admin (staff, as create_staff makes them) and an operator get 404
    on every django-rq page, its stats JSON and its admin entry, and their POST to empty the queue
    changes nothing; a signed-out visitor is sent to the login page; a superuser sees the job with
    its arguments; the navigation offers the RQ link to the superuser only."""
    from ledger import staff

    staff.membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))
    dave.refresh_from_db()
    assert dave.is_staff and not dave.is_superuser  # what django-rq's own check would let in
    root = get_user_model().objects.create_superuser("root", "root@example.com", "a-long-root-passphrase")

    for user in (dave, alice):
        with _session_client(user, live_server.url) as client:
            for path in _rq_paths(queued_job.id):
                response = client.get(path)
                assert response.status_code == 404, (user.username, path, response.status_code)
                assert "only-superusers-see-this" not in response.text
            # django-rq's own entry in the Django admin (staff only) is not there either.
            admin_door = client.get("/admin/django_rq/dashboard/")
            assert admin_door.status_code == (404 if user.is_staff else 302)
            home = client.get("/")
            assert home.status_code == 200 and "/django-rq/" not in home.text
            csrf = client.cookies["csrftoken"]
            emptied = client.post(
                f"/django-rq/queues/{DEFAULT_QUEUE}/empty/",
                headers={"X-CSRFToken": csrf, "Referer": f"{live_server.url}/"},
            )
            assert emptied.status_code == 404
    import django_rq

    assert queued_job.id in django_rq.get_queue("default").job_ids  # the job is still there

    with httpx.Client(base_url=live_server.url, timeout=30) as anonymous:
        response = anonymous.get("/django-rq/")
        assert response.status_code == 302 and response.headers["Location"].startswith("/login/?next=")

    with _session_client(root, live_server.url) as client:
        for path in _rq_paths(queued_job.id)[:-1]:
            assert client.get(path).status_code == 200, path
        detail = client.get(f"/django-rq/queues/{DEFAULT_QUEUE}/{queued_job.id}/")
        assert "only-superusers-see-this" in detail.text
        assert 'href="/django-rq/"' in client.get("/").text
        # django-rq's entry in the Django admin is closed for everyone.
        assert client.get("/admin/django_rq/dashboard/").status_code == 404


# --- Login lockout -------------------------------------------------------------------------------


def _login(client: httpx.Client, username: str, password: str) -> httpx.Response:
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    return client.post(
        "/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{client.base_url}login/"},
    )


@pytest.mark.django_db(transaction=True)
def test_lockout_is_per_username_and_address_pair_and_says_for_how_long(live_server, alice, bob, settings):
    """Pass: five wrong passwords for alice from one address lock alice out from that address
    (429, the login page saying for how long, Retry-After), even with the right password; bob
    signs in from the same address and alice from another address, over real sockets."""
    from axes.models import AccessAttempt

    assert settings.AXES_FAILURE_LIMIT == 5 and settings.AXES_COOLOFF_TIME == 0.25
    port = live_server.thread.port
    base = f"http://127.0.0.1:{port}"
    office = httpx.Client(base_url=base, timeout=30)
    for attempt in range(1, 5):
        response = _login(office, "alice", f"guess-{attempt}")
        assert response.status_code == 200 and "Please enter a correct username" in response.text
    fifth = _login(office, "alice", "guess-5")
    assert fifth.status_code == 429
    assert "Signing in is paused for 15 minutes" in fifth.text
    assert fifth.headers["Retry-After"] == "900"
    assert 'name="password"' in fifth.text  # the login page itself, with the form
    right = _login(office, "alice", PERSONA_PASSWORD)
    assert right.status_code == 429 and "sessionid" not in right.cookies
    assert "Signing in is paused for 15 minutes" in right.text

    # Bob, behind the same address: unaffected.
    colleague = httpx.Client(base_url=base, timeout=30)
    signed_in = _login(colleague, "bob", PERSONA_PASSWORD)
    assert signed_in.status_code == 302 and signed_in.headers["Location"] == "/"
    assert colleague.get("/").status_code == 200

    # Alice from another address (127.0.0.2 is loopback too): unaffected.
    elsewhere = httpx.Client(
        base_url=base, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2")
    )
    signed_in = _login(elsewhere, "alice", PERSONA_PASSWORD)
    assert signed_in.status_code == 302 and signed_in.headers["Location"] == "/"

    attempts = list(AccessAttempt.objects.values_list("username", "ip_address"))
    assert attempts == [("alice", "127.0.0.1")]
    for client in (office, colleague, elsewhere):
        client.close()


def test_the_lockout_message_names_the_cool_off_in_plain_words():
    from datetime import timedelta

    from dashboard.login import duration_text, lockout_message

    assert duration_text(timedelta(minutes=15)) == "15 minutes"
    assert duration_text(timedelta(hours=1)) == "1 hour"
    assert duration_text(timedelta(minutes=90)) == "1 hour 30 minutes"
    assert duration_text(timedelta(seconds=45)) == "45 seconds"
    assert duration_text(timedelta(minutes=1)) == "1 minute"
    assert "until an administrator lifts the lock" in lockout_message(None)


# --- Staff passwords -----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("username", "password", "message"),
    [
        ("erin", "short-pw1", "This password is too short. It must contain at least 12 characters."),
        ("erin", "password1234", "This password is too common."),
        ("erin", "394857201938", "This password is entirely numeric."),
        ("wonderland", "wonderland12", "The password is too similar to the username."),
    ],
)
def test_create_staff_refuses_a_weak_password_with_the_validators_message(username, password, message):
    """Pass: each of Django's standard validators refuses its kind of weak password, in its own
    words; no user, membership or audit event is written."""
    with pytest.raises(CommandError) as refused:
        call_command("create_staff", username, "--password", password, "--tenant", "acme", "--role", "admin")
    assert message in str(refused.value)
    assert not get_user_model().objects.filter(username=username).exists()
    assert not Membership.objects.exists() and not Event.objects.filter(kind="membership.set").exists()


def _subprocess_env(**extra: str) -> dict[str, str]:
    """Only what a deployed process would get: none of the suite's DEBUG/SECRET_KEY."""
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "REDIS_URL") if name in os.environ}
    return {**keep, **extra}


def _manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_create_staff_exits_non_zero_on_a_weak_password_and_accepts_a_strong_one():
    """Pass: the real command refuses "password1234" with exit status 1 and the validators'
    message, creating nobody; a strong password creates the user."""
    env = _subprocess_env(DEBUG="1", DATABASE_URL=database_url_for_subprocesses())
    weak = _manage(
        "create_staff", "erin", "--password", "password1234", "--tenant", "acme", "--role", "viewer", env=env
    )
    assert weak.returncode == 1, weak.stdout + weak.stderr
    assert "This password is too common." in weak.stderr and "Traceback" not in weak.stderr
    assert not get_user_model().objects.filter(username="erin").exists()
    strong = _manage(
        "create_staff",
        "erin",
        "--password",
        "lilac-orbit-7-canoe",
        "--tenant",
        "acme",
        "--role",
        "viewer",
        env=env,
    )
    assert strong.returncode == 0, strong.stdout + strong.stderr
    assert get_user_model().objects.get(username="erin").check_password("lilac-orbit-7-canoe")


def test_the_demo_and_persona_passwords_pass_the_validators():
    """Pass: every demo login's password (README, make run) and the test personas' pass the same
    validators create_staff applies, so the documented logins are ones the product would accept."""
    from demo.setup import DEMO_PASSWORD, LOGINS

    for login in LOGINS:
        validate_password(
            DEMO_PASSWORD, user=User(username=login.username, email=f"{login.username}@demo.saga.local")
        )
    for username in ("alice", "bob", "carol", "dave", "mallory"):
        validate_password(PERSONA_PASSWORD, user=User(username=username))
    assert DEMO_PASSWORD in (ROOT / "README.md").read_text()


# --- Fail closed ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["check"],
        ["migrate", "--noinput"],
        ["saga_worker"],
        ["rqworker", "default"],
        ["runserver", "--noreload", "127.0.0.1:0"],
        ["create_agent_key", "--tenant", "acme", "--name", "x"],
    ],
    ids=lambda command: command[0],
)
def test_no_management_command_starts_without_a_secret_key_when_debug_is_off(command):
    """Pass: with DEBUG and SECRET_KEY unset, each command exits 1 before doing anything, with one
    sentence naming SECRET_KEY (not a traceback)."""
    result = _manage(*command, env=_subprocess_env(), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Saga Admin will not start: SECRET_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.slow
def test_check_passes_in_development_mode_and_with_a_secret_key():
    """Pass: the same check passes with DEBUG=1 (a development key) and with DEBUG off and a
    SECRET_KEY; DEBUG is off when unset."""
    development = _manage("check", env=_subprocess_env(DEBUG="1"), timeout=60)
    assert development.returncode == 0, development.stderr
    production = _manage("check", env=_subprocess_env(SECRET_KEY=secrets.token_urlsafe(50)), timeout=60)
    assert production.returncode == 0, production.stderr
    shown = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.DEBUG)"],
        cwd=ROOT,
        env={**_subprocess_env(SECRET_KEY="k" * 50), "DJANGO_SETTINGS_MODULE": "saga_admin.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip() == "False", shown.stderr


def test_the_web_process_refuses_to_start_without_a_secret_key():
    """Pass: importing the WSGI application fails naming SECRET_KEY, and the Procfile's gunicorn
    exits non-zero ("Worker failed to boot") instead of serving."""
    imported = subprocess.run(
        [sys.executable, "-c", "import saga_admin.wsgi"],
        cwd=ROOT,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode != 0
    assert "ImproperlyConfigured: Saga Admin will not start: SECRET_KEY is not set" in imported.stderr

    gunicorn = subprocess.run(
        [
            str(Path(sys.executable).parent / "gunicorn"),  # the Procfile's web command
            "saga_admin.wsgi",
            "--bind",
            "127.0.0.1:0",
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=_subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gunicorn.returncode != 0
    assert "SECRET_KEY is not set" in gunicorn.stderr and "Worker failed to boot" in gunicorn.stderr


# --- Secrets never logged ------------------------------------------------------------------------


def test_the_log_formatter_redacts_secrets_whoever_logs_them():
    """Pass: a key, a bearer token and a URL password inside free text, in nested fields and in an
    exception's text, and fields named like secrets, all come out redacted; the key's public
    prefix stays, so a line still names the key."""
    import structlog

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    key = "sk_0123456789ab_" + secrets.token_urlsafe(32).replace("_", "-")
    try:
        structlog.get_logger("tests.redaction").warning(
            "probe",
            note=f"retrying with {key}",
            headers={"Authorization": f"Bearer {key}", "X-Saga-Signature": "v1=abc"},
            password="hunter2-hunter2",
            webhook_secret="whsec-123",
            urls=["postgres://saga:db-pass-123@db:5432/saga"],
            key="sk_0123456789ab",
        )
        try:
            raise RuntimeError(f"upstream refused Authorization: Bearer {key}")
        except RuntimeError:
            logger.exception("failed for %s", key)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    text = stream.getvalue()
    for secret in (key.rsplit("_", 1)[1], "hunter2-hunter2", "whsec-123", "db-pass-123", "v1=abc"):
        assert secret not in text, secret
    first, second = (json.loads(line) for line in text.splitlines())
    assert first["note"] == "retrying with sk_0123456789ab_[redacted]"
    assert first["key"] == "sk_0123456789ab"
    assert first["headers"]["Authorization"] == "[redacted]"
    assert first["urls"] == ["postgres://saga:[redacted]@db:5432/saga"]
    assert "Bearer [redacted]" in second["exception"] and "sk_0123456789ab_[redacted]" in second["event"]


@pytest.fixture
def debug_logs() -> Iterator[io.StringIO]:
    """Everything this process logs, at DEBUG (what LOG_LEVEL=DEBUG does: the root's level), in
    the product's JSON format."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _api(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _record_done(agent: httpx.Client, run_id: str, tool: str, compensation: dict[str, Any], key: str) -> None:
    action = agent.post(
        f"/runs/{run_id}/actions",
        json={
            "tool": tool,
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com"},
            "idempotency_key": key,
            "compensation": compensation,
        },
    )
    assert action.status_code == 201, action.text
    action_id = action.json()["id"]
    assert agent.post(f"/actions/{action_id}/start").status_code == 200
    assert agent.post(f"/actions/{action_id}/succeed", json={"result": {"ok": True}}).status_code == 200


def _keys_made_by_create_agent_key() -> dict[str, str]:
    keys = {}
    for name, scopes in (("onboarding-agent", "agent"), ("ops-automation", "operator")):
        out = io.StringIO()
        call_command("create_agent_key", "--tenant", "acme", "--name", name, "--scopes", scopes, stdout=out)
        keys[name] = out.getvalue().strip().splitlines()[-1]
        assert keys[name].startswith("sk_")  # stdout is where the key belongs
    return keys


def _a_run_undone(agent: httpx.Client, operator: httpx.Client) -> httpx.Response:
    """A run to undo: two actions, each with a webhook compensator. The unwind's answer."""
    undo = agent.post("/runs", json={"agent": "onboarding", "request": "Onboard Ashu"}).json()
    _record_done(
        agent,
        undo["id"],
        "hr.create_user",
        {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        "k-1",
    )
    _record_done(
        agent,
        undo["id"],
        "workspace.provision_license",
        {"tool": "workspace.cancel_license", "args": {"email": "ashu@company.com"}},
        "k-2",
    )
    failed = agent.post(f"/runs/{undo['id']}/fail", json={"error": "the welcome e-mail bounced"})
    assert failed.status_code == 200, failed.text
    item_id = failed.json()["recovery_item"]["id"]
    unwind = operator.post(f"/recovery/{item_id}/compensate", json={"reason": "undo the onboarding"})
    assert unwind.status_code == 202, unwind.text
    return unwind


def _a_run_resumed(agent: httpx.Client, operator: httpx.Client, resume_url: str) -> None:
    """A run to resume: the command is pushed to its resume_url, signed."""
    resumable = agent.post(
        "/runs",
        json={"agent": "onboarding", "request": "Onboard Bo", "resume_url": resume_url},
    )
    assert resumable.status_code == 201, resumable.text
    resume_run = resumable.json()["id"]
    _record_done(
        agent,
        resume_run,
        "hr.create_user",
        {"tool": "hr.delete_user", "args": {"email": "bo@company.com"}},
        "k-3",
    )
    assert agent.post(f"/runs/{resume_run}/checkpoints", json={"name": "user-created"}).status_code == 201
    item = agent.post(f"/runs/{resume_run}/fail", json={"error": "timeout"}).json()["recovery_item"]["id"]
    assert operator.post(f"/recovery/{item}/resume", json={"reason": "try again"}).status_code == 202


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_key_secret_or_password_reaches_the_logs_of_a_full_scenario(
    live_server, tenant, alice, own_redis, start_worker, settings, debug_logs
):
    """Pass: keys created by create_agent_key, actions recorded with them over HTTP, a run undone
    by two signed webhook compensators (one secret from the environment, one from the policy), a
    run resumed (the command pushed signed with the agent's resume secret), a notification webhook
    with its secret, a dashboard login with the right and a wrong password, and failing requests
    (a wrong key, a 404, a 422) — with this process and the worker logging at DEBUG, no line of
    either carries any key, secret, password or session id. (The logs are not empty: they hold
    the 401 and the worker's jobs.)"""
    hr_secret = "hr-env-" + secrets.token_urlsafe(24)
    ws_secret = "ws-literal-" + secrets.token_urlsafe(24)
    resume_master = "resume-master-" + secrets.token_urlsafe(24)
    notify_secret = "notify-" + secrets.token_urlsafe(24)
    wrong_password = "wrong-" + secrets.token_urlsafe(12)
    # What the worker signs with: the secret of the agent whose key creates the resumed run.
    resume_secret = derive_secret(resume_master, f"resume:{tenant.slug}:onboarding-agent")

    keys = _keys_made_by_create_agent_key()
    with serve_webhooks(
        {HR_PATH: hr_secret, WS_PATH: ws_secret, RESUME_PATH: resume_secret, "/notify": notify_secret}
    ) as hooks:
        load_onboarding_policies()
        Compensator.objects.create(
            tool="hr.delete_user", kind="webhook", url=hooks.url(HR_PATH), secret_env="SCENARIO_HR_SECRET"
        )
        Compensator.objects.create(
            tool="workspace.cancel_license", kind="webhook", url=hooks.url(WS_PATH), secret=ws_secret
        )
        settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{hooks.port}"]}
        worker = start_worker(
            LOG_LEVEL="DEBUG",
            RQ_LOG_LEVEL="DEBUG",
            SCENARIO_HR_SECRET=hr_secret,
            SAGA_RESUME_WEBHOOK_SECRET=resume_master,
            SAGA_OUTBOUND_ALLOWED_HOSTS="127.0.0.1",
            SAGA_NOTIFY_WEBHOOKS=hooks.url("/notify"),
            SAGA_NOTIFY_WEBHOOK_SECRET=notify_secret,
        )
        agent = _api(live_server.url, keys["onboarding-agent"])
        operator = _api(live_server.url, keys["ops-automation"])

        unwind = _a_run_undone(agent, operator)
        _a_run_resumed(agent, operator, hooks.url(RESUME_PATH))

        # Failing requests: a wrong key, another run's id, a body the schema refuses.
        wrong_key = keys["onboarding-agent"][:-6] + "abcdef"
        assert _api(live_server.url, wrong_key).get("/runs").status_code == 401
        assert agent.get("/runs/run_doesnotexist").status_code == 404
        assert agent.post("/runs", json={"agent": "", "request": keys["ops-automation"]}).status_code == 422

        # The dashboard: a wrong password, then the right one.
        with httpx.Client(base_url=live_server.url, timeout=30) as browser:
            assert _login(browser, "alice", wrong_password).status_code == 200
            assert _login(browser, "alice", PERSONA_PASSWORD).status_code == 302
            session_id = browser.cookies["sessionid"]
            assert browser.get("/").status_code == 200

        try:
            wait_for(
                lambda: operator.get(f"/unwinds/{unwind.json()['id']}").json()["status"] == "completed",
                timeout=60,
                what="the unwind to complete",
            )
            wait_for(
                lambda: any(call.signature_ok for call in hooks.calls_to(RESUME_PATH)),
                timeout=60,
                what="the resume command to be pushed, signed with the agent's secret",
            )
        except AssertionError:
            raise AssertionError(dump_worker_logs([worker])) from None
        assert all(call.signature_ok for call in hooks.calls_to(HR_PATH) + hooks.calls_to(WS_PATH))
        for client in (agent, operator):
            client.close()
        time.sleep(0.5)  # the worker's last lines
        worker_log = worker.log()

    here = debug_logs.getvalue()
    assert "Unauthorized: /api/v1/runs" in here  # this process's lines were captured
    assert "unwind" in worker_log and "deliver_command" in worker_log  # and the worker's
    everything = here + worker_log
    leaked = {
        name: value
        for name, value in {
            "agent key": keys["onboarding-agent"],
            "agent key's secret part": keys["onboarding-agent"].rsplit("_", 1)[1],
            "operator key's secret part": keys["ops-automation"].rsplit("_", 1)[1],
            "wrong key's secret part": wrong_key.rsplit("_", 1)[1],
            "webhook secret (environment)": hr_secret,
            "webhook secret (policy)": ws_secret,
            "resume secret (master)": resume_master,
            "resume secret (agent)": resume_secret,
            "notification secret": notify_secret,
            "password": PERSONA_PASSWORD,
            "wrong password": wrong_password,
            "session id": session_id,
            "SECRET_KEY": settings.SECRET_KEY,
        }.items()
        if value in everything
    }
    assert not leaked, leaked
