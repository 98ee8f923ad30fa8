"""A real ``saga_worker`` delivers the audit stream to a syslog receiver over TLS and an HTTPS
HEC receiver (a throwaway CA): each gets every event exactly once, in order; both are stopped
while events are written and started again, and nothing is lost or duplicated."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from django.db import transaction

from ledger.audit import Actor, audit_record
from ledger.models import Event, Tenant
from recovery.audit_stream import records
from recovery.audit_stream.models import AuditCursor
from tests.factories import make_run
from tests.support.processes import Worker, dump_worker_logs, wait_for
from tests.support.siem import HecReceiver, SyslogReceiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

KEY = "worker-test-audit-key"


def _write(tenant: Tenant, count: int) -> None:
    for n in range(count):
        with transaction.atomic():
            audit_record(tenant=tenant, actor=Actor.system("test"), kind="test.event", subject=f"t:{n}")


def _ids(tenant: Tenant) -> list[int]:
    return list(Event.objects.filter(tenant=tenant).order_by("id").values_list("id", flat=True))


def _syslog_events(receiver: SyslogReceiver) -> list[int]:
    return [m.json["id"] for m in receiver.received() if m.msgid == "audit"]


def _hec_events(receiver: HecReceiver) -> list[int]:
    return [e["event"]["id"] for e in receiver.received() if e["event"]["type"] == "audit_event"]


def test_a_worker_delivers_every_event_in_order_across_an_outage(
    transactional_db: Any,
    start_worker: Callable[..., Worker],
    workers: list[Worker],
    tmp_path: Path,
    agent: Actor,
) -> None:
    tenant = Tenant.objects.get(slug="acme")
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    syslog, hec = SyslogReceiver(tls=server).start(), HecReceiver(tls=server).start()
    try:
        start_worker(
            SAGA_AUDIT_SYSLOG_URL=syslog.url(),
            SAGA_AUDIT_SYSLOG_CA_FILE=str(ca_file),
            SAGA_AUDIT_HEC_URL=hec.url(),
            SAGA_AUDIT_HEC_TOKEN=hec.token,
            SAGA_AUDIT_HEC_CA_FILE=str(ca_file),
            SAGA_AUDIT_KEY=KEY,
            SAGA_AUDIT_HEAD_INTERVAL_S="0.5",
            SAGA_AUDIT_BATCH="7",
        )

        def arrived() -> bool:
            expected = _ids(tenant)
            return _syslog_events(syslog) == expected and _hec_events(hec) == expected

        make_run(tenant, agent)
        _write(tenant, 5)
        wait_for(arrived, timeout=60, what="the first events at both receivers")

        syslog.stop()
        hec.stop()
        _write(tenant, 12)
        wait_for(
            lambda: AuditCursor.objects.filter(tenant=tenant).exclude(last_error="").count() == 2,
            timeout=60,
            what="both sinks to fail",
        )
        syslog.start()
        hec.start()
        _write(tenant, 4)
        try:
            wait_for(arrived, timeout=90, what="every event at both receivers after the outage")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc
    finally:
        syslog.stop()
        hec.stop()

    expected = _ids(tenant)
    assert len(expected) > 21
    # Exactly once and in order at each receiver; the signed heads verify with the key only.
    for messages in ([m.json for m in syslog.received()], [e["event"] for e in hec.received()]):
        events = [m for m in messages if m["type"] == "audit_event"]
        assert [m["id"] for m in events] == expected
        assert [m["seq"] for m in events] == list(range(1, len(expected) + 1))
        report = records.verify_stream(messages, KEY.encode())
        assert report.problems == [] and report.heads_verified["acme"] >= 1
        assert records.verify_stream(messages, b"not the key").problems != []
    assert AuditCursor.objects.filter(tenant=tenant, last_error="").count() == 2


def test_a_worker_without_the_key_says_so_and_sends_nothing(
    transactional_db: Any, start_worker: Callable[..., Worker], agent: Actor
) -> None:
    tenant = Tenant.objects.get(slug="acme")
    syslog = SyslogReceiver().start()
    try:
        worker = start_worker(SAGA_AUDIT_SYSLOG_URL=syslog.url(), SAGA_AUDIT_KEY="")
        _write(tenant, 2)
        wait_for(
            lambda: (
                "SAGA_AUDIT_KEY" in worker.log()
                and AuditCursor.objects.filter(tenant=tenant, last_error__contains="SAGA_AUDIT_KEY").exists()
            ),
            timeout=60,
            what="the worker to refuse the sink without a key",
        )
        assert (
            "audit stream not started: The audit stream has a sink configured but no signing key"
            in worker.log()
        )
        assert syslog.received() == []
    finally:
        syslog.stop()
