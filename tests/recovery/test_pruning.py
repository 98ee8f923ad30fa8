"""Pruning the two stores that grow with traffic and have a window (``ledger.pruning``): the
Idempotency-Key records and the notification outbox. What pruning must never break — a replay
within the window, the records of an action still in play, a notification still to be sent —
then the batches, the dry run, two prunes at once, the plans (indexes, never a whole-table scan),
the counter, and the windows' settings."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from infra import metrics
from ledger import pruning
from ledger.audit import Actor
from ledger.models import Action, IdempotencyRecord, Run
from ledger.prune_windows import idempotency_retention_s, notification_retention_s
from ledger.services import idempotency
from recovery import jobs, scheduling
from recovery.models import Notification
from recovery.notifications import prune as notifications
from tests.factories import force_status, make_run, new_action, new_run, record
from tests.support.api import Api
from tests.support.processes import ROOT

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)
RUN = {"agent": "onboarding", "request": "Onboard Ashu Kumar"}


@pytest.fixture
def api(agent_key: Any) -> Api:
    return Api(agent_key[1])


def _age(key: str, age: timedelta) -> None:
    IdempotencyRecord.objects.filter(key=key).update(created_at=timezone.now() - age)


def _keys() -> set[str]:
    return set(IdempotencyRecord.objects.values_list("key", flat=True))


# --- Idempotency-Key records ----------------------------------------------------------------------


def test_a_replay_within_the_window_still_answers_the_original(api: Api) -> None:
    first = api.post("/runs", RUN, headers={"Idempotency-Key": "run-1"})
    _age("run-1", 6 * DAY + timedelta(hours=23))  # the window is 7 days
    assert idempotency.idempotency_prune() == 0
    again = api.post("/runs", RUN, headers={"Idempotency-Key": "run-1"})
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json() and Run.objects.count() == 1


def test_past_the_window_the_key_is_forgotten(api: Api, settings: Any) -> None:
    api.post("/runs", RUN, headers={"Idempotency-Key": "old"})
    api.post("/runs", {**RUN, "external_id": "2"}, headers={"Idempotency-Key": "recent"})
    _age("old", 2 * DAY + timedelta(minutes=1))
    _age("recent", 2 * DAY - timedelta(minutes=1))
    settings.SAGA = {**settings.SAGA, "IDEMPOTENCY_RETENTION_S": 2 * 86400}
    assert idempotency.idempotency_prune() == 1
    assert _keys() == {"recent"}
    # The documented consequence: the same key is a new request again.
    fresh = api.post("/runs", RUN, headers={"Idempotency-Key": "old"})
    assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh
    assert Run.objects.count() == 3


def test_a_window_below_the_floor_given_after_start_up_counts_as_the_floor(api: Api, settings: Any) -> None:
    api.post("/runs", RUN, headers={"Idempotency-Key": "k"})
    settings.SAGA = {**settings.SAGA, "IDEMPOTENCY_RETENTION_S": 60}
    _age("k", timedelta(hours=23))
    assert idempotency.idempotency_prune() == 0
    assert idempotency.idempotency_prune(now=timezone.now() + timedelta(hours=2)) == 1


@pytest.mark.parametrize("status", ["planned", "awaiting_approval", "approved", "running", "unknown"])
def test_the_records_of_an_action_still_in_play_are_kept_whatever_their_age(
    api: Api, onboarding_policies: Any, status: str
) -> None:
    run = new_run(api)
    action = new_action(api, run["id"], key="create-ashu")
    started = api.post(f"/actions/{action['id']}/start", headers={"Idempotency-Key": "create-ashu:start:1"})
    assert started.status_code == 200 and started.json()["status"] == "running"
    force_status(Action.objects.get(pk=action["id"]), status)
    _age("create-ashu:start:1", 90 * DAY)
    assert idempotency.idempotency_prune() == 0
    assert idempotency.idempotency_prune(dry_run=True) == 0
    assert _keys() == {"create-ashu:start:1"}
    if status == "running":
        # A second caller of the action still learns that the first one started it.
        second = api.post(
            f"/actions/{action['id']}/start", headers={"Idempotency-Key": "create-ashu:start:1"}
        )
        assert second.status_code == 200 and second["Idempotent-Replayed"] == "true"


def test_once_the_action_is_over_its_records_go_with_the_window(api: Api, onboarding_policies: Any) -> None:
    run = new_run(api)
    action = new_action(api, run["id"], key="create-ashu")
    api.post(f"/actions/{action['id']}/start", headers={"Idempotency-Key": "create-ashu:start:1"})
    done = api.post(
        f"/actions/{action['id']}/succeed",
        {"result": {}},
        headers={"Idempotency-Key": "create-ashu:succeed:1"},
    )
    assert done.status_code == 200, done.content
    _age("create-ashu:start:1", 8 * DAY)
    _age("create-ashu:succeed:1", 8 * DAY)
    assert idempotency.idempotency_prune() == 2
    assert not IdempotencyRecord.objects.exists()
    # The action's own recording key is the action row: untouched, still replayed.
    replay = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
            "idempotency_key": "create-ashu",
            "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        },
    )
    assert replay.status_code == 200 and replay.json()["id"] == action["id"]


def test_another_tenants_live_action_keeps_nothing_of_this_tenant(tenant: Any, other_tenant: Any) -> None:
    """A record whose path names an action of another tenant (a caller guessing ids) is pruned on
    its own age: only the tenant's own live action keeps it."""
    theirs = record(make_run(other_tenant, Actor.system("t")), Actor.system("t"), "k")
    force_status(theirs, "running")
    IdempotencyRecord.objects.create(
        tenant=tenant,
        key="guess",
        method="POST",
        path=f"/api/v1/actions/{theirs.pk}/start",
        request_hash="x",
        state=IdempotencyRecord.State.COMPLETED,
        response_status=404,
    )
    _age("guess", 8 * DAY)
    assert idempotency.idempotency_prune() == 1


def _old_records(tenant: Any, count: int, *, age: timedelta = 8 * DAY, prefix: str = "bulk") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_idempotencyrecord (tenant_id, key, method, path, request_hash, state,"
            " response_status, response_body, created_at)"
            " SELECT %s, %s || '-' || i, 'POST', '/api/v1/runs', 'h', 'completed', 201, '{}',"
            " %s - i * interval '1 millisecond' FROM generate_series(1, %s) AS i",
            [tenant.pk, prefix, timezone.now() - age, count],
        )


def test_it_deletes_in_batches_of_bounded_size(tenant: Any) -> None:
    _old_records(tenant, 12_345)
    with CaptureQueriesContext(connection) as ctx:
        assert idempotency.idempotency_prune(batch_size=5000) == 12_345
    deletes = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # 5000, 5000, 2345: no statement touches more than a batch
    assert not IdempotencyRecord.objects.exists()


def test_a_dry_run_changes_nothing_and_says_how_many(tenant: Any) -> None:
    _old_records(tenant, 7_000)
    IdempotencyRecord.objects.create(
        tenant=tenant,
        key="young",
        method="POST",
        path="/api/v1/runs",
        request_hash="x",
        state=IdempotencyRecord.State.COMPLETED,
    )
    _old_notifications(tenant, {"delivered": 3, "pending": 2}, age=40 * DAY)
    out = io.StringIO()
    call_command("prune", "--dry-run", "--batch-size", "1000", stdout=out)
    assert out.getvalue().splitlines() == [
        "Idempotency-Key records older than 7 days: 7000 would be deleted (dry run: nothing was)",
        "finished notifications older than 30 days: 3 would be deleted (dry run: nothing was)",
    ]
    assert IdempotencyRecord.objects.count() == 7_001 and Notification.objects.count() == 5
    out = io.StringIO()
    call_command("prune", "--only", "notifications", stdout=out)
    assert out.getvalue() == "finished notifications older than 30 days: 3 deleted\n"
    assert IdempotencyRecord.objects.count() == 7_001 and Notification.objects.count() == 2


@pytest.mark.parametrize("size", ["0", "-1", "50001"])
def test_the_command_refuses_a_batch_size_out_of_bounds(tenant: Any, size: str) -> None:
    _old_records(tenant, 10)
    with pytest.raises(CommandError, match="--batch-size must be between 1 and 50000"):
        call_command("prune", "--batch-size", size, stdout=io.StringIO())
    assert IdempotencyRecord.objects.count() == 10


@pytest.mark.django_db(transaction=True)
def test_two_prunes_at_once_delete_each_row_once_and_never_wait_on_each_other(tenant: Any) -> None:
    _old_records(tenant, 20_000)
    start = threading.Barrier(2)
    counts: list[int] = []
    failures: list[BaseException] = []

    def prune() -> None:
        try:
            start.wait(10)
            counts.append(idempotency.idempotency_prune(batch_size=500))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=prune) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert len(counts) == 2 and sum(counts) == 20_000
    assert not IdempotencyRecord.objects.exists()


# --- The notification outbox ----------------------------------------------------------------------


def _old_notifications(tenant: Any, statuses: dict[str, int], *, age: timedelta) -> None:
    rows = [
        Notification(
            tenant=tenant,
            channel_name="ops",
            kind="email",
            env_target="email",
            event="recovery.opened",
            subject_id="itm_x",
            status=status,
        )
        for status, count in statuses.items()
        for _ in range(count)
    ]
    created = Notification.objects.bulk_create(rows, batch_size=2000)
    Notification.objects.filter(pk__in=[n.pk for n in created]).update(updated_at=timezone.now() - age)


def test_only_finished_notifications_past_the_window_go_never_one_still_to_be_sent(tenant: Any) -> None:
    _old_notifications(
        tenant, {"pending": 2, "sending": 2, "delivered": 2, "failed": 2, "dropped": 2}, age=31 * DAY
    )
    _old_notifications(tenant, {"delivered": 1, "failed": 1}, age=29 * DAY)
    assert notifications.notifications_prune(dry_run=True) == 6
    assert notifications.notifications_prune() == 6
    left = sorted(Notification.objects.values_list("status", flat=True))
    assert left == ["delivered", "failed", "pending", "pending", "sending", "sending"]
    # However old, a row still to be sent stays.
    assert notifications.notifications_prune(now=timezone.now() + 3650 * DAY) == 2
    assert sorted(Notification.objects.values_list("status", flat=True)) == ["pending"] * 2 + ["sending"] * 2


def test_notifications_go_in_batches_too(tenant: Any) -> None:
    _old_notifications(tenant, {"delivered": 2500, "pending": 10}, age=40 * DAY)
    with CaptureQueriesContext(connection) as ctx:
        assert notifications.notifications_prune(batch_size=1000) == 2500
    assert len([q for q in ctx.captured_queries if q["sql"].startswith("DELETE")]) == 3
    assert Notification.objects.filter(status="pending").count() == 10


# --- Plans: indexes, never a whole-table scan -----------------------------------------------------


def _scans(plan: dict[str, Any]) -> list[tuple[str, str, str]]:
    found = []
    if "Scan" in plan.get("Node Type", ""):
        found.append((plan["Node Type"], plan.get("Relation Name", ""), plan.get("Index Name", "")))
    for child in plan.get("Plans", []) or []:
        found += _scans(child)
    return found


def _explain(sql: str, params: list[Any]) -> list[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        raw = cursor.fetchone()[0]
    return _scans((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])


@pytest.mark.slow
def test_every_statement_of_a_prune_reads_through_an_index(tenant: Any) -> None:
    """Enough rows, analysed, that the planner would scan the table where no index serves: most
    of them young (kept), a few old; and actions for the live-action check to look up."""
    _old_records(tenant, 40_000, age=timedelta(hours=1))
    _old_records(tenant, 2_000, age=8 * DAY, prefix="old")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO recovery_notification (id, tenant_id, channel_name, kind, env_target, event,"
            " subject_id, run_id, risk, body, context, status, attempts, max_attempts, lease_token,"
            " job_id, last_error, history, created_at, updated_at)"
            " SELECT 'ntf_young_' || i, %s, 'ops', 'email', 'email', 'recovery.opened', 'itm_x', '',"
            " 'low', '{}', '{}', CASE WHEN i %% 100 = 0 THEN 'pending' ELSE 'delivered' END, 1, 10, 0,"
            " '', '', '[]', now() - interval '1 day', now() - interval '1 day'"
            " FROM generate_series(1, 60000) AS i",
            [tenant.pk],
        )
    _old_notifications(tenant, {"delivered": 1_000, "failed": 500}, age=40 * DAY)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_run (id, tenant_id, agent, owner, request, external_id, user_id, goal,"
            " trace_url, resume_url, metadata, status, summary, error, failure_reason, action_count,"
            " completion_count, created_at, updated_at) VALUES ('run_plans', %s, 'a', '', 'r', '', '',"
            " '', '', '', '{}', 'running', '', '', '', 0, 0, now(), now())",
            [tenant.pk],
        )
        cursor.execute(
            "INSERT INTO ledger_action (id, tenant_id, run_id, seq, tool, target_type, target_id, args,"
            " idempotency_key, owner, payload_hash, intent, risk, action_class, approval_mode,"
            " requires_approval, policy, compensation_strategy, compensation_tool, status, attempts,"
            " error, error_layer, warnings, created_at, updated_at)"
            " SELECT 'act_' || i, %s, 'run_plans', i, 't', '', '', '{}', 'k' || i, '', '', '{}', 'low',"
            " 'internal_update', 'auto', false, '{}', 'none', '', 'succeeded', 1, '', '', '[]', now(),"
            " now() FROM generate_series(1, 20000) AS i",
            [tenant.pk],
        )
        for table in ("ledger_idempotencyrecord", "recovery_notification", "ledger_action"):
            cursor.execute(f"ANALYZE {table}")
    checks = [
        (idempotency.STORE, idempotency.idempotency_cutoff(), "ledger_idempotencyrecord"),
        (notifications.STORE, notifications.notifications_cutoff(), "recovery_notification"),
    ]
    for store, cutoff, table in checks:
        first = _explain(pruning.candidates_sql(store, after=False), [cutoff, pruning.BATCH])
        with connection.cursor() as cursor:
            cursor.execute(pruning.candidates_sql(store, after=False), [cutoff, pruning.BATCH])
            rows = cursor.fetchall()
        start, end = list(rows[len(rows) // 3]), list(rows[-1])
        later = _explain(pruning.candidates_sql(store, after=True), [cutoff, *start, pruning.BATCH])
        params = [cutoff, *start, *end, *store.keep_params]
        delete = _explain(pruning.delete_sql(store, after=True), params)
        dry = _explain(pruning.count_sql(store, after=True), params)
        for name, scans in (
            ("candidates", first),
            ("after a batch", later),
            ("delete", delete),
            ("count", dry),
        ):
            assert scans, (table, name)
            sequential = [t for node, t, _ in scans if node == "Seq Scan"]
            assert not sequential, f"{table} {name}: a sequential scan of {sequential}: {scans}"
        expected = "idempotency_created" if table == "ledger_idempotencyrecord" else "notification_finished"
        for name, scans in (("candidates", first), ("after a batch", later), ("delete", delete)):
            assert expected in {index for _, _, index in scans}, (table, name, scans)


# --- The counter, the schedule, the windows -------------------------------------------------------


def _pruned(store: str) -> float:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics.MULTIPROCESS_DIR))
    return registry.get_sample_value("saga_pruned_rows_total", {"store": store}) or 0.0


def test_pruned_rows_are_counted_once_committed_and_a_dry_run_counts_nothing(
    tenant: Any, django_capture_on_commit_callbacks: Any
) -> None:
    _old_records(tenant, 30)
    _old_notifications(tenant, {"failed": 4}, age=40 * DAY)
    before = _pruned("idempotency"), _pruned("notifications")
    with django_capture_on_commit_callbacks(execute=True):
        assert idempotency.idempotency_prune(dry_run=True) == 30
        assert notifications.notifications_prune(dry_run=True) == 4
    assert (_pruned("idempotency"), _pruned("notifications")) == before
    with django_capture_on_commit_callbacks(execute=True):
        idempotency.idempotency_prune(batch_size=7)
        notifications.notifications_prune()
    assert (_pruned("idempotency"), _pruned("notifications")) == (before[0] + 30, before[1] + 4)


def test_the_worker_prunes_both_stores_hourly(tenant: Any) -> None:
    every = {p.func: p.every_s for p in scheduling.periodic_jobs()}
    assert every["recovery.jobs.idempotency_prune"] == every["recovery.jobs.notifications_prune"] == 3600
    _old_records(tenant, 3)
    _old_notifications(tenant, {"delivered": 2, "pending": 1}, age=40 * DAY)
    assert (jobs.idempotency_prune(), jobs.notifications_prune()) == (3, 2)
    assert not IdempotencyRecord.objects.exists() and Notification.objects.get().status == "pending"


@pytest.mark.parametrize(
    ("environ", "seconds"),
    [
        ({}, 7 * 86400),
        ({"SAGA_IDEMPOTENCY_RETENTION": "36h"}, 36 * 3600),
        ({"SAGA_IDEMPOTENCY_RETENTION": " 14D "}, 14 * 86400),
        ({"SAGA_IDEMPOTENCY_RETENTION": "1d"}, 86400),
        ({"SAGA_IDEMPOTENCY_KEY_TTL_H": "48"}, 48 * 3600),  # the older setting, in hours
    ],
)
def test_the_idempotency_window_takes_the_duration_grammar(environ: dict[str, str], seconds: int) -> None:
    assert idempotency_retention_s(environ) == seconds


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SAGA_IDEMPOTENCY_RETENTION": "23h"}, "shorter than the floor of 1 day: the API promises"),
        ({"SAGA_IDEMPOTENCY_RETENTION": "0"}, "shorter than the floor of 1 day"),
        ({"SAGA_IDEMPOTENCY_RETENTION": "a week"}, "is not a duration"),
        ({"SAGA_IDEMPOTENCY_RETENTION": "-7d"}, "is not a duration"),
        ({"SAGA_IDEMPOTENCY_RETENTION": "86400.5s"}, "whole number of seconds"),
        ({"SAGA_IDEMPOTENCY_RETENTION": "99999999999d"}, "at most 3650d"),
        ({"SAGA_IDEMPOTENCY_KEY_TTL_H": "12"}, "shorter than the floor"),
        ({"SAGA_IDEMPOTENCY_KEY_TTL_H": "2d"}, "not a whole number of hours"),
        ({"SAGA_IDEMPOTENCY_KEY_TTL_H": "48", "SAGA_IDEMPOTENCY_RETENTION": "2d"}, "Both"),
    ],
)
def test_an_unsafe_idempotency_window_is_refused_naming_it(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        idempotency_retention_s(environ)


def test_the_notification_window_defaults_to_30_days_and_has_a_floor() -> None:
    assert notification_retention_s({}) == 30 * 86400
    assert notification_retention_s({"SAGA_NOTIFICATION_RETENTION": "90d"}) == 90 * 86400
    with pytest.raises(
        ImproperlyConfigured, match="SAGA_NOTIFICATION_RETENTION=2h is shorter than the floor"
    ):
        notification_retention_s({"SAGA_NOTIFICATION_RETENTION": "2h"})


def test_a_process_with_an_unsafe_window_does_not_start(tmp_path: Any) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "DEBUG": "1",
        "SAGA_IDEMPOTENCY_RETENTION": "1h",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "SAGA_IDEMPOTENCY_RETENTION=1h is shorter than the floor of 1 day" in done.stderr
    assert "Traceback" not in done.stderr
