"""Secrets in URLs must not reach a trace backend or a log file.

An outgoing request's URL is often its credential (a Slack incoming webhook's path; a compensator's
webhook, an agent's ``resume_url`` or a SIEM's HEC URL with a token in its path or query; Slack's
``response_url``), and the OIDC callback's ``?code=&state=`` arrives in an incoming one. The attack
is reading the trace backend and the logs. Here the Procfile's web line (gunicorn, its JSON access
log) and a real ``saga_worker`` export every span (``always_on``, both semantic-convention
generations) to a real OTLP/HTTP receiver while each kind of URL is used for real: an unwind calls
two compensator webhooks, a Slack channel is sent a notification, an agent's run is resumed (the
command pushed to its ``resume_url``), a Slack ``response_url`` is answered, the audit stream ships
to HEC, and the OIDC callback is hit with a code and state. Then every exported span (names,
attributes, status) and every log line of both processes is searched for each secret."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from ledger.audit import Actor
from ledger.models import Compensator
from recovery.actions import channels
from recovery.actions.compensations import unwind_start
from recovery.models import AgentCommand, Notification, Unwind
from recovery.notifications.delivery import enqueue_slack_respond
from tests.factories import HR_PATH, HR_SECRET, WS_PATH, WS_SECRET, load_onboarding_policies, onboarding_saga
from tests.support.otlp import OtlpReceiver, ReceivedSpan, serve_otlp
from tests.support.processes import (
    RedisServer,
    Worker,
    database_url_for_subprocesses,
    dump_worker_logs,
    free_port,
    procfile_web,
    serve_webhooks,
    wait_for,
)
from tests.support.receivers import Receiver, serve_receiver
from tests.support.siem import HecReceiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420), pytest.mark.django_db(transaction=True)]

SECRET = {
    name: f"{name}-{secrets.token_hex(12)}"
    for name in (
        "hook_path",
        "hook_query",
        "slack_hook",
        "resume_path",
        "resume_query",
        "response_path",
        "hec_query",
        "oidc_code",
        "oidc_state",
    )
}
HR_HOOK = f"{HR_PATH}/{SECRET['hook_path']}?token={SECRET['hook_query']}"
WS_HOOK = f"{WS_PATH}/{SECRET['hook_path']}?token={SECRET['hook_query']}"
SLACK_HOOK = f"/services/T0SAGA/B0SAGA/{SECRET['slack_hook']}"
RESUME = f"/agents/{SECRET['resume_path']}/resume?token={SECRET['resume_query']}"
RESPONSE = f"/actions/{SECRET['response_path']}"
CLIENT = 3  # SpanKind.CLIENT in OTLP
SERVER = 2


def _env(receiver: OtlpReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        # Every span, lone client calls included, in both generations of the HTTP conventions
        # (http.url/http.target and url.full/url.path/url.query): what a deployment may choose.
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "http/dup",
        "SAGA_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "INFO",
        "RQ_LOG_LEVEL": "INFO",
    }


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with serve_otlp() as receiver:
        yield receiver


@pytest.fixture
def outbound() -> Iterator[dict[str, Receiver]]:
    """One receiver per kind of URL: after the fix a span names only the host and port it went to."""
    with serve_receiver() as slack, serve_receiver() as resume, serve_receiver() as response:
        yield {"slack": slack, "resume": resume, "response": response}


@pytest.fixture
def web(otlp: OtlpReceiver, own_redis: RedisServer, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    metrics, static = tmp_path / "prometheus", tmp_path / "static"
    metrics.mkdir()
    static.mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": own_redis.url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "PORT": str(port),
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "2",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
        "STATIC_ROOT": str(static),
        # Single sign-on on, with a provider that is never reached: the callback below carries a
        # state no session issued, which the callback refuses before any exchange.
        "SAGA_OIDC_ISSUER": "http://127.0.0.1:9/",
        "SAGA_OIDC_CLIENT_ID": "saga-tests",
        "SAGA_OIDC_CLIENT_SECRET": "tests-only-oidc-client-secret",
        **_env(otlp, "saga-web-under-test"),
    }
    log = tmp_path / "web.log"
    with procfile_web(env, log):
        yield f"http://127.0.0.1:{port}", log


def _port_of(span: ReceivedSpan) -> int | None:
    port = span.attributes.get("server.port", span.attributes.get("net.peer.port"))
    return int(port) if port is not None else None


def _client_span_to(otlp: OtlpReceiver, port: int) -> ReceivedSpan | None:
    with otlp.lock:
        return next((s for s in otlp.spans if s.kind == CLIENT and _port_of(s) == port), None)


def _everything_exported(otlp: OtlpReceiver) -> list[tuple[str, str, str]]:
    with otlp.lock:
        found = [(s.name, "name", s.name) for s in otlp.spans]
        found += [(s.name, key, str(value)) for s in otlp.spans for key, value in s.attributes.items()]
    return found


def test_no_url_secret_reaches_a_span_or_a_log_line(
    web,
    otlp,
    outbound,
    start_worker: Callable[..., Worker],
    tenant,
    agent,
    agent_key,
    operator_key,
    alice,
    dave,
    settings,
):
    base, web_log = web
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1"]}
    hec = HecReceiver().start()
    try:
        with serve_webhooks({HR_HOOK: HR_SECRET, WS_HOOK: WS_SECRET}) as hooks:
            worker = start_worker(
                **_env(otlp, "saga-worker-under-test"),
                SAGA_AUDIT_HEC_URL=f"{hec.url()}?channel={SECRET['hec_query']}",
                SAGA_AUDIT_HEC_TOKEN=hec.token,
                SAGA_AUDIT_KEY="traces-test-audit-key",
                SAGA_AUDIT_HEAD_INTERVAL_S="0.5",
                # Periodic duties (the audit stream's delivery among them) every 30 s, not every 1:
                # on a busy machine the default queue's sweeps, which the worker takes first, would
                # otherwise pile up ahead of the jobs this test waits for.
                SAGA_SWEEP_INTERVAL_S="30",
            )
            _use_every_kind_of_url(base, hooks, outbound, tenant, agent, agent_key, operator_key, alice, dave)
            try:
                for name, port in (
                    ("compensator webhook", hooks.port),
                    ("Slack incoming webhook", outbound["slack"].port),
                    ("resume_url", outbound["resume"].port),
                    ("Slack response_url", outbound["response"].port),
                    ("HEC", hec.port),
                ):
                    wait_for(
                        partial(_client_span_to, otlp, port), timeout=60, what=f"the {name}'s client span"
                    )
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
            callback = wait_for(
                lambda: next((s for s in otlp.named("GET oidc/callback/") if s.kind == SERVER), None),
                timeout=30,
                what="the OIDC callback's server span",
            )
            worker.stop()
    finally:
        hec.stop()

    # Every secret, wherever it went: the spans (by name and attribute) and the log files.
    exported = _everything_exported(otlp)
    logs = {log.name: log.read_text(errors="replace") for log in (web_log, worker.log_path)}
    leaks = {
        name: sorted(
            {f"span {where!r} {key}" for where, key, value in exported if secret in value}
            | {f"log {log}" for log, text in logs.items() if secret in text}
        )
        for name, secret in SECRET.items()
    }
    found = {name: where for name, where in leaks.items() if where}
    assert found == {}, f"secrets leaked: {found}"
    # What is left of a URL: its scheme, host and port, and for a request served, its route.
    slack_span = _client_span_to(otlp, outbound["slack"].port)
    assert slack_span is not None
    assert slack_span.attributes["url.full"] == f"http://127.0.0.1:{outbound['slack'].port}"
    assert slack_span.attributes["http.url"] == f"http://127.0.0.1:{outbound['slack'].port}"
    assert callback.attributes["http.route"] == "oidc/callback/"
    assert callback.attributes["http.target"] == callback.attributes["url.path"] == "/oidc/callback/"
    assert callback.attributes["url.query"] == "[redacted]"

    # The access log still says which request it was.
    assert '"path": "/oidc/callback/"' in web_log.read_text()


def _use_every_kind_of_url(
    base: str,
    hooks: Any,
    outbound: dict[str, Receiver],
    tenant: Any,
    agent: Actor,
    agent_key: Any,
    operator_key: Any,
    alice: Any,
    dave: Any,
) -> None:
    # Compensator webhooks with a token in the path and the query: an unwind calls both.
    load_onboarding_policies(webhooks=hooks)
    for tool, path in (("hr.delete_user", HR_HOOK), ("workspace.cancel_license", WS_HOOK)):
        Compensator.objects.filter(tenant=None, tool=tool).update(url=hooks.url(path))
    saga = onboarding_saga(tenant, agent)
    assert saga.item is not None
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="hire withdrew")

    # A Slack incoming webhook, whose path is the credential: the channel's test notification.
    channel = channels.channel_create(
        tenant=tenant,
        actor=Actor.for_user(dave),
        name="ops slack",
        kind="slack",
        target=outbound["slack"].url(SLACK_HOOK),
    ).channel
    channels.channel_send_test(channel=channel, actor=Actor.for_user(dave))

    # An agent's resume_url with a secret in path and query: its run failed and resumed over HTTP.
    agent_http = httpx.Client(
        base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {agent_key[1]}"}, timeout=30
    )
    operator_http = httpx.Client(
        base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {operator_key[1]}"}, timeout=30
    )
    with agent_http, operator_http:
        created = agent_http.post(
            "/runs",
            json={
                "agent": "onboarding",
                "request": "Onboard Ashu",
                "resume_url": outbound["resume"].url(RESUME),
            },
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        failed = agent_http.post(f"/runs/{run_id}/fail", json={"error": "mail gateway 429"})
        assert failed.status_code == 200, failed.text
        resumed = operator_http.post(
            f"/recovery/{failed.json()['recovery_item']['id']}/resume", json={"reason": "gateway fixed"}
        )
        assert resumed.status_code == 202, resumed.text

    # A Slack response_url, answered by the worker's job (as a button press's answer is).
    enqueue_slack_respond(response_url=outbound["response"].url(RESPONSE), message={"text": "Approved."})

    # The OIDC callback, as the provider redirects the browser to it.
    called_back = httpx.get(
        f"{base}/oidc/callback/",
        params={"code": SECRET["oidc_code"], "state": SECRET["oidc_state"]},
        timeout=30,
    )
    assert called_back.status_code in (302, 400, 403), called_back.text

    def delivered() -> dict[str, bool]:
        unwind.refresh_from_db()
        return {
            "unwind": unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED),
            "slack": Notification.objects.filter(
                channel=channel, status=Notification.Status.DELIVERED
            ).exists(),
            "command": AgentCommand.objects.filter(run_id=run_id, delivered_at__isnull=False).exists(),
            "response_url": len(outbound["response"].received) == 1,
        }

    try:
        wait_for(lambda: all(delivered().values()), timeout=200, what="every delivery")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {delivered()}") from exc
