"""Idempotent recording: replays, reused keys, tenants, and real concurrent duplicates."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection

from infra import errors
from ledger.models import Action, Event, Run
from ledger.services.actions import moves, recording
from tests.factories import auto_policy, make_run

PAYLOAD = {
    "tool": "workspace.provision_license",
    "target_type": "user",
    "target_id": "ashu@company.com",
    "args": {"sku": "business-standard"},
    "compensation": {"tool": "workspace.cancel_license", "args": {"email": "ashu@company.com"}},
}


def _record(run, actor, key="lic-1", **overrides):
    return recording.action_record(run=run, actor=actor, idempotency_key=key, **{**PAYLOAD, **overrides})


def test_it_returns_the_same_action_for_the_same_key_and_payload(tenant, agent):
    run = make_run(tenant, agent)
    first = _record(run, agent, intent={"reasoning": "needs a seat", "confidence": 0.8})
    # A retry re-phrases its reasoning and re-reads the target: still the same call.
    again = _record(
        run, agent, intent={"reasoning": "retrying", "confidence": 0.7}, before_snapshot={"seats": 0}
    )
    assert first.created and not again.created
    assert again.action.pk == first.action.pk
    assert Action.objects.count() == 1
    assert Run.objects.get(pk=run.pk).action_count == 1
    assert Event.objects.filter(kind="action.recorded").count() == 1


def test_it_replays_the_stored_result_once_the_action_succeeded(tenant, agent):
    auto_policy("workspace.*")
    run = make_run(tenant, agent)
    action = _record(run, agent).action
    moves.action_start(action=action, actor=agent)
    moves.action_succeed(action=action, actor=agent, result={"license_id": "L-9"})
    replay = _record(run, agent)
    assert not replay.created
    assert (replay.action.status, replay.action.result) == ("succeeded", {"license_id": "L-9"})


def test_it_treats_key_order_in_args_as_the_same_payload(tenant, agent):
    run = make_run(tenant, agent)
    first = _record(run, agent, args={"sku": "s", "seats": 1})
    assert _record(run, agent, args={"seats": 1, "sku": "s"}).action.pk == first.action.pk


@pytest.mark.parametrize(
    "change",
    [
        {"args": {"sku": "enterprise"}},
        {"target_id": "someone-else@company.com"},
        {"tool": "workspace.provision_other"},
        {"compensation": None},
    ],
)
def test_it_refuses_the_same_key_with_a_different_payload(tenant, agent, change):
    run = make_run(tenant, agent)
    _record(run, agent)
    events = Event.objects.count()
    with pytest.raises(errors.IdempotencyKeyReused) as excinfo:
        _record(run, agent, **change)
    assert (excinfo.value.status, excinfo.value.code) == (422, "idempotency_key_reused")
    assert Action.objects.count() == 1 and Event.objects.count() == events


def test_it_refuses_the_same_key_in_another_run_of_the_tenant(tenant, agent):
    _record(make_run(tenant, agent), agent)
    with pytest.raises(errors.IdempotencyKeyReused) as excinfo:
        _record(make_run(tenant, agent), agent)
    # The other run's action id is not revealed through the error.
    assert excinfo.value.details["action_id"] is None


def test_it_scopes_keys_per_tenant(tenant, other_tenant, agent, outsider_key):
    from ledger.audit import Actor

    ours = _record(make_run(tenant, agent), agent)
    outsider = Actor.for_key(outsider_key[0])
    theirs = _record(make_run(other_tenant, outsider), outsider, args={"sku": "different"})
    assert theirs.created and theirs.action.pk != ours.action.pk
    assert theirs.action.tenant_id == other_tenant.pk


def test_it_reports_in_flight_when_the_first_recording_holds_the_key(tenant, agent, django_db_blocker):
    """While another transaction holds the key's lock (a slow first request), a duplicate gets
    IdempotencyKeyInFlight after its lock timeout instead of waiting forever."""
    run = make_run(tenant, agent)
    key = "lic-slow"
    holder_ready, release = threading.Event(), threading.Event()

    def hold_the_key():
        from django.db import connections, transaction

        try:
            with django_db_blocker.unblock(), transaction.atomic():
                with connections["default"].cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                        [f"action-key:{tenant.pk}:{key}"],
                    )
                holder_ready.set()
                release.wait(10)
        finally:
            connections["default"].close()

    holder = threading.Thread(target=hold_the_key)
    holder.start()
    try:
        assert holder_ready.wait(10)
        with pytest.raises(errors.IdempotencyKeyInFlight) as excinfo:
            recording.action_record(run=run, actor=agent, idempotency_key=key, lock_timeout_ms=200, **PAYLOAD)
        assert excinfo.value.status == 409
    finally:
        release.set()
        holder.join(10)
    assert not Action.objects.filter(idempotency_key=key).exists()


THREADS = 24


@pytest.mark.django_db(transaction=True)
def test_it_records_exactly_one_action_under_concurrent_identical_requests(tenant, agent):
    run = make_run(tenant, agent)
    barrier = threading.Barrier(THREADS)
    results: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def worker():
        try:
            barrier.wait(timeout=30)
            try:
                outcome = recording.action_record(
                    run=run, actor=agent, idempotency_key="same-moment", **PAYLOAD
                )
                value = outcome.action.pk
            except errors.IdempotencyKeyInFlight:
                value = "in_flight"
            with lock:
                results.append(value)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            with lock:
                failures.append(exc)
        finally:
            # Each thread has its own connection; leave none open for the test database teardown.
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert not failures, failures
    assert not any(isinstance(f, IntegrityError) for f in failures)
    rows = list(Action.objects.filter(idempotency_key="same-moment"))
    assert len(rows) == 1
    assert len(results) == THREADS
    assert set(results) - {"in_flight"} == {rows[0].pk}
    assert Run.objects.get(pk=run.pk).action_count == 1
    assert Event.objects.filter(kind="action.recorded").count() == 1
