"""A tenant's audit sink cannot get the audit log sent in clear text by writing its scheme in
capitals.

``check_url`` read the scheme through httpx (lower case) and let ``TCP+TLS://`` pass the rule that
the audit log never crosses the network in clear text; ``Sink.tls`` read the text as written, found
no ``tcp+tls://`` and sent the batch over plain TCP. Both now read the one parse
(``infra.outbound.url_scheme``). The sink here is a real TCP listener that keeps the first bytes
it is sent: a TLS ClientHello, never a syslog frame.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Tenant
from recovery.audit_stream import config, delivery
from recovery.audit_stream.models import AuditCursor, AuditSink

pytestmark = pytest.mark.django_db(transaction=True)

TLS_HANDSHAKE = 0x16  # the first byte of a TLS record carrying a handshake (the ClientHello)


class FirstBytes:
    """A TCP listener that keeps what each connection sends first, then hangs up."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received: list[bytes] = []
        self.got = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.received.append(conn.recv(65536))
                except OSError:
                    self.received.append(b"")
            self.got.set()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.fixture
def listener() -> Iterator[FirstBytes]:
    receiver = FirstBytes()
    yield receiver
    receiver.close()


@pytest.fixture
def stream(settings: Any) -> dict[str, Any]:
    settings.AUDIT_STREAM = {"KEY": "test-audit-key-0123456789", "HEAD_INTERVAL_S": 0.0, "TIMEOUT_S": 5.0}
    return settings.AUDIT_STREAM


def test_a_tls_scheme_in_capitals_sends_the_audit_log_over_tls_not_in_clear_text(
    stream: dict[str, Any], settings: Any, tenant: Tenant, listener: FirstBytes
) -> None:
    """Fail (before): the listener read the batch as syslog frames, the tenant's events in clear
    text. Pass: it reads a TLS ClientHello and nothing of the log; the send fails (the listener
    speaks no TLS) and the cursor waits out its backoff."""
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{listener.port}"]}
    url = f"TCP+TLS://127.0.0.1:{listener.port}"
    config.sink_set(tenant=tenant, actor=Actor.system("test"), kind="syslog", url=url, token="", enabled=True)
    with transaction.atomic():
        audit_record(tenant=tenant, actor=Actor.system("test"), kind="test.secret_event", subject="thing:1")

    delivery.audit_stream_deliver()

    assert listener.got.wait(5)
    [first] = listener.received
    assert first[:1] == bytes([TLS_HANDSHAKE]), first[:80]
    assert b"test.secret_event" not in first and b"audit_event" not in first
    [row] = AuditSink.objects.filter(tenant=tenant)
    cursor = AuditCursor.objects.get(sink=config.tenant_sink(row).name, tenant=tenant)
    assert cursor.failures == 1 and cursor.position == 0


@pytest.mark.parametrize(
    ("kind", "url", "token"),
    [
        ("syslog", "TCP+TLS://8.8.8.8:6514", ""),
        ("syslog", "tCp+tLs://8.8.8.8:6514/", ""),
        ("hec", "HTTPS://8.8.8.8/services/collector", "t"),
        ("hec", "hTTps://8.8.8.8/services/collector", "t"),
    ],
)
def test_what_the_check_accepts_as_tls_is_sent_as_tls(kind: str, url: str, token: str) -> None:
    """For any spelling of a scheme: the check's verdict (TLS required, public host) and the
    sender's reading agree."""
    checked = config.check_tenant_sink(kind=kind, url=url, token=token)
    sink = config.Sink(name="tenant:1", kind=kind, url=url, token=token, tenant_id=1)
    assert sink.tls and checked.scheme in {"tcp+tls", "https"}


@pytest.mark.parametrize("url", ["TCP://8.8.8.8:514", "Tcp://8.8.8.8:514"])
def test_a_plain_scheme_in_capitals_is_still_refused(url: str) -> None:
    with pytest.raises(errors.UrlNotAllowed, match="must use tcp\\+tls://"):
        config.check_tenant_sink(kind="syslog", url=url, token="")
    assert not config.Sink(name="tenant:1", kind="syslog", url=url, tenant_id=1).tls
