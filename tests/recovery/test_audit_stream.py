"""The audit stream (recovery/audit_stream) against real receivers on this machine: every event
in order per tenant, exactly once in the normal case, across an outage; signed chain heads that
verify with the key and fail with another; transactions that commit out of id order; TLS syslog
and HTTPS HEC with a throwaway CA; hostile tenant sinks refused. The worker's pass is called in
this process here; tests/recovery/test_audit_stream_worker.py has a real worker deliver."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from django.core.management import CommandError, call_command
from django.db import connections, transaction

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Event, Run, Tenant
from recovery.audit_stream import config, delivery, records
from recovery.audit_stream.models import AuditCursor, AuditSink
from tests.factories import make_run, record
from tests.support.siem import HecReceiver, SyslogReceiver

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "test-audit-key-0123456789"


@pytest.fixture
def stream(settings: Any) -> dict[str, Any]:
    """The installation's audit stream settings (a test sets the sinks it wants)."""
    settings.AUDIT_STREAM = {"KEY": KEY, "HEAD_INTERVAL_S": 0.0, "BATCH": 4, "TIMEOUT_S": 5.0}
    settings.SAGA = {**settings.SAGA, "RETRY_BACKOFF_BASE_S": 0.0, "RETRY_BACKOFF_MAX_S": 0.0}
    return settings.AUDIT_STREAM


@pytest.fixture
def syslog() -> Iterator[SyslogReceiver]:
    receiver = SyslogReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def _server_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def _ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def _write(tenant: Tenant, count: int, *, kind: str = "test.event", run: Run | None = None) -> list[int]:
    ids = []
    for n in range(count):
        with transaction.atomic():
            ids.append(
                audit_record(
                    tenant=tenant,
                    actor=Actor.system("test"),
                    kind=kind,
                    subject=f"thing:{n}",
                    run=run,
                    data={"n": n},
                ).pk
            )
    return ids


def _events_of(messages: list[Any]) -> list[dict[str, Any]]:
    return [m for m in messages if m["type"] == "audit_event"]


def _all_ids(tenant: Tenant) -> list[int]:
    return list(Event.objects.filter(tenant=tenant).order_by("id").values_list("id", flat=True))


def test_no_sink_configured_is_no_work(stream: dict[str, Any], tenant: Tenant) -> None:
    _write(tenant, 2)
    assert delivery.audit_stream_deliver() == {"sinks": 0, "sent": 0}
    assert not AuditCursor.objects.exists()


def test_syslog_gets_every_event_in_order_with_a_signed_head(
    stream: dict[str, Any], syslog: SyslogReceiver, tenant: Tenant, agent: Actor, onboarding_policies: Any
) -> None:
    stream["SYSLOG_URL"] = syslog.url()
    run = make_run(tenant, agent)
    # The ledger's hot path: the events its one server-side call writes.
    action = record(run, agent, "k-1")
    _write(tenant, 6)
    delivery.audit_stream_deliver()

    received = syslog.received()
    assert syslog.errors == []
    assert {m.app for m in received} == {"saga-admin"} and {m.pri for m in received} == {110}
    events = [m for m in received if m.msgid == "audit"]
    assert [int(m.params["id"]) for m in events] == _all_ids(tenant)
    assert [int(m.params["seq"]) for m in events] == list(range(1, len(events) + 1))
    for message in events:
        sent, db_event = message.json, Event.objects.get(pk=message.json["id"])
        assert (sent["hash"], sent["prev_hash"], sent["chain"]) == (
            db_event.hash,
            db_event.prev_hash,
            db_event.chain,
        )
        assert (sent["run_id"], sent["tenant"], sent["kind"]) == (
            db_event.run_id or "",
            "acme",
            db_event.kind,
        )
        assert sent["actor"] == {
            "type": db_event.actor_type,
            "id": db_event.actor_id,
            "label": db_event.actor_label,
        }
        assert sent["time"] == db_event.created_at.isoformat()
    assert any(m.json["run_id"] for m in events)
    assert any(m.json["action_id"] == action.pk and m.json["run_id"] == run.pk for m in events)
    heads = [m.json for m in received if m.msgid == "chain-head"]
    assert heads and heads[-1]["position"] == len(events)

    messages = [m.json for m in received]
    report = records.verify_stream(messages, KEY.encode())
    assert report.problems == [] and report.heads_verified == {"acme": len(heads)}
    assert records.verify_stream(messages, b"another key").problems != []
    forged = [*messages[:-1], {**messages[-1], "head": "0" * 64}]
    assert "bad signature" in records.verify_stream(forged, KEY.encode()).problems[0]
    dropped = [m for m in messages if m.get("seq") != 3]
    assert any("seq 3 is missing" in p for p in records.verify_stream(dropped, KEY.encode()).problems)

    # Nothing new: nothing sent again.
    delivery.audit_stream_deliver()
    assert len([m for m in syslog.received() if m.msgid == "audit"]) == len(events)


def _stream(count: int) -> list[dict[str, Any]]:
    """A whole stream of ``count`` events of tenant acme and a signed head over them, built by hand."""
    events: list[dict[str, Any]] = [
        {"type": "audit_event", "tenant": "acme", "seq": seq, "id": 100 + seq, "hash": f"{seq:064x}"}
        for seq in range(1, count + 1)
    ]
    head = records.GENESIS
    for event in events:
        head = records.next_head(head, event["hash"])
    time = "2026-11-27T05:00:00+00:00"
    signature = records.head_signature(KEY.encode(), tenant="acme", position=count, head=head, time=time)
    chain_head = {"type": "chain_head", "tenant": "acme", "position": count, "head": head, "time": time}
    return [*events, {**chain_head, "signature": signature}]


@pytest.mark.parametrize(
    ("index", "damage", "problem"),
    [
        (1, {"seq": None}, "message 2 (audit_event) has no usable seq"),
        (1, {"seq": "2"}, "no usable seq"),
        (1, {"seq": True}, "no usable seq"),
        (1, {"seq": 0}, "no usable seq"),
        (1, {"hash": ["x"]}, "no usable hash"),
        (2, {"id": "evt_3"}, "message 3 (audit_event) has no usable id"),
        (0, {"tenant": {"slug": "acme"}}, "no usable tenant"),
        (3, {"position": "3"}, "message 4 (chain_head) has no usable position"),
        (3, {"signature": None}, "no usable signature"),
        (3, {"time": 1700000000}, "no usable time"),
    ],
)
def test_a_damaged_message_is_a_problem_of_the_check_not_a_crash(index, damage, problem):
    stream = _stream(3)
    assert records.verify_stream(stream, KEY.encode()).problems == []
    damaged = [*stream[:index], {**stream[index], **damage}, *stream[index + 1 :]]
    for name, value in damage.items():
        if value is None:
            del damaged[index][name]
    problems = records.verify_stream(damaged, KEY.encode()).problems
    assert any(problem in line for line in problems), problems


def test_a_huge_seq_is_one_gap_not_a_long_walk():
    stream = _stream(2)
    stream.insert(2, {"type": "audit_event", "tenant": "acme", "seq": 10**15, "id": 99, "hash": "f" * 64})
    problems = records.verify_stream(stream, KEY.encode()).problems
    assert problems == ["acme: event seq 3 is missing"], problems


def test_a_sink_down_delays_and_loses_nothing(
    stream: dict[str, Any], syslog: SyslogReceiver, tenant: Tenant
) -> None:
    stream["SYSLOG_URL"] = syslog.url()
    _write(tenant, 3)
    delivery.audit_stream_deliver()
    syslog.stop()
    _write(tenant, 5)
    delivery.audit_stream_deliver()
    cursor = AuditCursor.objects.get(sink="syslog", tenant=tenant)
    assert cursor.failures == 1 and "Connection refused" in cursor.last_error
    (status,) = delivery.sink_statuses(tenant_ids=[tenant.pk])
    assert status.behind == 5 and status.oldest_undelivered_at is not None

    syslog.start()
    _write(tenant, 2)
    delivery.audit_stream_deliver()
    events = [m.json for m in syslog.received() if m.msgid == "audit"]
    assert [e["id"] for e in events] == _all_ids(tenant)
    assert [e["seq"] for e in events] == list(range(1, 11))
    (status,) = delivery.sink_statuses(tenant_ids=[tenant.pk])
    assert (status.behind, status.last_error, status.position) == (0, "", 10)


def test_an_event_committed_after_a_later_id_is_not_skipped(
    stream: dict[str, Any], syslog: SyslogReceiver, tenant: Tenant, agent: Actor
) -> None:
    """A transaction that inserted its event (a lower id) and commits after a later-id event was
    delivered: a cursor over ids would skip it; the snapshot cursor sends it next."""
    stream["SYSLOG_URL"] = syslog.url()
    # Two runs: two chains, so neither writer waits for the other's chain head.
    slow_run, fast_run = make_run(tenant, agent), make_run(tenant, agent)
    delivery.audit_stream_deliver()
    before = len(syslog.received())
    inserted, release, done = threading.Event(), threading.Event(), threading.Event()
    slow_id: list[int] = []

    def slow_writer() -> None:
        try:
            with transaction.atomic():
                slow_id.extend(_write(tenant, 1, kind="test.slow", run=slow_run))
                inserted.set()
                release.wait(30)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert inserted.wait(30)
    fast_id = _write(tenant, 1, kind="test.fast", run=fast_run)[0]
    assert slow_id[0] < fast_id
    delivery.audit_stream_deliver()
    assert [m.json["id"] for m in syslog.received()[before:] if m.msgid == "audit"] == [fast_id]
    release.set()
    assert done.wait(30)
    thread.join()
    delivery.audit_stream_deliver()
    events = [m.json for m in syslog.received()[before:] if m.msgid == "audit"]
    assert [e["id"] for e in events] == [fast_id, slow_id[0]]
    assert events[1]["seq"] == events[0]["seq"] + 1
    assert records.verify_stream([m.json for m in syslog.received()], KEY.encode()).problems == []


def test_syslog_over_tls_with_the_operators_ca(
    stream: dict[str, Any], tenant: Tenant, ca: trustme.CA, tmp_path: Path
) -> None:
    receiver = SyslogReceiver(tls=_server_context(ca)).start()
    try:
        stream["SYSLOG_URL"] = receiver.url()
        _write(tenant, 3)
        delivery.audit_stream_deliver()  # without the CA file: the certificate is not trusted
        cursor = AuditCursor.objects.get(sink="syslog", tenant=tenant)
        assert "CERTIFICATE_VERIFY_FAILED" in cursor.last_error and receiver.received() == []

        stream["SYSLOG_CA_FILE"] = _ca_file(ca, tmp_path)
        delivery.audit_stream_deliver()
        events = [m.json for m in receiver.received() if m.msgid == "audit"]
        assert [e["id"] for e in events] == _all_ids(tenant)
    finally:
        receiver.stop()


def test_hec_over_https_batched_with_its_token(
    stream: dict[str, Any], tenant: Tenant, ca: trustme.CA, tmp_path: Path
) -> None:
    receiver = HecReceiver(tls=_server_context(ca)).start()
    try:
        stream.update(HEC_URL=receiver.url(), HEC_TOKEN="wrong", HEC_CA_FILE=_ca_file(ca, tmp_path))
        _write(tenant, 6)
        delivery.audit_stream_deliver()
        assert "HTTP 401" in AuditCursor.objects.get(sink="hec", tenant=tenant).last_error

        stream["HEC_TOKEN"] = receiver.token
        delivery.audit_stream_deliver()
        envelopes = receiver.received()
        assert {e["sourcetype"] for e in envelopes} == {"saga:audit"}
        events = [e["event"] for e in envelopes if e["event"]["type"] == "audit_event"]
        assert [e["id"] for e in events] == _all_ids(tenant)
        assert abs(envelopes[0]["time"] - Event.objects.get(pk=events[0]["id"]).created_at.timestamp()) < 1e-3
        assert records.verify_stream([e["event"] for e in envelopes], KEY.encode()).problems == []
    finally:
        receiver.stop()


def test_no_key_no_stream(stream: dict[str, Any], syslog: SyslogReceiver, tenant: Tenant) -> None:
    stream.update(SYSLOG_URL=syslog.url(), KEY="")
    _write(tenant, 1)
    delivery.audit_stream_deliver()
    assert syslog.received() == []
    assert "SAGA_AUDIT_KEY" in AuditCursor.objects.get(sink="syslog", tenant=tenant).last_error
    assert any("SAGA_AUDIT_KEY" in p for p in config.check_installation())


def test_a_tenants_sinks_get_its_own_events_only(
    stream: dict[str, Any], syslog: SyslogReceiver, settings: Any, tenant: Tenant, other_tenant: Tenant
) -> None:
    hec = HecReceiver().start()
    try:
        settings.SAGA = {
            **settings.SAGA,
            "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{syslog.port}", f"127.0.0.1:{hec.port}"],
        }
        actor = Actor.system("test")
        config.sink_set(tenant=tenant, actor=actor, kind="syslog", url=syslog.url(), token="", enabled=True)
        config.sink_set(tenant=tenant, actor=actor, kind="hec", url=hec.url(), token=hec.token, enabled=True)
        _write(other_tenant, 2)
        _write(tenant, 2)
        delivery.audit_stream_deliver()
        events = [m.json for m in syslog.received() if m.msgid == "audit"]
        assert [e["id"] for e in events] == _all_ids(tenant)
        hec_events = [e["event"] for e in hec.received() if e["event"]["type"] == "audit_event"]
        assert [e["id"] for e in hec_events] == _all_ids(tenant)
        assert Event.objects.filter(tenant=tenant, kind="audit_stream.sink_set").count() == 2
    finally:
        hec.stop()


def test_two_first_saves_at_once_give_one_sink(
    stream: dict[str, Any], syslog: SyslogReceiver, settings: Any, tenant: Tenant, monkeypatch: Any
) -> None:
    """A second admin saves while the first save is between its look and its write: the second
    waits and then updates the sink the first created (it used to break the one-sink-per-kind
    constraint: a 500)."""
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{syslog.port}"]}
    actor = Actor.system("test")
    check, outcome = config.check_tenant_sink, dict[str, object]()

    def second_save() -> None:
        try:
            config.sink_set(
                tenant=tenant, actor=actor, kind="syslog", url=syslog.url(), token="", enabled=False
            )
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001 - the test reports whatever the second save raised
            outcome["error"] = exc
        finally:
            connections.close_all()

    second = threading.Thread(target=second_save)

    def first_check(**kwargs: Any) -> Any:
        monkeypatch.setattr(config, "check_tenant_sink", check)
        second.start()
        second.join(timeout=1)  # it waits on the tenant's lock: still running
        assert second.is_alive()
        return check(**kwargs)

    monkeypatch.setattr(config, "check_tenant_sink", first_check)
    config.sink_set(tenant=tenant, actor=actor, kind="syslog", url=syslog.url(), token="", enabled=True)
    second.join(timeout=30)
    assert outcome == {"ok": True}
    sink = AuditSink.objects.get(tenant=tenant, kind="syslog")
    assert sink.enabled is False
    assert Event.objects.filter(tenant=tenant, kind="audit_stream.sink_set").count() == 2


@pytest.mark.parametrize(
    ("kind", "url", "token", "field", "says"),
    [
        ("syslog", "tcp://127.0.0.1:514", "", "url", "not allowed"),
        ("syslog", "tcp+tls://169.254.169.254:6514", "", "url", "not allowed"),
        ("syslog", "tcp://[::1]:514", "", "url", "not allowed"),
        ("hec", "https://10.0.0.7:8088/services/collector/event", "t", "url", "not allowed"),
        ("syslog", "http://203.0.113.9/", "", "url", "must be a tcp:// or tcp+tls:// URL"),
        ("hec", "ftp://203.0.113.9/", "t", "url", "must be an http(s) URL"),
        ("syslog", "tcp://203.0.113.9", "", "url", "has no port"),
        # The audit log and the HEC token never cross the network in clear text.
        ("hec", "http://8.8.8.8:8088/services/collector/event", "t", "url", "must use https://"),
        ("syslog", "tcp://8.8.8.8:514", "", "url", "must use tcp+tls://"),
        ("hec", "https://example.com/" + "x" * 600, "t", "url", "longer than 500"),
        ("hec", "https://example.com/", "t" * 300, "token", "longer than 200"),
        ("hec", "https://example.com/", "", "token", "needs its token"),
        ("kafka", "https://example.com/", "", "kind", "kind must be one of"),
    ],
)
def test_hostile_tenant_sinks_are_refused(
    tenant: Tenant, kind: str, url: str, token: str, field: str, says: str
) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        config.sink_set(
            tenant=tenant, actor=Actor.system("test"), kind=kind, url=url, token=token, enabled=True
        )
    assert says in refused.value.message
    assert refused.value.details.get("field") == field
    assert not AuditSink.objects.exists()


def test_verify_audit_stream_command(
    stream: dict[str, Any],
    syslog: SyslogReceiver,
    tenant: Tenant,
    tmp_path: Path,
    monkeypatch: Any,
    capsys: Any,
) -> None:
    stream["SYSLOG_URL"] = syslog.url()
    _write(tenant, 5)
    delivery.audit_stream_deliver()
    delivery.audit_stream_deliver()  # a second head (HEAD_INTERVAL_S 0) over the same events
    lines = [m.msgid + " " + m.text for m in syslog.received()]
    received = tmp_path / "received.log"
    received.write_text("\n".join([lines[0], *lines]) + "\n", encoding="utf-8")  # a duplicate too
    monkeypatch.setenv("SAGA_AUDIT_KEY", KEY)
    call_command("verify_audit_stream", str(received))
    heads = sum(1 for m in syslog.received() if m.msgid == "chain-head")
    assert heads >= 2
    assert f"acme: 5 events, {heads} signed chain heads verified." in capsys.readouterr().out

    tampered = tmp_path / "tampered.log"
    tampered.write_text(
        "\n".join(lines)
        .replace('"n":2', '"n":3')
        .replace(json.loads(lines[2].split(" ", 1)[1])["hash"], "f" * 64),
        encoding="utf-8",
    )
    with pytest.raises(CommandError, match="not whole"):
        call_command("verify_audit_stream", str(tampered))
    monkeypatch.setenv("SAGA_AUDIT_KEY", "another key")
    with pytest.raises(CommandError, match="not whole"):
        call_command("verify_audit_stream", str(received))


def test_a_receiver_that_never_closes_fails_the_batch_within_the_timeout(
    stream: dict[str, Any], tenant: Tenant
) -> None:
    """A syslog receiver that reads and keeps the connection open (trickling a byte now and then)
    holds a send no longer than the sink's timeout: the batch fails, its cursor says so, and it is
    sent again later."""
    import socket
    import time

    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def trickle() -> None:
        conn, _ = listener.accept()
        while not stop.is_set():
            conn.recv(65536)
            conn.sendall(b".")
            time.sleep(0.2)
        conn.close()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        stream["SYSLOG_URL"] = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        stream["TIMEOUT_S"] = 1.0
        _write(tenant, 2)
        started = time.monotonic()
        delivery.audit_stream_deliver()
        assert time.monotonic() - started < 4
        cursor = AuditCursor.objects.get(sink="syslog", tenant=tenant)
        assert cursor.failures == 1 and cursor.position == 0
        assert "did not close the connection within 1s" in cursor.last_error
    finally:
        stop.set()
        listener.close()


def test_an_installation_url_that_cannot_be_parsed_stops_only_its_own_sink(
    stream: dict[str, Any], syslog: SyslogReceiver, settings: Any, tenant: Tenant
) -> None:
    stream["SYSLOG_URL"] = "tcp://127.0.0.1:99999"
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{syslog.port}"]}
    config.sink_set(
        tenant=tenant, actor=Actor.system("test"), kind="syslog", url=syslog.url(), token="", enabled=True
    )
    _write(tenant, 2)
    delivery.audit_stream_deliver()  # no exception out of the pass
    broken = AuditCursor.objects.get(sink="syslog", tenant=tenant)
    assert broken.failures == 1 and broken.last_error.startswith("ValueError")
    events = [m.json for m in syslog.received() if m.msgid == "audit"]
    assert [e["id"] for e in events] == _all_ids(tenant)  # the tenant's own sink went on


def test_a_sink_removed_during_a_pass_gets_nothing(
    stream: dict[str, Any], syslog: SyslogReceiver, settings: Any, tenant: Tenant
) -> None:
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{syslog.port}"]}
    actor = Actor.system("test")
    row = config.sink_set(tenant=tenant, actor=actor, kind="syslog", url=syslog.url(), token="", enabled=True)
    sinks = config.all_sinks()  # what a pass read before the admin removed the sink
    config.sink_remove(tenant=tenant, actor=actor, kind="syslog")
    _write(tenant, 2)
    key = config.audit_key()
    assert [delivery.sink_deliver(sink, tenant, key=key) for sink in sinks] == [0]
    assert syslog.received() == []
    assert not AuditCursor.objects.filter(sink=f"tenant:{row.pk}").exists()


def test_a_sinks_credentials_are_never_shown(tenant: Tenant) -> None:
    sink = AuditSink(tenant=tenant, kind="hec", url="https://user:s3cret@siem.example.com/services/collector")
    assert sink.shown_url == "https://siem.example.com/services/collector"
    assert "s3cret" not in str(sink)
