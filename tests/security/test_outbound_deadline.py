"""A hostile endpoint holds a worker no longer than its deadline.

httpx's timeouts bound each read, not the request: an endpoint that sends one byte every 0.1 s
under a 1 s timeout never times out, and held the worker that called it for as long as it kept
dribbling (with one worker, every tenant's queue behind it). Every outbound call now has one
deadline for the whole call (``infra.deadline``), and a stalled audit sink backs off exactly as a
failing one does.

The endpoint here is a real HTTP server on this machine, in a thread, that sends its answer one
byte at a time (its status line and headers, or its body), a little faster than any per-read
timeout; each call site is driven through its own service with the deadline (``WEBHOOK_TIMEOUT_S``,
the audit stream's ``TIMEOUT_S``, an SSO provider's ``timeout_s``) set to 1 s. Before the fix each
call returned the dribbled answer after about 7 s.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db import transaction
from django.utils import timezone

from dashboard.sso import discovery
from dashboard.sso.conf import SsoSettings
from infra import deadline
from ledger.audit import Actor, audit_record
from ledger.models import Event, Run, Tenant
from recovery import compensators
from recovery.actions import channels, commands
from recovery.audit_stream import config, delivery
from recovery.audit_stream.models import AuditCursor, AuditSink
from recovery.models import AgentCommand
from recovery.notifications import command_push
from recovery.notifications import delivery as notification_delivery
from tests.support.siem import HecReceiver

DEADLINE_S = 1.0
INTERVAL_S = 0.1  # one byte this often: far inside any per-read timeout
MARGIN_S = 2.0  # a loaded machine's slack; the dribbled answer takes about 7 s
BODY = b'{"text": "' + b"." * 40 + b'"}'


class Dribbler:
    """An HTTP server that reads a request and answers 200 one byte at a time: ``head`` dribbles
    from the status line on, ``body`` sends the headers at once and dribbles the body."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}{path}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    request += chunk
                head = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
                )
                if self.mode == "body":
                    conn.sendall(head)
                    head = b""
                for byte in head + BODY:
                    if self.stop.wait(INTERVAL_S):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return  # the caller hung up: what the deadline is for

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.fixture(params=["head", "body"])
def dribbler(request: pytest.FixtureRequest) -> Iterator[Dribbler]:
    server = Dribbler(request.param)
    yield server
    server.close()


@pytest.fixture
def short_deadline(settings: Any, dribbler: Dribbler) -> Dribbler:
    settings.SAGA = {
        **settings.SAGA,
        "WEBHOOK_TIMEOUT_S": DEADLINE_S,
        "OUTBOUND_ALLOWED_HOSTS": [dribbler.host],
        "NOTIFY_WEBHOOKS": [],
        "NOTIFY_EMAILS": [],
    }
    return dribbler


def _timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def _within_the_deadline(took: float) -> bool:
    return DEADLINE_S * 0.9 <= took < DEADLINE_S + MARGIN_S


def _request(timeout_s: float = DEADLINE_S) -> compensators.CompensationRequest:
    return compensators.CompensationRequest(
        step_id="stp_1",
        action_id="act_1",
        run_id="run_1",
        tenant="acme",
        tool="crm.delete_contact",
        args={"id": 1},
        target_type="contact",
        target_id="1",
        before_snapshot=None,
        after_snapshot=None,
        attempt=1,
        idempotency_key="idem-1",
        timeout_s=timeout_s,
    )


def test_the_helper_cuts_a_dribbled_answer_at_the_deadline(dribbler: Dribbler) -> None:
    with deadline.client() as client:
        started = time.monotonic()
        with pytest.raises(deadline.DeadlineExceeded, match="within 1s"):
            deadline.post(client, dribbler.url(), deadline_s=DEADLINE_S, content=b"{}")
        assert _within_the_deadline(time.monotonic() - started)
        # A client of the helper refuses a request without a deadline: none goes out unbounded.
        with pytest.raises(RuntimeError, match="without a deadline"):
            client.post(dribbler.url(), content=b"{}")


def test_a_compensator_webhook_that_dribbles_is_retried_after_the_deadline(dribbler: Dribbler) -> None:
    outcome, took = _timed(
        lambda: compensators.webhook_call(url=dribbler.url(), secret="s" * 32, request=_request())
    )
    assert outcome.kind == compensators.RETRY, outcome
    assert outcome.error.startswith("Timed out after 1s calling the webhook compensator")
    assert _within_the_deadline(took), took


def test_an_mcp_compensator_that_dribbles_is_retried_after_the_deadline(dribbler: Dribbler) -> None:
    outcome, took = _timed(
        lambda: compensators.mcp_call(
            url=dribbler.url("/mcp"), tool="delete", headers_env={}, request=_request()
        )
    )
    assert outcome.kind == compensators.RETRY, outcome
    assert "Timed out after 1s" in outcome.error
    assert _within_the_deadline(took), took


def test_a_slack_response_url_that_dribbles_frees_the_worker_at_the_deadline(
    short_deadline: Dribbler,
) -> None:
    answered, took = _timed(
        lambda: notification_delivery.slack_respond(
            response_url=short_deadline.url(), message={"text": "done"}
        )
    )
    assert answered is False
    assert _within_the_deadline(took), took


def test_an_sso_provider_that_dribbles_its_discovery_document_is_cut_at_its_timeout(
    dribbler: Dribbler,
) -> None:
    conf = SsoSettings(
        issuer=f"http://{dribbler.host}", client_id="c", client_secret="s", timeout_s=DEADLINE_S
    )
    started = time.monotonic()
    with pytest.raises(discovery.DiscoveryError, match="cannot be reached"):
        discovery.fetch_metadata(conf)
    assert _within_the_deadline(time.monotonic() - started)


@pytest.mark.django_db(transaction=True)
def test_a_resume_url_that_dribbles_is_recorded_undelivered_at_the_deadline(
    short_deadline: Dribbler, tenant: Tenant, alice: Any
) -> None:
    run = Run.objects.create(
        tenant=tenant, agent="a", request="r", owner="onboarding-agent", resume_url=short_deadline.url()
    )
    command = commands.command_issue(run=run, kind="resume", actor=Actor.for_user(alice), reason="go on")
    AgentCommand.objects.filter(pk=command.pk).update(delivery_attempts=0, delivery_error="")
    delivered, took = _timed(lambda: command_push.deliver_command(command_id=command.pk))
    assert delivered is False
    command.refresh_from_db()
    assert command.delivered_at is None and command.delivery_error.startswith("DeadlineExceeded")
    assert _within_the_deadline(took), took


@pytest.mark.django_db(transaction=True)
def test_a_channel_webhook_that_dribbles_is_retried_after_the_deadline(
    short_deadline: Dribbler, tenant: Tenant, dave: Any
) -> None:
    saved = channels.channel_create(
        tenant=tenant, actor=Actor.for_user(dave), name="hook", kind="webhook", target=short_deadline.url()
    )
    row = channels.channel_send_test(channel=saved.channel, actor=Actor.for_user(dave))
    outcome, took = _timed(lambda: notification_delivery.notification_deliver(notification_id=row.pk))
    assert outcome == "retry"
    row.refresh_from_db()
    assert row.last_error.startswith("DeadlineExceeded") and row.delivered_at is None
    assert _within_the_deadline(took), took


@pytest.mark.django_db(transaction=True)
def test_a_stalled_audit_sink_backs_off_like_a_failing_one_and_the_other_tenants_go_on(
    settings: Any, dribbler: Dribbler, tenant: Tenant, other_tenant: Tenant
) -> None:
    """One pass: the stalled tenant's sink fails at the deadline with its backoff set, the other
    tenant's sink gets its events in the same pass; the next pass leaves the stalled sink alone
    until its backoff is over (no new connection to it)."""
    hec = HecReceiver().start()
    try:
        settings.AUDIT_STREAM = {"KEY": "k" * 32, "HEAD_INTERVAL_S": 0.0, "TIMEOUT_S": DEADLINE_S}
        settings.SAGA = {
            **settings.SAGA,
            "OUTBOUND_ALLOWED_HOSTS": [dribbler.host, f"127.0.0.1:{hec.port}"],
            "RETRY_BACKOFF_BASE_S": 60.0,
            "RETRY_BACKOFF_MAX_S": 600.0,
        }
        actor = Actor.system("test")
        config.sink_set(
            tenant=tenant,
            actor=actor,
            kind="hec",
            url=dribbler.url("/services/collector"),
            token="t",
            enabled=True,
        )
        config.sink_set(
            tenant=other_tenant, actor=actor, kind="hec", url=hec.url(), token=hec.token, enabled=True
        )
        with transaction.atomic():
            audit_record(tenant=tenant, actor=actor, kind="test.event", subject="thing:1")
            audit_record(tenant=other_tenant, actor=actor, kind="test.event", subject="thing:2")

        _, took = _timed(delivery.audit_stream_deliver)

        assert _within_the_deadline(took), took
        stalled = AuditCursor.objects.get(sink=_sink_name(tenant), tenant=tenant)
        assert stalled.failures == 1 and stalled.position == 0
        assert "DeadlineExceeded" in stalled.last_error
        assert stalled.next_attempt_at is not None and stalled.next_attempt_at > timezone.now()
        delivered = [e["event"]["id"] for e in hec.received() if e["event"]["type"] == "audit_event"]
        assert delivered == list(
            Event.objects.filter(tenant=other_tenant).order_by("id").values_list("id", flat=True)
        )

        connections = dribbler.connections
        _, took_again = _timed(delivery.audit_stream_deliver)
        assert dribbler.connections == connections and took_again < DEADLINE_S
        assert AuditCursor.objects.get(pk=stalled.pk).failures == 1
    finally:
        hec.stop()


def _sink_name(tenant: Tenant) -> str:
    return config.tenant_sink(AuditSink.objects.get(tenant=tenant)).name


def test_a_silent_endpoint_is_cut_at_the_deadline_too() -> None:
    """The deadline covers what per-read timeouts covered: an endpoint that never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        started = time.monotonic()
        with deadline.client() as client, pytest.raises(httpx.TimeoutException):
            deadline.get(client, url, deadline_s=0.5)
        assert time.monotonic() - started < 0.5 + MARGIN_S
    finally:
        listener.close()
