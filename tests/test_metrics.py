"""``GET /metrics`` (saga_admin/metrics.py) in this process: the token gate (404 while unset, 401
without it, whatever the header holds), the named metrics and what moves them, the gauges read at
scrape time, and the alert rules and Grafana dashboard under deploy/ checked against what is
exposed. The scrape of a live gunicorn and a live worker is tests/test_metrics_live.py."""

from __future__ import annotations

import base64
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import transaction
from django.test import Client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from infra import exposition
from infra import metrics as process_metrics
from ledger.audit import Actor, audit_record
from ledger.models import Event, Tenant
from recovery import jobs, scheduling
from recovery import metrics as recovery_metrics
from recovery.audit_stream import delivery
from recovery.audit_stream.models import AuditCursor
from recovery.models import RecoveryItem
from tests.factories import gated_run, new_action, new_run, onboarding_run
from tests.support import promql
from tests.support.api import Api
from tests.support.processes import ROOT, RedisServer
from tests.support.promtool import check_metrics
from tests.support.siem import SyslogReceiver

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-0123456789abcdef"


@pytest.fixture
def token(settings: Any) -> str:
    settings.SAGA = {**settings.SAGA, "METRICS_TOKEN": TOKEN}
    return TOKEN


@pytest.fixture
def syslog_sink(settings: Any) -> str:
    """An installation syslog sink: the audit stream's lag has a series per tenant. Nothing is
    sent to it here (no worker runs); a test that delivers starts a receiver of its own."""
    settings.AUDIT_STREAM = {**settings.AUDIT_STREAM, "SYSLOG_URL": "tcp://127.0.0.1:9"}
    return "syslog"


def _scrape(client: Client, token: str = TOKEN) -> dict[str, float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "no-cache" in response["Cache-Control"]
    return promql.exposed(response.content.decode())


# --- The gate -----------------------------------------------------------------------------------


@pytest.mark.parametrize("header", [None, f"Bearer {TOKEN}", "Bearer anything"])
def test_it_is_404_while_no_token_is_configured(client: Client, settings: Any, header: str | None) -> None:
    settings.SAGA = {**settings.SAGA, "METRICS_TOKEN": ""}
    headers = {"Authorization": header} if header else {}
    assert client.get("/metrics", headers=headers).status_code == 404
    assert client.post("/metrics", headers=headers).status_code == 404


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong-token",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer{TOKEN}",
        TOKEN,
        f"Token {TOKEN}",
        "Basic " + base64.b64encode(f"prometheus:{TOKEN}".encode()).decode(),
        "Bearer \u00e9\u00e8\u00ff",
        "Bearer \u20ac\U0001f600",  # beyond latin-1: what a test client, not a socket, can send
        "Bearer " + "x" * 10000,
    ],
)
def test_it_is_401_without_the_token_or_with_another(client: Client, token: str, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"saga_" not in response.content


def test_the_scheme_is_case_insensitive_and_spaces_around_the_token_do_not_matter(
    client: Client, token: str
) -> None:
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer {TOKEN}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"  BEARER   {TOKEN}  ").status_code == 200


def test_a_token_outside_ascii_compares_as_the_utf8_a_client_sends(client: Client, settings: Any) -> None:
    settings.SAGA = {**settings.SAGA, "METRICS_TOKEN": "t\u00f6ken"}
    # WSGI hands headers over as latin-1 text: the UTF-8 bytes of "töken" arrive as "tÃ¶ken".
    sent = "t\u00f6ken".encode().decode("latin-1")
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {sent}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t\u00f6ken").status_code == 401


def test_raw_bytes_in_the_header_are_refused_not_a_500(live_server: Any, token: str) -> None:
    """Over a socket, bytes no decoding expects (invalid UTF-8, control characters)."""
    address = urlsplit(live_server.url)
    for value in (
        b"Bearer \xff\xfe\x80",
        b"Bearer \xc3(",
        b"Basic \x00\x01",
        b"\xe2\x82\xac " + TOKEN.encode(),
    ):
        with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
            sock.sendall(
                b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
                + value
                + b"\r\nConnection: close\r\n\r\n"
            )
            head = sock.recv(1024).split(b"\r\n", 1)[0]
        assert head.split()[1] in (b"400", b"401"), (value, head)


def test_only_get_and_head_with_the_token(client: Client, token: str) -> None:
    assert client.post("/metrics").status_code == 401  # the gate first: nothing said to a stranger
    response = client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert (response.status_code, response["Allow"]) == (405, "GET, HEAD")
    assert client.head("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_it_is_never_redirected_to_https_or_the_login(token: str, settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    client = Client()  # its handler loads the middleware with the setting above
    assert client.get("/login/").status_code == 301
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/metrics").status_code == 401


def test_it_answers_prometheus_asking_by_the_pods_address(token: str, settings: Any) -> None:
    """Prometheus scrapes a pod by its IP, which ALLOWED_HOSTS (the public name) does not list: a
    page asked that way is refused (the check is live), the scrape is answered."""
    settings.ALLOWED_HOSTS = ["saga.example.com"]
    client = Client(HTTP_HOST="10.1.2.3:8000")
    assert client.get("/login/").status_code == 400
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert client.get("/metrics").status_code == 401


# --- The charts page's old address --------------------------------------------------------------


def test_the_old_charts_address_sends_a_signed_in_person_to_insights(client: Client, alice: Any) -> None:
    assert client.get("/metrics/").status_code == 404  # signed out: nothing there, no login page
    client.force_login(alice)
    response = client.get("/metrics/", {"window": "24h"})
    assert (response.status_code, response["Location"]) == (302, "/insights/?window=24h")
    assert client.get("/insights/").status_code == 200


# --- What is exposed ----------------------------------------------------------------------------

NAMED = {
    "saga_recovery_items_open",
    "saga_approvals_pending",
    "saga_approvals_expiring_soon",
    "saga_approval_oldest_pending_seconds",
    "saga_unwind_steps_total",
    "saga_unwind_step_duration_seconds_bucket",
    "saga_unwinds_active",
    "saga_unwind_step_oldest_in_flight_seconds",
    "saga_ledger_writes_total",
    "saga_ledger_write_duration_seconds_bucket",
    "saga_pruned_rows_total",
    "saga_notifications_pending",
    "saga_notification_oldest_due_seconds",
    "saga_http_request_duration_seconds_bucket",
    "saga_http_requests_total",
    "saga_rq_queue_jobs",
    "saga_rq_workers",
    "saga_database_up",
    "saga_redis_up",
    "saga_build_info",
    "saga_periodic_last_tick_timestamp_seconds",
    # With a sink configured (each test here that checks this list configures one).
    "saga_audit_stream_undelivered_events",
    "saga_audit_stream_lag_seconds",
}


def test_every_named_metric_is_exposed_before_anything_happened(
    client: Client, token: str, tenant: Any, own_redis: RedisServer, syslog_sink: str
) -> None:
    samples = _scrape(client)
    assert {key.split("{", 1)[0] for key in samples} >= NAMED
    for reason in RecoveryItem.Reason.values:
        assert samples[f'saga_recovery_items_open{{reason="{reason}",tenant="acme"}}'] == 0
    assert samples['saga_approvals_pending{tenant="acme"}'] == 0
    assert samples["saga_notifications_pending"] == 0
    for outcome in recovery_metrics.STEP_OUTCOMES:
        assert f'saga_unwind_steps_total{{outcome="{outcome}"}}' in samples
    for kind in ("record", "move"):
        assert f'saga_ledger_writes_total{{kind="{kind}"}}' in samples
    for store in process_metrics.PRUNED_STORES:
        assert f'saga_pruned_rows_total{{store="{store}"}}' in samples
    for queue in ("default", "compensations", "notifications"):
        assert samples[f'saga_rq_queue_jobs{{queue="{queue}"}}'] == 0
        assert samples[f'saga_rq_workers{{queue="{queue}"}}'] == 0
    assert samples["saga_database_up"] == 1 and samples["saga_redis_up"] == 1
    assert samples["saga_periodic_last_tick_timestamp_seconds"] == 0  # no ticker has run


def test_recording_through_the_api_moves_the_ledger_and_request_metrics(
    client: Client, token: str, agent_key: Any, onboarding_policies: Any
) -> None:
    _scrape(client)  # answered and counted (below), as Prometheus's scrape is
    before = promql.own_process_samples()
    api = Api(agent_key[1])
    run = new_run(api)
    for n in range(3):
        new_action(api, run["id"], key=f"k-{n}")
    replay = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
            "idempotency_key": "k-0",
            "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        },
    )
    assert replay.status_code == 200  # a replay: answered, nothing written
    _scrape(client)
    # This process's own counters: other processes of the directory may be counting meanwhile.
    after = promql.own_process_samples()

    def moved(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert moved('saga_ledger_writes_total{kind="record"}') == 3
    assert moved('saga_ledger_write_duration_seconds_count{kind="record"}') == 4
    assert moved('saga_http_requests_total{status="2xx",surface="api"}') == 5
    assert moved('saga_http_request_duration_seconds_count{surface="api"}') == 5
    # The scrape between the two readings was answered and counted too.
    assert moved('saga_http_requests_total{status="2xx",surface="metrics"}') == 1


def test_each_request_counts_under_its_surface(client: Client, token: str, alice: Any) -> None:
    """The probes and the scrape as ProbeMiddleware answered them (its paths, saga_admin.health's
    HOSTLESS, are the one list); a path that only looks like a probe is a page."""
    from saga_admin.health import PROBES

    before = promql.own_process_samples()
    for path in PROBES:
        client.get(path)
    client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    client.get("/livez/")  # not a probe: the pages' 404
    client.force_login(alice)
    client.get("/favicon.ico")
    after = promql.own_process_samples()

    def moved(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    probes = sum(moved(f'saga_http_requests_total{{status="{s}",surface="probes"}}') for s in ("2xx", "5xx"))
    assert probes == len(PROBES)
    assert moved('saga_http_requests_total{status="4xx",surface="metrics"}') == 1
    assert moved('saga_http_requests_total{status="4xx",surface="pages"}') == 1
    assert moved('saga_http_requests_total{status="2xx",surface="static"}') == 1


def test_an_unwind_step_outcome_counts_once_its_transaction_commits(
    django_capture_on_commit_callbacks: Any,
) -> None:
    count = _counter_value
    done, retry, running = count("done"), count("retry"), count("running")
    with django_capture_on_commit_callbacks(execute=False) as uncommitted:
        recovery_metrics.step_moved(to="done", kind="step.done")
    assert count("done") == done  # not committed (yet): not counted
    with django_capture_on_commit_callbacks(execute=True):
        recovery_metrics.step_moved(to="done", kind="step.done")
        recovery_metrics.step_moved(to="queued", kind="step.retry_scheduled")
        recovery_metrics.step_moved(to="running", kind="step.claimed")  # not an outcome
    assert (count("done"), count("retry"), count("running")) == (done + 1, retry + 1, running)
    assert len(uncommitted) == 1


def _counter_value(outcome: str) -> float:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(process_metrics.MULTIPROCESS_DIR))
    return registry.get_sample_value("saga_unwind_steps_total", {"outcome": outcome}) or 0.0


def test_open_items_and_pending_approvals_are_counted_per_tenant(
    client: Client, token: str, tenant: Any, other_tenant: Any, agent: Actor, own_redis: RedisServer
) -> None:
    onboarding_run(tenant, agent, name="P1", email="p1@company.com")
    _, item = onboarding_run(tenant, agent, name="P2", email="p2@company.com")
    RecoveryItem.objects.filter(pk=item.pk).update(reason="agent_lost", status="claimed")
    gated_run(tenant, agent)
    samples = _scrape(client)
    assert samples['saga_recovery_items_open{reason="failed",tenant="acme"}'] == 1
    assert samples['saga_recovery_items_open{reason="agent_lost",tenant="acme"}'] == 1
    assert samples['saga_recovery_items_open{reason="failed",tenant="globex"}'] == 0
    assert samples['saga_approvals_pending{tenant="acme"}'] == 1
    assert samples['saga_approvals_pending{tenant="globex"}'] == 0
    assert samples['saga_approvals_expiring_soon{tenant="acme"}'] == 0  # expires in 24 h
    assert samples['saga_approval_oldest_pending_seconds{tenant="acme"}'] >= 0
    # The item's failure was announced: one outbox row per channel (none configured here).
    assert samples["saga_notifications_pending"] >= 0


def test_with_redis_down_the_scrape_answers_without_its_gauges(
    client: Client, token: str, tenant: Any, own_redis: RedisServer
) -> None:
    own_redis.stop()
    samples = _scrape(client)
    assert samples["saga_redis_up"] == 0 and samples["saga_database_up"] == 1
    assert not any(key.startswith("saga_rq_") for key in samples)
    assert samples['saga_approvals_pending{tenant="acme"}'] == 0


def test_the_scrape_passes_promtool_and_holds_only_our_namespace(
    client: Client, token: str, tenant: Any, own_redis: RedisServer, syslog_sink: str
) -> None:
    """django-rq's import-time summary is in this process's files (its URLs are loaded), named as
    promtool refuses; the scrape leaves it, and anything else outside ``saga_``, out."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(process_metrics.MULTIPROCESS_DIR))
    assert "rq_request_processing_seconds_total" in generate_latest(registry).decode()
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    text = response.content.decode()
    check_metrics(text)
    assert {name for name in promql.exposed_names(text) if not name.startswith("saga_")} == set()


def test_the_build_info_names_the_version_revision_and_python(
    client: Client, token: str, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    infos = {k: v for k, v in _scrape(client).items() if k.startswith("saga_build_info")}
    labels = f'python="{platform.python_version()}",revision="{commit}",version="{importlib.metadata.version("saga-admin")}"'
    assert infos == {f"saga_build_info{{{labels}}}": 1.0}
    # A build says its revision (an image has no checkout to ask).
    monkeypatch.setenv(exposition.REVISION_VARIABLE, "v0.1.0-3-gabc1234")
    exposition.revision.cache_clear()
    try:
        assert exposition.revision() == "v0.1.0-3-gabc1234"
        assert 'revision="v0.1.0-3-gabc1234"' in next(
            k for k in _scrape(client) if k.startswith("saga_build_info")
        )
    finally:
        monkeypatch.delenv(exposition.REVISION_VARIABLE)
        exposition.revision.cache_clear()


def test_the_periodic_ticker_records_its_last_pass(
    client: Client, token: str, own_redis: RedisServer
) -> None:
    assert _scrape(client)["saga_periodic_last_tick_timestamp_seconds"] == 0
    before = time.time()
    scheduling.tick(jobs.periodic_run)
    after = time.time()
    assert before <= _scrape(client)["saga_periodic_last_tick_timestamp_seconds"] <= after
    own_redis.flush()  # Redis emptied: no pass recorded until the next one
    assert _scrape(client)["saga_periodic_last_tick_timestamp_seconds"] == 0


def _audit_events(tenant: Tenant, count: int) -> None:
    for n in range(count):
        with transaction.atomic():
            audit_record(tenant=tenant, actor=Actor.system("test"), kind="test.event", subject=f"thing:{n}")


@pytest.mark.django_db(transaction=True)
def test_the_audit_stream_lag_is_per_sink_and_tenant_and_falls_to_zero_once_delivered(
    client: Client, token: str, settings: Any, tenant: Tenant, other_tenant: Tenant, own_redis: RedisServer
) -> None:
    syslog = SyslogReceiver().start()
    try:
        settings.AUDIT_STREAM = {"KEY": "test-audit-key-0123456789", "SYSLOG_URL": syslog.url(), "BATCH": 100}
        _audit_events(tenant, 3)
        samples = _scrape(client)
        undelivered = 'saga_audit_stream_undelivered_events{sink="syslog",tenant="acme"}'
        lag = 'saga_audit_stream_lag_seconds{sink="syslog",tenant="acme"}'
        assert samples[undelivered] == Event.objects.filter(tenant=tenant).count() >= 3
        assert samples[lag] > 0
        assert samples['saga_audit_stream_undelivered_events{sink="syslog",tenant="globex"}'] == (
            Event.objects.filter(tenant=other_tenant).count()
        )
        delivery.audit_stream_deliver()
        assert syslog.errors == [] and syslog.received()
        samples = _scrape(client)
        assert (samples[undelivered], samples[lag]) == (0, 0)
        _audit_events(tenant, 2)  # written after the pass: behind by exactly those
        assert _scrape(client)[undelivered] == 2
    finally:
        syslog.stop()


def test_a_failing_audit_stream_lag_leaves_out_only_its_own_families(
    client: Client, token: str, tenant: Tenant, own_redis: RedisServer, syslog_sink: str
) -> None:
    """The lag's query fails in PostgreSQL (here a cursor whose snapshot no longer parses; at size,
    the statement timeout of a sink's first pass): its savepoint is rolled back, and the rest of
    the database's gauges, read in the same transaction, still answer."""
    AuditCursor.objects.create(sink="syslog", tenant=tenant, done_snapshot="not a snapshot")
    samples = _scrape(client)
    assert samples["saga_database_up"] == 1
    assert samples['saga_approvals_pending{tenant="acme"}'] == 0
    assert not any(key.startswith("saga_audit_stream_") for key in samples)


# --- Where the files live -------------------------------------------------------------------------


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py`` with only a deployment's environment (the suite's must not leak in)."""
    base = {
        name: os.environ[name] for name in ("PATH", "HOME", "DATABASE_URL", "REDIS_URL") if name in os.environ
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env={**base, "SECRET_KEY": "x" * 50, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_command_that_moved_no_metric_leaves_no_file_behind(tmp_path: Path) -> None:
    result = _manage("check", PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unusable_metrics_directory_stops_the_process_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = _manage("check", PROMETHEUS_MULTIPROC_DIR=str(blocker / "metrics"))
    assert result.returncode == 1
    assert "PROMETHEUS_MULTIPROC_DIR" in result.stderr and "Traceback" not in result.stderr


def test_the_metrics_directory_is_the_variable_or_one_per_deployment(tmp_path: Any) -> None:
    assert process_metrics.multiprocess_dir({"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}) == tmp_path
    one = {"DATABASE_URL": "postgres://db/saga", "REDIS_URL": "redis://r/0"}
    assert process_metrics.multiprocess_dir(one) == process_metrics.multiprocess_dir(dict(one))
    other = {**one, "DATABASE_URL": "postgres://db/saga_staging"}
    assert process_metrics.multiprocess_dir(one) != process_metrics.multiprocess_dir(other)
    assert process_metrics.multiprocess_dir(one).name.startswith("saga-admin-metrics-")


def test_no_process_keeps_a_live_gauge_so_no_worker_needs_marking_dead() -> None:
    """saga_admin.gunicorn has no child_exit hook: prometheus-client's mark_process_dead removes
    only live gauges' files, and every gauge here is computed at scrape time. A Gauge added to a
    process needs that hook back."""
    import prometheus_client

    from saga_admin import gunicorn as hooks
    from saga_admin import metrics  # noqa: F401 - the request metrics, registered as it loads

    collectors = set(prometheus_client.REGISTRY._names_to_collectors.values())
    names = {getattr(c, "_name", "") for c in collectors}
    assert {"saga_ledger_writes", "saga_unwind_steps", "saga_http_requests"} <= names  # all loaded
    assert [c for c in collectors if isinstance(c, prometheus_client.Gauge)] == []
    assert not hasattr(hooks, "child_exit")


# --- deploy/: the alert rules and the dashboard -------------------------------------------------

REQUIRED_ALERTS = {
    "SagaScrapeFailing",
    "SagaMetricsAbsent",
    "SagaUnwindStuck",
    "SagaRecoveryQueueGrowing",
    "SagaApprovalsAboutToExpire",
    "SagaApprovalPendingTooLong",
    "SagaNotificationBacklog",
    "SagaWorkersGone",
}
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def test_the_rules_file_is_what_prometheus_loads() -> None:
    rules = promql.load_rules()
    assert set(rules) == {"groups"} and rules["groups"], "a rules file is {groups: [...]}"
    names = []
    for group in rules["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, rule
            assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", rule["alert"]), rule["alert"]
            assert isinstance(rule["expr"], str) and promql.selected_metrics(rule["expr"])
            assert _DURATION.match(str(rule["for"])), (rule["alert"], rule["for"])
            assert rule["labels"]["severity"] in {"warning", "critical"}
            assert all(isinstance(v, str) for v in rule["labels"].values())
            assert {"summary", "description"} <= set(rule["annotations"])
            names.append(rule["alert"])
    assert len(names) == len(set(names)), "alert names repeat"
    assert set(names) >= REQUIRED_ALERTS


def test_a_failed_scrape_has_alerts_of_its_own() -> None:
    """Every other rule reads what the scrape brings; these two fire when nothing arrives."""
    rules = {rule["alert"]: rule for group in promql.load_rules()["groups"] for rule in group["rules"]}
    failing, absent = rules["SagaScrapeFailing"], rules["SagaMetricsAbsent"]
    assert promql.selected_metrics(failing["expr"]) == {"up"}
    assert '{job=~"saga-admin.*"}' in failing["expr"] and failing["expr"].endswith("== 0")
    assert absent["expr"] == "absent(saga_database_up)"
    assert {failing["labels"]["severity"], absent["labels"]["severity"]} == {"critical"}
    # The job matcher names the job of the scrape configuration the operations guide shows.
    assert "job_name: saga-admin\n" in (promql.ROOT / "docs" / "OPERATIONS.md").read_text()
    # Every alert is documented in the guide's table.
    documented = (promql.ROOT / "docs" / "OPERATIONS.md").read_text()
    assert all(f"`{name}`" in documented for name in rules), sorted(
        n for n in rules if f"`{n}`" not in documented
    )


def test_an_expression_that_is_not_promql_is_caught() -> None:
    """The check below can fail: the parser refuses what Prometheus would."""
    with pytest.raises(ValueError):
        promql.selected_metrics("sum(rate(saga_unwind_steps_total[5m])")
    assert promql.selected_metrics('a_total{x="1"} / on() b offset 1h') == {"a_total", "b"}


def test_rules_and_dashboard_select_only_metrics_this_server_exposes(
    client: Client, token: str, tenant: Any, own_redis: RedisServer, syslog_sink: str
) -> None:
    names = {key.split("{", 1)[0] for key in _scrape(client)}
    queries = promql.rule_queries() + promql.dashboard_queries()
    assert len(queries) > 20
    missing = {q.where: sorted(q.metrics - names) for q in queries if not q.metrics <= names}
    assert not missing, missing


def test_every_dashboard_query_is_scoped_by_environment_job_and_instance() -> None:
    dashboard = promql.load_dashboard()
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    # Chosen in this order, each narrowing the next; tenant last, among the chosen instances.
    assert variables == ["datasource", "environment", "job", "instance", "tenant"]
    unscoped = {
        f"{panel['title']!r} {target['refId']}": promql.unscoped(target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
        if promql.unscoped(target["expr"])
    }
    assert not unscoped, unscoped
    # The variables' own queries: each narrowed by the ones above it.
    chosen: dict[str, str] = {}
    for variable in dashboard["templating"]["list"][1:]:
        query = variable["query"]["query"]
        assert variable["definition"] == query and variable["allValue"] == ".*" and variable["includeAll"]
        selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
        assert promql.unscoped(selector, chosen) == [], (variable["name"], query)
        chosen[variable["name"]] = f"${variable['name']}"
    # The check can fail: a selector that forgets one.
    assert promql.unscoped('sum(rate(saga_http_requests_total{job=~"$job", instance=~"$instance"}[5m]))') == [
        'saga_http_requests_total{job=~"$job",instance=~"$instance"}'.replace("$", "VAR_")
    ]
