"""API keys at rest and in rotation, signatures receivers can verify, production security settings,
CSP on every dashboard response, and what the structured logs carry (and never carry)."""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import subprocess
import sys

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from saga_client.signing import signed_headers, verify_signature

from infra.hashing import sha256_hex
from ledger.audit import Actor
from ledger.models import AgentKey
from ledger.services.keys import agent_key_create, agent_key_revoke
from saga_admin.logs import json_formatter
from tests.factories import onboarding_run
from tests.support.api import Api
from tests.support.processes import ROOT
from tests.support.routes import dashboard_patterns, fill_route


@pytest.mark.django_db
def test_keys_are_hashed_at_rest_shown_once_and_rotate_without_downtime(tenant):
    """Pass: no column of the key's row holds the secret; the digest is SHA-256 of the secret part;
    an old and a new key both work while rotating; the revoked one gets 401 and the other still
    works."""
    old = agent_key_create(tenant=tenant, name="v1", scopes=["agent"], actor=Actor.system("tests"))
    new = agent_key_create(tenant=tenant, name="v2", scopes=["agent"], actor=Actor.system("tests"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(k)::text FROM ledger_agentkey k")
        stored = " ".join(row[0] for row in cursor.fetchall())
    for issued in (old, new):
        secret_part = issued.secret.rsplit("_", 1)[1]
        assert secret_part not in stored and issued.secret not in stored
        assert AgentKey.objects.get(pk=issued.key.pk).key_hash == sha256_hex(secret_part)
    assert Api(old.secret).get("/runs").status_code == 200
    assert Api(new.secret).get("/runs").status_code == 200
    agent_key_revoke(key=old.key, actor=Actor.system("tests"))
    assert Api(old.secret).get("/runs").status_code == 401
    assert Api(new.secret).get("/runs").status_code == 200


def test_signatures_verify_only_with_the_secret_and_only_while_fresh():
    """Pass: what the compensator and resume webhooks send verifies with the receiver helper; a
    changed body, another secret or a replay older than the tolerance does not."""
    body = b'{"step_id": "stp_1"}'
    headers = signed_headers("s3cret", body)
    assert verify_signature("s3cret", headers, body)
    assert not verify_signature("s3cret", headers, body + b" ")
    assert not verify_signature("other", headers, body)
    stale = signed_headers("s3cret", body, timestamp=int(headers["X-Saga-Timestamp"]) - 3600)
    assert not verify_signature("s3cret", stale, body)


def test_production_settings_harden_transport_and_sessions():
    """Pass: with DEBUG=0 (what the Procfile runs), HSTS is a year with subdomains, cookies are
    secure and HttpOnly, sessions end after SESSION_COOKIE_AGE and sooner when idle, HTTPS is
    enforced, and a response over HTTPS carries the HSTS header."""
    keep = {
        name: os.environ[name] for name in ("PATH", "HOME", "DATABASE_URL", "REDIS_URL") if name in os.environ
    }
    env = {**keep, "DEBUG": "0", "ALLOWED_HOSTS": "example.com", "SECRET_KEY": secrets.token_urlsafe(64)}
    script = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "from django.test import Client; "
        "r = Client().get('/login/', secure=True, HTTP_HOST='example.com'); "
        "print(json.dumps({'hsts': s.SECURE_HSTS_SECONDS, 'sub': s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
        "'ssl': s.SECURE_SSL_REDIRECT, 'sc': s.SESSION_COOKIE_SECURE, 'cc': s.CSRF_COOKIE_SECURE, "
        "'http': s.SESSION_COOKIE_HTTPONLY, 'age': s.SESSION_COOKIE_AGE, 'idle': s.SESSION_IDLE_TIMEOUT_S, "
        "'header': r.headers.get('Strict-Transport-Security', '')}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "DJANGO_SETTINGS_MODULE": "saga_admin.settings"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["hsts"] >= 31536000 and got["sub"] and got["ssl"]
    assert got["sc"] and got["cc"] and got["http"]
    assert 0 < got["idle"] < got["age"] <= 12 * 3600
    assert "max-age=31536000" in got["header"] and "includeSubDomains" in got["header"]


def _csp_ok(response) -> bool:
    policy = response.get("Content-Security-Policy", "")
    return (
        "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy and "unsafe-eval" not in policy
    )


@pytest.mark.django_db
def test_every_dashboard_response_carries_the_csp(tenant, agent, alice, carol, mallory):
    """Pass: every dashboard URL (from the resolver), its GET and POST answers alike, including
    redirects, 403s, 404s and the login page, carries a CSP with frame-ancestors 'none' and no
    'unsafe-inline' or 'unsafe-eval'."""
    world = {
        name: "x_0"
        for name in (
            "run_id",
            "item_id",
            "unwind_id",
            "step_id",
            "action_id",
            "approval_id",
            "pause_id",
            "bulk_id",
        )
    } | {
        "slug": "acme",
        "channel_id": "x_0",
        "link_id": "1",
        "tenant_id": "1",
        "compensator_id": "1",
        "pk": "1",
        "token": "not-a-press-token",
        "link": "not-an-email-link",
    }
    checked = 0
    for user in (alice, carol, mallory, None):
        client = Client()
        if user is not None:
            client.force_login(user)
        for route, name in dashboard_patterns():
            url = fill_route(route, world)
            for method in ("get", "post"):
                response = getattr(client, method)(url)
                assert _csp_ok(response), (
                    name,
                    method,
                    response.status_code,
                    response.get("Content-Security-Policy"),
                )
                checked += 1
    login = Client().get(reverse("login"))
    assert _csp_ok(login)
    assert checked > 50


@pytest.fixture
def json_logs():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    root.removeHandler(handler)


@pytest.mark.django_db
def test_logs_carry_request_tenant_and_run_but_never_a_key(tenant, agent, operator_key, json_logs):
    """Pass: a refused decision through the API logs a JSON line carrying the request id, the
    tenant and the run id; no log line contains the raw API key or its secret part (sent in the
    Authorization header, valid or not)."""
    from ledger.services import runs
    from recovery.actions.reports import run_fail_and_queue

    run = runs.run_create(tenant=tenant, actor=agent, agent="x", request="y")
    item = run_fail_and_queue(run=run, actor=agent, error="boom").item
    api = Api(operator_key[1])
    assert api.post(f"/recovery/{item.pk}/close", {"reason": "done"}).status_code == 200
    refused = api.post(
        f"/recovery/{item.pk}/close", {"reason": "again"}, headers={"X-Request-Id": "req-sec-1"}
    )
    assert refused.status_code == 409
    Api(operator_key[1] + "x").get("/runs")  # a wrong key: 401
    records = json_logs()
    line = next(r for r in records if r.get("event") == "decision.refused")
    assert (line["request_id"], line["tenant"], line["run_id"]) == ("req-sec-1", "acme", run.pk)
    raw = json.dumps(records)
    secret_part = operator_key[1].rsplit("_", 1)[1]
    assert secret_part not in raw and operator_key[1] not in raw


@pytest.mark.django_db
def test_failed_logins_lock_out_and_refusals_are_recorded(
    client, tenant, agent, alice, carol, settings, json_logs
):
    """Pass: failed logins are recorded by axes (AccessAttempt) and lock the account out after the
    limit even with the right password; a viewer's refused decision (403) is logged as a JSON line
    with its request id."""
    from axes.models import AccessAttempt

    settings.AXES_FAILURE_LIMIT = 3
    for _ in range(3):
        client.post(reverse("login"), {"username": "alice", "password": "wrong"})
    assert AccessAttempt.objects.filter(username="alice").get().failures_since_start == 3
    client.post(reverse("login"), {"username": "alice", "password": "correct-horse-battery"})
    assert "_auth_user_id" not in client.session

    _run, item = onboarding_run(tenant, agent)
    viewer = Client()
    viewer.force_login(carol)
    assert (
        viewer.post(reverse("dashboard:item-close", args=[item.pk]), {"reason": "viewer"}).status_code == 403
    )
    forbidden = [
        r for r in json_logs() if r.get("logger") == "django.request" and "Forbidden" in r.get("event", "")
    ]
    assert forbidden and all(r.get("request_id") for r in forbidden)
