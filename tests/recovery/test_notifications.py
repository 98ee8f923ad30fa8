"""New recovery items and approvals tell people by e-mail and signed webhook (the environment's
channels), from an RQ job after the transaction that wrote their outbox rows."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import django_rq
import pytest
from django.core import mail
from rq import SimpleWorker
from saga_client.signing import verify_signature

from ledger.models import ToolPolicy
from ledger.services import runs
from recovery.actions.approvals import action_record_gated
from recovery.actions.reports import run_fail_and_queue

SECRET = "notify-secret"


@pytest.fixture
def receiver():
    """A webhook endpoint that keeps what it was sent and whether the signature verified."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(
                {"payload": json.loads(body), "signed": verify_signature(SECRET, dict(self.headers), body)}
            )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()


@pytest.fixture
def notify_to(settings, receiver):
    url, received = receiver
    settings.SAGA = {
        **settings.SAGA,
        "NOTIFY_EMAILS": ["oncall@acme.test"],
        "NOTIFY_WEBHOOKS": [url],
        "NOTIFY_WEBHOOK_SECRET": SECRET,
    }
    queue = django_rq.get_queue("notifications")
    queue.empty()
    yield received
    queue.empty()


def _work_notifications() -> None:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def test_a_new_recovery_item_is_mailed_and_posted_signed(
    tenant, agent, notify_to, django_capture_on_commit_callbacks
):
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    with django_capture_on_commit_callbacks(execute=True):
        item = run_fail_and_queue(run=run, actor=agent, error="mail gateway 429").item
    # Nothing was sent inside the request: only a job was queued.
    assert mail.outbox == [] and notify_to == []

    _work_notifications()

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert run.pk in message.subject and message.to == ["oncall@acme.test"]
    assert "mail gateway 429" in message.body
    assert [(r["payload"]["event"], r["payload"]["id"], r["signed"]) for r in notify_to] == [
        ("recovery.opened", item.pk, True)
    ]


def test_an_approval_request_is_mailed_and_posted_signed(
    tenant, agent, notify_to, django_capture_on_commit_callbacks
):
    ToolPolicy.objects.create(
        tool="payments.charge",
        risk="critical",
        approval="manual",
        action_class="external_irreversible",
        compensation="correction",
    )
    run = runs.run_create(tenant=tenant, actor=agent, agent="billing", request="Pay invoice 7")
    with django_capture_on_commit_callbacks(execute=True):
        action = action_record_gated(
            run=run, actor=agent, tool="payments.charge", idempotency_key="pay-7", args={"amount": 48200}
        ).action

    _work_notifications()

    approval = action.approvals.get()
    assert len(mail.outbox) == 1 and "payments.charge" in mail.outbox[0].subject
    assert '"amount": 48200' in mail.outbox[0].body
    assert [(r["payload"]["event"], r["payload"]["id"], r["signed"]) for r in notify_to] == [
        ("approval.requested", approval.pk, True)
    ]
