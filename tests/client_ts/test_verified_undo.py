"""Verified undo of an update through the TypeScript client and its OpenAI Agents adapter, end to
end: the CRM (``tests/support/mcp_crm.py``, its contacts in a state file) serves the
agent over plain HTTP and the worker over MCP; the policy file, loaded with the real loader, has
``crm.update_contact`` read its images with ``crm.get_contact`` and be undone with
``$before.email``/``$before.phone`` by the CRM's MCP ``update_contact``, with an MCP reader for the
drift check and the read-back; a real ``saga_worker`` process carries each unwind out. The agents
and the operator's compensations run in ``clients/typescript/test/verified-undo``; what the server
and the worker kept is checked here too, per flow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.policies.load import policies_load_file
from recovery.models import RecoveryItem, UnwindStep
from tests.support.mcp_servers import answers
from tests.support.processes import free_port, wait_for
from tests.support.typescript import Npm, report

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("typescript-client"),
]

CRM_SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_crm.py"

_UNDO = {
    "risk": "medium",
    "action_class": "internal_update",
    "compensation": "custom",
    "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
    "compensation_tool": "crm.update_contact",
    "compensation_args": {"id": "$args.id", "email": "$before.email", "phone": "$before.phone"},
}


def _policies(mcp_url: str) -> dict[str, Any]:
    return {
        "policies": [
            {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"},
            {"tool": "crm.update_contact", "approval": "auto", **_UNDO},
            # The same update behind an approval: read again before it starts.
            {"tool": "crm.set_contact_email", "approval": "manual", **_UNDO},
        ],
        "compensators": {"crm.update_contact": {"mcp": mcp_url, "tool": "update_contact"}},
        "readers": {"crm.get_contact": {"mcp": mcp_url, "tool": "get_contact"}},
    }


class Crm:
    def __init__(self, root: Path) -> None:
        self.state_path = root / "crm-state.json"
        self.journal_path = root / "crm-journal.jsonl"
        self.log_path = root / "crm.log"
        self.base = ""

    def contact(self, contact_id: str) -> dict[str, Any]:
        return dict(json.loads(self.state_path.read_text())["contacts"][contact_id])

    def updates(self, contact_id: str) -> list[str]:
        """Who updated this contact, in order: "http" (the agent), "mcp" (the worker's undo)."""
        entries = map(json.loads, self.journal_path.read_text().splitlines())
        return [
            e.get("via", "mcp")
            for e in entries
            if e["tool"] == "update_contact" and e["args"]["id"] == contact_id
        ]


@pytest.fixture
def crm(tmp_path: Path) -> Iterator[Crm]:
    server = Crm(tmp_path)
    server.state_path.write_text(json.dumps({"contacts": {}, "ignore_updates": False}))
    server.journal_path.write_text("")
    port = free_port()
    server.base = f"http://127.0.0.1:{port}"
    env = {
        "CRM_STATE": str(server.state_path),
        "CRM_JOURNAL": str(server.journal_path),
        "PYTHONUNBUFFERED": "1",
    }
    with server.log_path.open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - the suite's own server
            [sys.executable, str(CRM_SERVER), "--http", f"127.0.0.1:{port}"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: answers(f"{server.base}/mcp"), timeout=30, what="the CRM MCP server")
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)


def _contact_of(run: Run) -> str:
    action = Action.objects.get(run=run, tool__in=["crm.update_contact", "crm.set_contact_email"])
    return str(action.args["id"])


def test_updates_through_the_typescript_client_and_its_adapter_are_undone_verified_by_the_worker(
    npm: Npm,
    live_server,
    tenant,
    agent_key,
    operator_key,
    approver_key,
    crm: Crm,
    start_worker,
    tmp_path: Path,
):
    path = tmp_path / "crm-policies.json"
    path.write_text(json.dumps(_policies(f"{crm.base}/mcp")))
    policies_load_file(path=path, tenant=tenant, actor=Actor.system("tests"))
    worker = start_worker()

    results = tmp_path / "vitest.json"
    done = npm.npx(
        "vitest",
        "run",
        "--reporter=default",
        "--reporter=json",
        f"--outputFile.json={results}",
        env={
            "SAGA_URL": live_server.url,
            "SAGA_AGENT_KEY": agent_key[1],
            "SAGA_OPERATOR_KEY": operator_key[1],
            "SAGA_APPROVER_KEY": approver_key[1],
            "CRM_URL": crm.base,
            "CRM_STATE": str(crm.state_path),
            "CRM_JOURNAL": str(crm.journal_path),
            "SAGA_VITEST_INCLUDE": "test/verified-undo/*.test.ts",
        },
        timeout=800,
    )
    story = f"\n--- worker ---\n{worker.log()[-8000:]}\n--- crm ---\n{crm.log_path.read_text()[-4000:]}"
    assert done.returncode == 0, report(done) + story
    summary = json.loads(results.read_text("utf-8"))
    assert summary["numFailedTests"] == 0 and summary["numPendingTests"] == 0, report(done)
    assert summary["numPassedTests"] == 10, report(done)

    cases = {
        (flow, via): run_id
        for flow, via, run_id in re.findall(r"UNDO_CASE (\w+) (\w+) (run_\w+)", done.stdout)
    }
    assert set(cases) == {
        *(
            (flow, via)
            for flow in ("exact", "drift", "not_restored", "refused")
            for via in ("client", "adapter")
        ),
        ("approval_changed", "client"),
        ("approval_changed", "adapter"),
    }, done.stdout

    # What the server and the worker kept, flow by flow.
    for via in ("client", "adapter"):
        exact = Run.objects.get(pk=cases["exact", via])
        contact = _contact_of(exact)
        step = UnwindStep.objects.get(unwind__run=exact)
        assert (exact.status, step.status, step.verified) == (
            Run.Status.COMPENSATED,
            UnwindStep.Status.DONE,
            True,
        )
        assert crm.contact(contact) == {"email": f"{contact}@old.example", "phone": "+1 555 0100"}
        assert crm.updates(contact) == ["http", "mcp"]

        drifted = Run.objects.get(pk=cases["drift", via])
        contact = _contact_of(drifted)
        step = UnwindStep.objects.get(unwind__run=drifted)
        assert (step.status, step.verified) == (UnwindStep.Status.DRIFTED, None)
        assert drifted.status != Run.Status.COMPENSATED
        assert RecoveryItem.objects.get(run=drifted).reason == RecoveryItem.Reason.STATE_DRIFT
        assert crm.contact(contact)["email"] == "ana@fixed-by-hand.example"
        assert crm.updates(contact) == ["http"]  # the compensator was never called

        ignored = Run.objects.get(pk=cases["not_restored", via])
        step = UnwindStep.objects.get(unwind__run=ignored)
        assert (step.status, step.verified) == (UnwindStep.Status.FAILED, False)
        assert ignored.status != Run.Status.COMPENSATED
        assert RecoveryItem.objects.get(run=ignored).reason == RecoveryItem.Reason.NOT_RESTORED

        refused = Run.objects.get(pk=cases["refused", via])
        assert refused.status == Run.Status.FAILED and not refused.actions.exists()

    for via in ("client", "adapter"):
        waited = Run.objects.get(pk=cases["approval_changed", via])
        [action] = waited.actions.all()
        assert action.status == Action.Status.APPROVED and action.started_at is None, action.status
        assert waited.status == Run.Status.FAILED
        assert crm.updates(str(action.args["id"])) == []
