"""Before- and after-images through the TypeScript client against a live server: a
policy file whose ``crm.update_contact`` reads its images with the read-only ``crm.get_contact``
is loaded for the agent's tenant, then the suites of ``clients/typescript/test/with-policies``
run: a registered reader's images on the action, a failed or empty read refusing the step
(``do`` never called, nothing recorded), a step's own ``before`` winning, and the OpenAI Agents
adapter taking the images through the agent's own read tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.audit import Actor
from ledger.models import Action, ToolPolicy
from ledger.policies.load import policies_load_file
from tests.support.typescript import Npm, report

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("typescript-client"),
]

POLICIES = {
    "policies": [
        {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"},
        {
            "tool": "crm.update_contact",
            "risk": "medium",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
            "compensation_tool": "crm.update_contact",
            "compensation_args": {"id": "$args.id", "email": "$before.email"},
        },
    ]
}


def test_the_typescript_client_takes_before_and_after_images_by_policy(
    npm: Npm, live_server, tenant, agent_key, tmp_path: Path
):
    path = tmp_path / "crm.json"
    path.write_text(json.dumps(POLICIES))
    policies_load_file(path=path, tenant=tenant, actor=Actor.system("tests"))
    assert ToolPolicy.objects.get(tenant=tenant, tool="crm.update_contact").before is not None

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
            "SAGA_VITEST_INCLUDE": "test/with-policies/*.test.ts",
        },
        timeout=500,
    )
    assert done.returncode == 0, report(done)
    summary = json.loads(results.read_text("utf-8"))
    assert summary["numFailedTests"] == 0 and summary["numPendingTests"] == 0, report(done)
    assert summary["numPassedTests"] == 4, report(done)

    # What the server kept: every recorded update has both images, and none was recorded without.
    updates = Action.objects.filter(tool="crm.update_contact")
    assert updates.count() == 3, list(updates.values("status", "before_snapshot"))
    assert all(a.status == "succeeded" for a in updates)
    assert all(a.before_snapshot and a.after_snapshot for a in updates)
    assert not Action.objects.filter(tool="crm.get_contact").exists()  # a read is not a step
