"""Readers: before an undo step the worker reads the target's value through the action's reader
(drift check), after it reads it back (verification). Real parts: a CRM MCP server (the SDK's,
over Streamable HTTP, structured and text-only reads), a signed webhook reader on a real HTTP
server, a Python reader; the update recorded through the real API with its images; the unwind
carried out by the worker's own jobs (in this process), the compensator an MCP tool on the CRM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from infra.signing import verify_signature
from ledger.audit import Actor
from ledger.models import Run, StateReader
from ledger.policies.load import policy_file_load, policy_file_parse
from recovery import compensators, jobs
from recovery.actions.compensations import step_retry, unwind_start
from recovery.models import RecoveryItem, Unwind, UnwindStep
from recovery.trail import run_trail
from tests.support.api import Api
from tests.support.mcp_servers import answers
from tests.support.processes import free_port, http_serving, wait_for, work_under_way

CRM_SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_crm.py"
READER_SECRET = "reader-secret-0123456789abcdef"
ORIGINAL = {"id": "c-9", "email": "ana@old.example", "phone": "+1 555 0100"}


# --- The CRM: an MCP server over a state file ---------------------------------------------------


class Crm:
    def __init__(self, root: Path) -> None:
        self.state_path = root / "crm-state.json"
        self.journal_path = root / "crm-journal.jsonl"
        self.url = ""
        self.process: subprocess.Popen[bytes] | None = None

    def reset(self, *, ignore_updates: bool = False) -> None:
        self.state_path.write_text(
            json.dumps({"contacts": {"c-9": dict(ORIGINAL)}, "ignore_updates": ignore_updates})
        )
        self.journal_path.write_text("")

    def contact(self) -> dict[str, Any]:
        return dict(json.loads(self.state_path.read_text())["contacts"]["c-9"])

    def edit_by_hand(self, **fields: str) -> None:
        state = json.loads(self.state_path.read_text())
        state["contacts"]["c-9"].update(fields)
        self.state_path.write_text(json.dumps(state))

    def calls(self, tool: str) -> list[dict[str, Any]]:
        lines = self.journal_path.read_text().splitlines()
        return [entry for entry in map(json.loads, lines) if entry["tool"] == tool]

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        """Call a tool as the agent did (through the SDK's client, Streamable HTTP)."""
        result = compensators._run_async(
            compensators._mcp_call_tool(url=self.url, tool=tool, args=args, headers={}, meta={}, timeout_s=10)
        )
        assert not result.is_error, result
        return result.structured_content


@pytest.fixture(scope="module")
def crm(tmp_path_factory) -> Iterator[Crm]:
    root = tmp_path_factory.mktemp("crm")
    server = Crm(root)
    server.reset()
    port = free_port()
    server.url = f"http://127.0.0.1:{port}/mcp"
    env = {
        "CRM_STATE": str(server.state_path),
        "CRM_JOURNAL": str(server.journal_path),
        "PYTHONUNBUFFERED": "1",
    }
    with (root / "crm.log").open("ab") as log:
        server.process = subprocess.Popen(
            [sys.executable, str(CRM_SERVER), "--http", f"127.0.0.1:{port}"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: answers(server.url), timeout=30, what="the CRM MCP server")
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


@pytest.fixture(autouse=True)
def _fresh(crm, settings):
    crm.reset()
    # Retries without waiting: the engine's backoff is not what these tests are about.
    settings.SAGA = {**settings.SAGA, "RETRY_BACKOFF_BASE_S": 0.0, "RETRY_BACKOFF_MAX_S": 0.0}
    _PYTHON_READER["crm"] = crm
    yield


# --- A signed webhook reader and a Python reader, both over the CRM's state ---------------------


class WebhookReader:
    def __init__(self, crm: Crm) -> None:
        self.crm = crm
        self.calls: list[dict[str, Any]] = []
        self.outage = False
        # Statuses to answer the next calls with, in order (then 503 in an outage, else 200).
        self.replies: list[int] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/read"


@pytest.fixture
def webhook_reader(crm) -> Iterator[WebhookReader]:
    reader = WebhookReader(crm)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ok = verify_signature(READER_SECRET, dict(self.headers.items()), raw)
            body = json.loads(raw or b"{}")
            reader.calls.append({"body": body, "signature_ok": ok})
            if not ok:
                self._reply(401, {"error": "bad signature"})
            elif (reader.replies.pop(0) if reader.replies else 503 if reader.outage else 200) != 200:
                self._reply(503, {"error": "the CRM is down"})
            else:
                self._reply(200, {"state": {"contact": reader.crm.contact()}})

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return

    with http_serving(Handler) as port:
        reader.port = port
        yield reader


_PYTHON_READER: dict[str, Any] = {}


def python_reader(*, tool: str, args: dict[str, Any], tenant: str, run_id: str, action_id: str) -> Any:
    """A Python reader (the policy file names it by its dotted path)."""
    assert tool == "crm.get_contact" and tenant == "acme" and run_id and action_id
    crm: Crm = _PYTHON_READER["crm"]
    assert args == {"id": "c-9"}
    return {"contact": crm.contact()}


# --- The policy, the recorded update, the unwind ------------------------------------------------


def _load(tenant, crm: Crm, reader: dict[str, Any]) -> None:
    document = policy_file_parse(
        {
            "policies": [
                {
                    "tool": "crm.get_contact",
                    "risk": "low",
                    "approval": "auto",
                    "action_class": "read_only",
                    "compensation": "none",
                },
                {
                    "tool": "crm.update_contact",
                    "risk": "medium",
                    "approval": "auto",
                    "action_class": "internal_update",
                    "compensation": "custom",
                    "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
                    "compensation_tool": "crm.update_contact",
                    "compensation_args": {
                        "id": "$args.id",
                        "email": "$before.email",
                        "phone": "$before.phone",
                    },
                },
            ],
            "compensators": {"crm.update_contact": {"mcp": crm.url, "tool": "update_contact"}},
            "readers": {"crm.get_contact": reader},
        }
    )
    policy_file_load(document=document, source="test", tenant=tenant, actor=Actor.system("test"))


def _record_update(api: Api, crm: Crm, *, email: str, target: bool = True) -> dict[str, Any]:
    """The agent's update of contact c-9, recorded through the API with both images (what a client
    or the gateway sends), and the run failed into the queue. ``target=False``: recorded without
    one, as saga-mcp and the adapters record calls."""
    run = api.post("/runs", {"agent": "crm-agent", "request": "fix Ana's email"}).json()
    before = crm.call("get_contact", {"id": "c-9"})["contact"]
    response = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "crm.update_contact",
            **({"target_type": "contact", "target_id": "c-9"} if target else {}),
            "args": {"id": "c-9", "email": email},
            "idempotency_key": f"update-c-9-{email}",
            "before_snapshot": before,
        },
    )
    assert response.status_code == 201, response.content
    action = response.json()
    assert api.post(f"/actions/{action['id']}/start").status_code == 200
    crm.call("update_contact", {"id": "c-9", "email": email})
    after = crm.call("get_contact", {"id": "c-9"})["contact"]
    succeeded = api.post(
        f"/actions/{action['id']}/succeed", {"result": {"updated": True}, "after_snapshot": after}
    )
    assert succeeded.status_code == 200, succeeded.content
    failed = api.post(f"/runs/{run['id']}/fail", {"error": "the agent updated the wrong contact"})
    assert failed.status_code == 200, failed.content
    return run


def _undo(run: dict[str, Any], alice) -> Unwind:
    """The operator compensates; the worker's jobs carry the unwind out (retries run at once)."""
    item = RecoveryItem.objects.get(run_id=run["id"])
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the wrong update")
    jobs.unwind_advance(unwind_id=unwind.pk)
    for _ in range(20):
        unwind.refresh_from_db()
        if unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED):
            return unwind
        for step in unwind.steps.filter(status=UnwindStep.Status.QUEUED):
            jobs.step_run(step_id=step.pk)
    raise AssertionError(f"unwind {unwind.pk} did not finish: {list(unwind.steps.values('status', 'error'))}")


@pytest.fixture
def api(agent_key) -> Api:
    return Api(agent_key[1])


def _reader(kind: str, crm: Crm, webhook_reader: WebhookReader | None = None) -> dict[str, Any]:
    if kind == "mcp":
        return {"mcp": crm.url, "tool": "get_contact"}
    if kind == "mcp-text":
        return {"mcp": crm.url, "tool": "get_contact_text"}
    if kind == "webhook":
        assert webhook_reader is not None
        return {"webhook": webhook_reader.url, "secret": READER_SECRET}
    return {"python": "tests.recovery.test_readers.python_reader"}


KINDS = ["mcp", "mcp-text", "webhook", "python"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_update_is_undone_exactly_and_verified(
    db, tenant, api, operator_key, alice, crm, webhook_reader, kind
):
    _load(tenant, crm, _reader(kind, crm, webhook_reader))
    run = _record_update(api, crm, email="ana@wrong.example")
    assert crm.contact()["email"] == "ana@wrong.example"

    unwind = _undo(run, alice)

    assert unwind.status == Unwind.Status.COMPLETED
    assert crm.contact() == ORIGINAL
    [step] = unwind.steps.all()
    assert step.status == UnwindStep.Status.DONE and step.verified is True
    checks = step.read_checks
    assert checks["now"]["email"] == "ana@wrong.example"
    assert checks["read_back"] == ORIGINAL and checks["differences"] == []
    assert [(r["phase"], r["tool"], r["ok"]) for r in checks["reads"]] == [
        ("drift", "crm.get_contact", True),
        ("verify", "crm.get_contact", True),
    ]
    assert {r["kind"] for r in checks["reads"]} == {"python" if kind == "python" else kind.split("-")[0]}
    assert all(r["error"] == "" and r["ms"] >= 0 and r["at"] for r in checks["reads"])
    assert Run.objects.get(pk=run["id"]).status == Run.Status.COMPENSATED
    [restored] = run_trail(run=Run.objects.get(pk=run["id"]))["restored"]
    assert restored["verified"] is True
    # The API shows the step's verdict and checks, and the trail's.
    assert api.get(f"/runs/{run['id']}/trail").json()["restored"][0]["verified"] is True
    shown_unwind = Api(operator_key[1]).get(f"/unwinds/{unwind.pk}")
    assert shown_unwind.status_code == 200, shown_unwind.content
    [shown] = shown_unwind.json()["steps"]
    assert shown["verified"] is True and shown["read_checks"] == checks
    if kind == "webhook":
        assert all(call["signature_ok"] for call in webhook_reader.calls)
        assert webhook_reader.calls[0]["body"] == {
            "tool": "crm.get_contact",
            "args": {"id": "c-9"},
            "tenant": "acme",
            "run_id": run["id"],
            "action_id": step.action_id,
        }


@pytest.mark.parametrize("kind", ["mcp", "webhook", "python"])
def test_a_hand_edit_after_the_agent_is_drift_and_the_compensator_is_not_called(
    db, tenant, api, alice, crm, webhook_reader, kind
):
    _load(tenant, crm, _reader(kind, crm, webhook_reader))
    run = _record_update(api, crm, email="ana@wrong.example")
    crm.edit_by_hand(email="ana@fixed-by-hand.example")
    updates_before = len(crm.calls("update_contact"))

    unwind = _undo(run, alice)

    assert unwind.status == Unwind.Status.FAILED
    # Not clobbered: the hand edit stands, and the undo tool was never called.
    assert crm.contact()["email"] == "ana@fixed-by-hand.example"
    assert len(crm.calls("update_contact")) == updates_before
    [step] = unwind.steps.all()
    assert step.status == UnwindStep.Status.DRIFTED and step.verified is None
    assert step.read_checks["now"]["email"] == "ana@fixed-by-hand.example"
    assert step.read_checks["differences"] == [
        {"path": "email", "expected": "ana@wrong.example", "actual": "ana@fixed-by-hand.example"}
    ]
    assert [r["phase"] for r in step.read_checks["reads"]] == ["drift"]
    item = RecoveryItem.objects.get(run_id=run["id"])
    assert item.reason == RecoveryItem.Reason.STATE_DRIFT
    sentence = (
        'contact c-9 changed since the agent: email is "ana@fixed-by-hand.example", not '
        '"ana@wrong.example"; the undo was not run so as not to overwrite it.'
    )
    assert sentence in item.error
    assert step.error == sentence
    assert Run.objects.get(pk=run["id"]).status != Run.Status.COMPENSATED


def test_the_sentences_of_an_action_recorded_without_a_target_name_what_the_read_reads(
    db, tenant, api, alice, crm
):
    _load(tenant, crm, _reader("mcp", crm))
    run = _record_update(api, crm, email="ana@wrong.example", target=False)
    crm.edit_by_hand(email="ana@fixed-by-hand.example")

    unwind = _undo(run, alice)

    step = unwind.steps.get()
    assert step.status == UnwindStep.Status.DRIFTED
    assert step.error == (
        'the contact read by crm.get_contact {"id": "c-9"} changed since the agent: email is '
        '"ana@fixed-by-hand.example", not "ana@wrong.example"; the undo was not run so as not to '
        "overwrite it."
    )
    assert step.error in RecoveryItem.objects.get(run_id=run["id"]).error


@pytest.mark.parametrize("kind", ["mcp", "mcp-text", "webhook", "python"])
def test_an_undo_acknowledged_but_not_applied_is_not_restored(
    db, tenant, api, alice, crm, webhook_reader, kind
):
    _load(tenant, crm, _reader(kind, crm, webhook_reader))
    run = _record_update(api, crm, email="ana@wrong.example")
    state = json.loads(crm.state_path.read_text())
    crm.state_path.write_text(json.dumps({**state, "ignore_updates": True}))

    unwind = _undo(run, alice)

    assert unwind.status == Unwind.Status.FAILED
    assert len(crm.calls("update_contact")) == 2  # the agent's, and the undo's one call: not retried
    [step] = unwind.steps.all()
    assert step.status == UnwindStep.Status.FAILED and step.verified is False and step.attempts == 1
    assert step.read_checks["read_back"]["email"] == "ana@wrong.example"
    assert step.read_checks["differences"] == [
        {"path": "email", "expected": "ana@old.example", "actual": "ana@wrong.example"}
    ]
    assert [r["phase"] for r in step.read_checks["reads"]] == ["drift", "verify"]
    assert Run.objects.get(pk=run["id"]).status != Run.Status.COMPENSATED
    assert run_trail(run=Run.objects.get(pk=run["id"]))["restored"] == []
    item = RecoveryItem.objects.get(run_id=run["id"])
    assert item.reason == RecoveryItem.Reason.NOT_RESTORED
    assert (
        'contact c-9 did not come back after the undo: email is "ana@wrong.example", not "ana@old.example"'
        in (item.error)
    )
    # The audit says why, with the code.
    event = step.unwind.run.events.filter(kind="step.failed").latest("id")
    assert event.data["code"] == "not_restored" and event.data["verified"] is False


def test_a_reader_outage_is_retried_then_fails_without_calling_the_compensator(
    db, tenant, api, alice, crm, webhook_reader
):
    _load(tenant, crm, _reader("webhook", crm, webhook_reader))
    run = _record_update(api, crm, email="ana@wrong.example")
    webhook_reader.outage = True
    updates_before = len(crm.calls("update_contact"))

    unwind = _undo(run, alice)

    assert unwind.status == Unwind.Status.FAILED
    [step] = unwind.steps.all()
    assert step.status == UnwindStep.Status.FAILED and step.attempts == step.max_attempts > 1
    assert step.error.startswith(
        f"Gave up after {step.max_attempts} attempts: Reading the value before the undo"
    )
    assert "the webhook reader of crm.get_contact answered 503" in step.error
    assert webhook_reader.url not in step.error and str(webhook_reader.port) not in step.error
    reads = step.read_checks["reads"]
    assert len(reads) == step.max_attempts and {(r["phase"], r["ok"]) for r in reads} == {("drift", False)}
    assert len(crm.calls("update_contact")) == updates_before
    assert crm.contact()["email"] == "ana@wrong.example"
    assert RecoveryItem.objects.get(run_id=run["id"]).reason == RecoveryItem.Reason.COMPENSATION_FAILED


def test_a_refused_signature_fails_the_read_at_once(db, tenant, api, alice, crm, webhook_reader):
    _load(tenant, crm, {"webhook": webhook_reader.url, "secret": "not-the-readers-secret-0000"})
    run = _record_update(api, crm, email="ana@wrong.example")

    unwind = _undo(run, alice)

    [step] = unwind.steps.all()
    assert step.status == UnwindStep.Status.FAILED and step.attempts == 1
    assert "answered 401" in step.error
    assert crm.contact()["email"] == "ana@wrong.example"


def test_without_a_reader_the_undo_is_unverified_and_unchecked(db, tenant, api, alice, crm):
    _load(tenant, crm, {"python": "tests.recovery.test_readers.python_reader"})
    StateReader.objects.filter(tenant=tenant).delete()
    run = _record_update(api, crm, email="ana@wrong.example")
    crm.edit_by_hand(phone="+1 555 0199")  # no drift check: nothing would notice

    unwind = _undo(run, alice)

    assert unwind.status == Unwind.Status.COMPLETED
    [step] = unwind.steps.all()
    assert step.verified is None and step.read_checks is None
    [restored] = run_trail(run=Run.objects.get(pk=run["id"]))["restored"]
    assert restored["verified"] is False
    assert Run.objects.get(pk=run["id"]).status == Run.Status.COMPENSATED


def test_an_earlier_attempt_that_restored_the_value_is_not_undone_twice(
    db, tenant, api, alice, crm, webhook_reader
):
    # The compensator ran, then reading back failed (an outage): the next attempt finds the
    # before-image, so the step is done and verified without a second call.
    _load(tenant, crm, _reader("webhook", crm, webhook_reader))
    run = _record_update(api, crm, email="ana@wrong.example")
    webhook_reader.replies = [200, 503]  # the drift check reads, the read-back does not

    unwind = _undo(run, alice)

    assert unwind.status == Unwind.Status.COMPLETED
    step = unwind.steps.get()
    assert step.status == UnwindStep.Status.DONE and step.verified is True and step.attempts == 2
    assert len(crm.calls("update_contact")) == 2  # the agent's and one undo
    assert [(r["phase"], r["ok"]) for r in step.read_checks["reads"]] == [
        ("drift", True),
        ("verify", False),
        ("drift", True),
    ]
    assert step.read_checks["read_back"] == ORIGINAL
    assert Run.objects.get(pk=run["id"]).status == Run.Status.COMPENSATED


def test_retry_anyway_after_a_drift_skips_the_drift_check_and_still_verifies(
    db, tenant, api, alice, crm, webhook_reader
):
    _load(tenant, crm, _reader("webhook", crm, webhook_reader))
    run = _record_update(api, crm, email="ana@wrong.example")
    crm.edit_by_hand(email="ana@fixed-by-hand.example")
    unwind = _undo(run, alice)
    step = unwind.steps.get()
    assert step.status == UnwindStep.Status.DRIFTED

    # The operator looked and chose to put the agent's before-image back anyway.
    step_retry(step=step, actor=Actor.for_user(alice), reason="the hand edit was a mistake too")
    jobs.unwind_advance(unwind_id=unwind.pk)
    for _ in range(5):
        step.refresh_from_db()
        if step.status != UnwindStep.Status.QUEUED:
            break
        jobs.step_run(step_id=step.pk)

    step.refresh_from_db()
    assert step.status == UnwindStep.Status.DONE and step.verified is True
    assert crm.contact() == ORIGINAL
    assert [r["phase"] for r in step.read_checks["reads"]] == ["drift", "verify"]
    assert Run.objects.get(pk=run["id"]).status == Run.Status.COMPENSATED


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_worker_checks_drift_and_verifies_through_an_mcp_reader(tenant, api, alice, crm, start_worker):
    """The same checks in a real ``saga_worker`` process: one run's undo verified, another's
    refused as drift (the hand edit kept)."""
    _load(tenant, crm, _reader("mcp-text", crm))
    undone = _record_update(api, crm, email="ana@wrong.example")
    worker = start_worker()

    item = RecoveryItem.objects.get(run_id=undone["id"])
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the wrong update")
    wait_for(
        lambda: Unwind.objects.filter(pk=unwind.pk, status=Unwind.Status.COMPLETED).exists(),
        timeout=60,
        what="the verified unwind",
        progress=work_under_way(worker.log_path),
    )
    step = unwind.steps.get()
    assert step.verified is True and crm.contact() == ORIGINAL
    assert Run.objects.get(pk=undone["id"]).status == Run.Status.COMPENSATED

    drifted = _record_update(api, crm, email="ana@second-wrong.example")
    crm.edit_by_hand(email="ana@fixed-by-hand.example")
    item = RecoveryItem.objects.get(run_id=drifted["id"])
    unwind = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the second update")
    wait_for(
        lambda: Unwind.objects.filter(pk=unwind.pk, status=Unwind.Status.FAILED).exists(),
        timeout=60,
        what="the drifted unwind",
        progress=work_under_way(worker.log_path),
    )
    assert unwind.steps.get().status == UnwindStep.Status.DRIFTED
    assert crm.contact()["email"] == "ana@fixed-by-hand.example"
    assert RecoveryItem.objects.get(run_id=drifted["id"]).reason == RecoveryItem.Reason.STATE_DRIFT
