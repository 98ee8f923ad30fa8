"""The append-only audit log: the trigger, the hash chain and verify_audit."""

from __future__ import annotations

import threading
from io import StringIO

import pgtrigger
import pytest
from django.core.management import CommandError, call_command, execute_from_command_line
from django.db import DatabaseError, connection, transaction

from ledger.audit import Actor, audit_heads_verify, audit_record, audit_verify
from ledger.models import Event, Run
from ledger.services import runs
from tests.factories import make_run, record


@pytest.fixture
def run(tenant, agent):
    run = make_run(tenant, agent)
    record(run, agent, "k1")
    runs.run_fail(run=run, actor=agent, error="boom")
    return run


def test_it_chains_each_event_to_the_previous_one_of_its_run(run):
    events = list(Event.objects.filter(run=run).order_by("id"))
    assert [e.kind for e in events] == ["run.created", "action.recorded", "run.failed"]
    assert events[0].prev_hash == "0" * 64
    assert [e.prev_hash for e in events[1:]] == [e.hash for e in events[:-1]]
    assert {e.chain for e in events} == {f"run:{run.pk}"}


def test_it_refuses_an_orm_update(run):
    with pytest.raises(DatabaseError, match="Cannot update or delete"), transaction.atomic():
        Event.objects.filter(run=run).update(reason="rewritten")
    assert not Event.objects.filter(reason="rewritten").exists()


def test_it_refuses_an_orm_save_of_an_existing_event(run):
    event = Event.objects.filter(run=run).first()
    event.reason = "rewritten"
    with pytest.raises(DatabaseError, match="Cannot update or delete"), transaction.atomic():
        event.save()


def test_it_refuses_an_orm_delete(run):
    count = Event.objects.count()
    with pytest.raises(DatabaseError, match="Cannot update or delete"), transaction.atomic():
        Event.objects.filter(run=run).delete()
    assert Event.objects.count() == count


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE ledger_event SET reason = 'rewritten'",
        "DELETE FROM ledger_event",
    ],
)
def test_it_refuses_raw_sql_updates_and_deletes(run, sql):
    count = Event.objects.count()
    with (
        pytest.raises(DatabaseError, match="Cannot update or delete"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert Event.objects.count() == count and not Event.objects.filter(reason="rewritten").exists()


@pytest.mark.django_db(transaction=True)
def test_it_refuses_audit_records_outside_a_transaction(tenant):
    # The event must commit with the change it describes, or not at all.
    with pytest.raises(RuntimeError, match="inside the transition"):
        audit_record(tenant=tenant, actor=Actor.system(), kind="x", subject="thing:1")
    assert not Event.objects.filter(kind="x").exists()


def test_it_reports_an_intact_log(run):
    out = StringIO()
    call_command("verify_audit", stdout=out)
    assert (
        "4 events checked." in out.getvalue()
    )  # the key's creation + the run's 3 and "intact" in out.getvalue()


def _tamper(event: Event, **changes) -> None:
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(pk=event.pk).update(**changes)


def test_it_detects_a_tampered_event_and_names_it(run):
    victim = Event.objects.filter(run=run, kind="action.recorded").get()
    _tamper(victim, reason="nothing to see here")
    out = StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("verify_audit", stdout=out)
    assert excinfo.value.returncode == 1
    assert f"chain run:{run.pk}, event {victim.pk}: the event's content does not match its hash" in str(
        excinfo.value
    )
    assert "events checked" in out.getvalue()


def test_it_detects_a_deleted_event_by_its_broken_link(run):
    middle = Event.objects.filter(run=run, kind="action.recorded").get()
    after = Event.objects.filter(run=run, kind="run.failed").get()
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(pk=middle.pk).delete()
    checked, broken = audit_verify()
    assert (broken.event_id, broken.problem) == (
        after.pk,
        "prev_hash does not match the previous event's hash",
    )


def test_deleting_a_runs_newest_event_makes_verify_audit_exit_1_naming_the_run(run, capsys):
    # The shorter chain still links up perfectly; only the run's recorded head gives it away.
    newest = Event.objects.filter(run=run).order_by("-id").first()
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(pk=newest.pk).delete()
    assert audit_verify()[1] is None
    with pytest.raises(SystemExit) as excinfo:
        execute_from_command_line(["manage.py", "verify_audit"])
    assert excinfo.value.code == 1
    err = capsys.readouterr().err
    assert f"the newest events of run {run.pk} were deleted" in err
    assert f"Run {run.pk}: its newest audit events are missing" in err


def test_deleting_every_event_of_a_run_is_detected(run):
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(run=run).delete()
    [gap] = audit_heads_verify()
    assert (gap.run_id, gap.last_event_id) == (run.pk, None)
    assert audit_heads_verify(chain=f"run:{run.pk}") == [gap]
    assert audit_heads_verify(chain=f"tenant:{run.tenant_id}") == []


def test_deleting_a_tenants_newest_run_less_event_is_detected(tenant, agent_key):
    # Key creation is on the tenant's own chain; its row records the head too.
    tenant.refresh_from_db()
    newest = Event.objects.filter(chain=f"tenant:{tenant.pk}").order_by("-id").first()
    assert tenant.audit_head == newest.hash
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(pk=newest.pk).delete()
    [gap] = audit_heads_verify()
    assert (gap.chain, gap.run_id) == (f"tenant:{tenant.pk}", None)
    with pytest.raises(CommandError, match=f"the newest events of tenant:{tenant.pk} were deleted"):
        call_command("verify_audit", stdout=StringIO(), stderr=StringIO())


def test_a_run_without_events_and_an_intact_run_are_not_reported(run, tenant, agent):
    Run.objects.create(tenant=tenant, agent="bulk-loaded", request="no events yet")
    assert audit_heads_verify() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("statement", ["TRUNCATE ledger_event", "TRUNCATE ledger_event CASCADE"])
def test_truncate_of_the_audit_log_is_refused(tenant, agent, statement):
    # Committed first: PostgreSQL refuses TRUNCATE of a table with pending trigger events for an
    # unrelated reason, which would make this test pass without the trigger.
    make_run(tenant, agent)
    count = Event.objects.count()
    with pytest.raises(DatabaseError, match="append-only: TRUNCATE"), connection.cursor() as cursor:
        cursor.execute(statement)
    assert Event.objects.count() == count > 0


def test_it_detects_a_rehashed_event_whose_successor_no_longer_links(run):
    # A forger who edits a row and recomputes its own hash still breaks the next event's link.
    from ledger.audit import _event_digest, _hashed_fields

    victim = Event.objects.filter(run=run, kind="action.recorded").get()
    after = Event.objects.filter(run=run, kind="run.failed").get()
    victim.reason = "forged"
    _tamper(victim, reason="forged", hash=_event_digest(victim.prev_hash, _hashed_fields(victim)))
    _, broken = audit_verify(chain=f"run:{run.pk}")
    assert (broken.event_id, broken.problem) == (
        after.pk,
        "prev_hash does not match the previous event's hash",
    )


def test_it_reports_the_earliest_broken_event_across_chains(tenant, agent, run):
    other = make_run(tenant, agent)
    late = Event.objects.filter(run=other).get()
    early = Event.objects.filter(run=run).order_by("id").first()
    _tamper(late, reason="x")
    _tamper(early, reason="y")
    assert audit_verify()[1].event_id == early.pk


def test_it_exits_with_status_1_when_the_chain_is_broken(run, capsys):
    _tamper(Event.objects.filter(run=run).first(), actor_label="someone else")
    with pytest.raises(SystemExit) as excinfo:
        execute_from_command_line(["manage.py", "verify_audit"])
    assert excinfo.value.code == 1
    assert "Audit chain broken" in capsys.readouterr().err


def test_it_verifies_events_whose_data_jsonb_normalises(tenant):
    # jsonb returns 1e16 as the integer 10000000000000000: the hash must be of what comes back.
    with transaction.atomic():
        audit_record(
            tenant=tenant,
            actor=Actor.system(),
            kind="probe",
            subject="probe:1",
            data={"big": 1e16, "huge": -1.5e300, "tiny": 1.5e-7, "float": 2.0, "nan": float("nan")},
        )
    assert audit_verify() == (1, None)


def test_it_keeps_tenant_events_without_a_run_on_the_tenants_chain(tenant, agent_key):
    event = Event.objects.get(kind="agent_key.created")
    assert (event.chain, event.run_id) == (f"tenant:{tenant.pk}", None)


# --- The run's chain head (Run.audit_head) -------------------------------------------------------


def test_it_keeps_the_chain_head_on_the_run_row(run):
    latest = Event.objects.filter(run=run).order_by("-id").first()
    assert Run.objects.get(pk=run.pk).audit_head == latest.hash


def test_a_writer_holding_a_stale_run_still_links_to_the_latest_event(run, tenant, agent):
    """A run instance read before other events were written carries an old head: the
    compare-and-set misses, and the event links to the head read under the row lock instead."""
    stale = Run.objects.get(pk=run.pk)
    with transaction.atomic():
        audit_record(tenant=tenant, run=Run.objects.get(pk=run.pk), actor=agent, kind="test.one", subject=run)
    with transaction.atomic():
        event = audit_record(tenant=tenant, run=stale, actor=agent, kind="test.two", subject=run)
    previous = Event.objects.filter(run=run, kind="test.one").get()
    assert event.prev_hash == previous.hash
    assert stale.audit_head == event.hash == Run.objects.get(pk=run.pk).audit_head
    assert audit_verify(chain=f"run:{run.pk}") == (Event.objects.filter(run=run).count(), None)


CHAIN_WRITERS = 12


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_of_one_run_never_fork_its_chain(tenant, agent):
    """Every writer starts from the same (soon stale) run instance: exactly one links to each
    head, the others re-read it, and the chain stays one line that verify_audit accepts."""
    run = make_run(tenant, agent)
    barrier = threading.Barrier(CHAIN_WRITERS)
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            mine = Run.objects.get(pk=run.pk)
            barrier.wait(timeout=30)
            with transaction.atomic():
                audit_record(tenant=tenant, run=mine, actor=agent, kind=f"test.writer_{n}", subject=mine)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(CHAIN_WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert not failures, failures
    events = list(Event.objects.filter(run=run).order_by("id"))
    assert len(events) == CHAIN_WRITERS + 1  # run.created and every writer's event
    assert [e.prev_hash for e in events[1:]] == [e.hash for e in events[:-1]]
    assert Run.objects.get(pk=run.pk).audit_head == events[-1].hash
    assert audit_verify(chain=f"run:{run.pk}") == (len(events), None)


def test_verify_reads_the_chains_a_page_at_a_time_and_misses_nothing(tenant, agent, monkeypatch):
    # Pages of 2 over chains of 3 to 6 events: pages end inside a chain and at its end.
    made = []
    for n in range(4):
        run = make_run(tenant, agent)
        for k in range(n):
            record(run, agent, f"page-{n}-{k}")
        runs.run_fail(run=run, actor=agent, error="boom")
        made.append(run)
    whole = audit_verify()
    monkeypatch.setattr("ledger.audit._PAGE", 2)
    statements: list[str] = []

    def counted(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        paged = audit_verify()
    assert paged == whole and whole[0] == Event.objects.count() and whole[1] is None
    assert len(statements) > Event.objects.count() // 2  # page by page, not one statement

    victim = Event.objects.filter(run=made[2], kind="action.recorded").order_by("id").last()
    _tamper(victim, reason="rewritten")
    checked, broken = audit_verify()
    assert (broken.chain, broken.event_id) == (f"run:{made[2].pk}", victim.pk)
    assert checked == whole[0] - 1  # the run's failure after the break is skipped
