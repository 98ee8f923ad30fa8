"""The compensator protocol: the signed webhook exactly as API.md says, Python compensators, and
the drift check before a snapshot restore."""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from saga_client.signing import compute_signature

from recovery import compensators
from recovery.compensators import CompensationRequest, Outcome
from tests.factories import HR_PATH, HR_SECRET
from tests.support.processes import Reply


def _request(**overrides) -> CompensationRequest:
    fields: dict[str, Any] = dict(
        step_id="stp_1",
        action_id="act_1",
        run_id="run_1",
        tenant="acme",
        tool="hr.delete_user",
        args={"email": "ashu@company.com"},
        target_type="user",
        target_id="ashu@company.com",
        before_snapshot=None,
        after_snapshot={"user": "ashu"},
        attempt=2,
        idempotency_key="stp_1",
        timeout_s=1.0,
    )
    fields.update(overrides)
    return CompensationRequest(**fields)


def _call(webhooks, reply: Reply | None = None, **overrides) -> Outcome:
    if reply is not None:
        webhooks.script[HR_PATH] = [reply]
    return compensators.webhook_call(
        url=webhooks.url(HR_PATH), secret=HR_SECRET, request=_request(**overrides)
    )


def test_it_signs_the_body_with_timestamp_and_sends_a_stable_idempotency_key(webhooks):
    assert _call(webhooks).kind == "done"
    assert _call(webhooks).kind == "done"
    first, second = webhooks.calls
    assert first.signature_ok and second.signature_ok
    timestamp = first.headers["X-Saga-Timestamp"]
    assert first.headers["X-Saga-Signature"] == compute_signature(HR_SECRET, timestamp, first.raw)
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"] == "stp_1"
    assert first.headers["Content-Type"] == "application/json"
    assert set(first.body) == {
        "step_id",
        "action_id",
        "run_id",
        "tenant",
        "tool",
        "args",
        "target_type",
        "target_id",
        "before_snapshot",
        "after_snapshot",
        "attempt",
    }


@pytest.mark.parametrize(
    ("reply", "kind", "state"),
    [
        (Reply(200, {"state": {"deleted": True}}), "done", {"deleted": True}),
        (Reply(204, None), "done", None),
        (Reply(409, {"error": "already gone"}), "done", None),
        (Reply(412, {"error": "edited"}), "drifted", None),
        (Reply(400, {"error": "bad args"}), "failed", None),
        (Reply(404), "failed", None),
        (Reply(500), "retry", None),
        (Reply(503), "retry", None),
    ],
)
def test_it_maps_each_answer_to_an_outcome(webhooks, reply, kind, state):
    outcome = _call(webhooks, reply)
    assert (outcome.kind, outcome.state, outcome.status_code) == (kind, state, reply.status)


def test_a_timeout_or_a_dead_endpoint_is_retried(webhooks):
    import threading

    never = threading.Event()
    slow = _call(webhooks, Reply(200, block=never), timeout_s=0.3)
    never.set()
    assert slow.kind == "retry" and "Timed out" in slow.error

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    refused = compensators.webhook_call(url=f"http://127.0.0.1:{dead_port}/x", secret="s", request=_request())
    assert refused.kind == "retry" and "Could not reach" in refused.error


def test_a_wrong_secret_is_rejected_by_the_receiver_as_a_failure(webhooks):
    outcome = compensators.webhook_call(
        url=webhooks.url(HR_PATH), secret="not-the-secret", request=_request()
    )
    assert outcome.kind == "failed" and outcome.status_code == 401


def test_one_client_serves_every_call_of_a_process(webhooks, monkeypatch):
    client = compensators.webhook_client()
    built = []
    monkeypatch.setattr(compensators.httpx, "Client", lambda *a, **k: built.append(k))

    assert _call(webhooks).kind == "done"
    assert _call(webhooks, Reply(500)).kind == "retry"

    assert compensators.webhook_client() is client and built == []
    assert len(webhooks.calls) == 2


def test_a_forked_work_horse_makes_its_own_client_and_reuses_the_ssl_context(webhooks):
    # What saga_worker does before forking work horses.
    compensators.webhook_client_warm()
    assert _call(webhooks).kind == "done"
    parent = compensators.webhook_client()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the work horse
        try:
            os.close(read)

            def no_new_context(*_args: object, **_kwargs: object) -> ssl.SSLContext:
                raise AssertionError("the work horse loaded the CA bundle again")

            ssl.create_default_context = no_new_context
            child = compensators.webhook_client()
            report = {
                "kind": _call(webhooks).kind,
                "inherited": child is parent,
                "kept": compensators.webhook_client() is child,
                "parent_left_open": not parent.is_closed,
            }
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            report = {"error": repr(exc)}
        os.write(write, json.dumps(report).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = json.loads(pipe.read() or b"{}")
    os.waitpid(pid, 0)

    assert report == {"kind": "done", "inherited": False, "kept": True, "parent_left_open": True}
    # The parent's client is untouched by the child and still its own.
    assert compensators.webhook_client() is parent and not parent.is_closed
    assert _call(webhooks).kind == "done"
    assert [c.signature_ok for c in webhooks.calls] == [True, True, True]


def test_a_redirect_is_the_answer_and_the_signed_step_is_not_sent_on(webhooks):
    target = webhooks.url(HR_PATH)

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(307)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        outcome = compensators.webhook_call(
            url=f"http://127.0.0.1:{httpd.server_address[1]}/undo", secret=HR_SECRET, request=_request()
        )
    finally:
        httpd.shutdown()
        httpd.server_close()

    assert (outcome.kind, outcome.status_code) == ("retry", 307)
    assert webhooks.calls == []


def test_python_compensators_receive_the_same_fields_and_map_exceptions():
    seen = {}

    @compensators.compensator("tests.python_undo")
    def undo(**fields):
        seen.update(fields)
        return {"state": {"undone": fields["args"]}}

    outcome = compensators.python_call(undo, _request(tool="tests.python_undo"))
    assert outcome == Outcome.done({"undone": {"email": "ashu@company.com"}})
    assert seen["idempotency_key"] == "stp_1" and seen["attempt"] == 2

    def drifted(**fields):
        raise compensators.CompensationDrifted("someone renamed the user")

    def broken(**fields):
        raise compensators.CompensationFailed("user is protected")

    def flaky(**fields):
        raise ConnectionError("HR API down")

    assert compensators.python_call(drifted, _request()).kind == "drifted"
    assert compensators.python_call(broken, _request()).kind == "failed"
    assert compensators.python_call(flaky, _request()).kind == "retry"


def test_a_snapshot_restore_checks_drift_with_the_reader_first(db, tenant):
    restored = []

    @compensators.compensator("crm.update_contact.restore")
    def restore(**fields):
        restored.append(fields["args"])

    current = {"state": {"email": "new@x"}}

    @compensators.state_reader("crm.update_contact.restore")
    def read(**fields):
        return current["state"]

    request = _request(
        tool="crm.update_contact.restore",
        strategy="snapshot",
        args={"email": "old@x"},
        before_snapshot={"email": "old@x"},
        after_snapshot={"email": "new@x"},
    )
    assert compensators.execute(request, tenant_id=tenant.pk).kind == "done"
    assert restored == [{"email": "old@x"}]

    current["state"] = {"email": "edited-by-a-human@x"}
    drift = compensators.execute(request, tenant_id=tenant.pk)
    assert drift.kind == "drifted" and len(restored) == 1  # nothing was overwritten

    # "Retry anyway": an operator overrides the drift check.
    forced = CompensationRequest(**{**request.__dict__, "override_drift": True})
    assert compensators.execute(forced, tenant_id=tenant.pk).kind == "done" and len(restored) == 2


def test_a_webhook_secret_may_come_from_the_environment(db, tenant, webhooks, monkeypatch):
    from ledger.models import Compensator

    Compensator.objects.create(
        tool="hr.delete_user", kind="webhook", url=webhooks.url(HR_PATH), secret_env="HR_SAGA_SECRET"
    )
    assert compensators.execute(_request(), tenant_id=tenant.pk).kind == "failed"  # unset: refuse unsigned
    monkeypatch.setenv("HR_SAGA_SECRET", HR_SECRET)
    assert compensators.execute(_request(), tenant_id=tenant.pk).kind == "done"
    assert webhooks.calls[-1].signature_ok
