"""The TypeScript client (``clients/typescript``, npm package ``@saga-admin/client``) built and
tested from the Python suite, so ``make test`` runs it: ``npm ci`` from the committed lockfile,
``tsc --strict``, then its vitest suite against a live server with a real worker — the onboarding
saga compensated newest first, replayed steps, approvals both ways, an operator's cancel, the key,
signature and error vectors, and the adapters' examples with scripted models."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ledger.models import Run
from tests.factories import HR_PATH, WS_PATH, load_onboarding_policies
from tests.support.typescript import PACKAGE, Npm, report

# One xdist worker runs them all: they share clients/typescript (its node_modules and dist).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("typescript-client"),
]


def _worker_story(log: str) -> str:
    """What the worker did about unwinds and what went wrong, out of its whole log."""
    lines = [
        line
        for line in log.splitlines()
        if re.search(r"unwind|compensat|warning|error|Traceback", line, re.IGNORECASE)
    ]
    return "\n--- worker (unwinds, warnings, errors) ---\n" + "\n".join(lines[-80:])


def test_the_package_type_checks_strictly_and_its_generated_types_are_current(npm: Npm, tmp_path: Path):
    checked = npm.npx("tsc", "--noEmit", "--strict", "-p", "tsconfig.json")
    assert checked.returncode == 0, report(checked)
    # What integrators compile with (`exactOptionalPropertyTypes` too): interface-typed step args
    # are taken, what is not a JSON object is refused (`// @ts-expect-error` in test/types).
    types = npm.npx("tsc", "-p", "tsconfig.types.json")
    assert types.returncode == 0, report(types)
    # The API's types are openapi-typescript's output for the committed document, never edited.
    fresh = tmp_path / "openapi.ts"
    generated = npm.npx("openapi-typescript", "../spec/openapi.json", "-o", str(fresh))
    assert generated.returncode == 0, report(generated)
    committed = (PACKAGE / "src" / "generated" / "openapi.ts").read_text("utf-8")
    assert fresh.read_text("utf-8") == committed, "run `npm run generate` in clients/typescript"


def test_the_typescript_suite_passes_against_a_live_server(
    npm: Npm,
    live_server,
    agent_key,
    operator_key,
    approver_key,
    webhooks,
    start_worker,
    tmp_path: Path,
):
    load_onboarding_policies(webhooks=webhooks)
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
        },
        timeout=800,
    )
    assert done.returncode == 0, report(done) + _worker_story(worker.log())
    summary = json.loads(results.read_text("utf-8"))
    # Every suite ran against the server: none skipped for want of one.
    assert summary["numFailedTests"] == 0 and summary["numPendingTests"] == 0, report(done)
    assert summary["numPassedTests"] >= 90, summary["numPassedTests"]

    # The onboarding saga's compensation: the workers called the license's compensator before the
    # user's (newest first), each once, signed, for the run the TypeScript agent failed.
    (run_id,) = re.findall(r"ONBOARDING_COMPENSATED (run_\w+)", done.stdout)
    calls = [c for c in webhooks.calls if c.body.get("run_id") == run_id]
    assert [c.path for c in calls] == [WS_PATH, HR_PATH], _worker_story(worker.log())
    assert all(c.signature_ok for c in calls)


def test_the_packed_package_installs_alone_into_an_empty_project_and_its_example_runs(
    npm: Npm, live_server, agent_key, onboarding_policies, tmp_path: Path
):
    # Before `npm ci` (a fresh checkout) packing says what to do, not `tsc: not found`.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(PACKAGE / "package.json", bare / "package.json")
    unready = npm.run(npm.npm, "run", "-s", "prepack", cwd=bare)
    assert unready.returncode != 0 and "run npm ci first (then npm pack)" in unready.stderr, report(unready)
    # `npm pack` right after `npm ci` (the fixture), as from a fresh checkout: nothing built
    # beforehand, so its `prepack` builds `dist` (ESM and CommonJS) with the locked tsc.
    shutil.rmtree(PACKAGE / "dist", ignore_errors=True)
    packed = npm.run(npm.npm, "pack", "--json", "--pack-destination", str(tmp_path))
    assert packed.returncode == 0, report(packed)
    (manifest,) = json.loads(packed.stdout)
    tarball = tmp_path / manifest["filename"]
    files = {f["path"] for f in manifest["files"]}
    assert "LICENSE" in files  # Apache-2.0 (tests/test_licence.py)
    assert {"dist/index.js", "dist/index.d.ts", "dist/cjs/index.js", "dist/cjs/package.json"} <= files, (
        sorted(files)
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "empty", "private": True, "type": "module"}))
    # Offline: the package needs nothing from the registry (no runtime dependency, optional peers).
    installed = npm.run(npm.npm, "install", "--offline", "--no-audit", "--no-fund", str(tarball), cwd=project)
    assert installed.returncode == 0, report(installed)
    assert sorted(p.name for p in (project / "node_modules").iterdir()) == [
        ".package-lock.json",
        "@saga-admin",
    ]

    example = project / "onboarding.mjs"
    example.write_text((PACKAGE / "examples" / "onboarding.mjs").read_text("utf-8"))
    ran = npm.run(
        "node", str(example), cwd=project, env={"SAGA_URL": live_server.url, "SAGA_AGENT_KEY": agent_key[1]}
    )
    assert ran.returncode == 0, report(ran)
    (run_id,) = re.findall(r"run (run_\w+) completed", ran.stdout)
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded"
    assert list(run.actions.order_by("seq").values_list("tool", "status")) == [
        ("hr.create_user", "succeeded"),
        ("workspace.provision_license", "succeeded"),
        ("email.send_welcome", "succeeded"),
    ]
    # The adapters load without their frameworks installed (they import only their types).
    adapters = npm.run(
        "node",
        "--input-type=module",
        "-e",
        "const ai = await import('@saga-admin/client/ai'); const oa = await import('@saga-admin/client/openai-agents');"
        "console.log(typeof ai.sagaTool, typeof oa.sagaFunctionTool)",
        cwd=project,
    )
    assert adapters.returncode == 0 and adapters.stdout.split() == ["function", "function"], report(adapters)

    # CommonJS: `require` gets the same client (its own build), and a tool of either build sees a
    # run scope of the other (one process, one active-run store).
    required = npm.run("node", "--input-type=commonjs", "-e", _REQUIRE_CHECK, cwd=project)
    assert required.returncode == 0, report(required)
    expected = ["function", "function", "function", "SagaConfigError:url", "run_cjs", "run_cjs"]
    assert required.stdout.split() == expected, report(required)


# Run in the empty project that installed the tarball: the CommonJS entries, and one run scope seen
# from both builds (a scripted `fetch` stands in for the server).
_REQUIRE_CHECK = """
const client = require("@saga-admin/client");
const ai = require("@saga-admin/client/ai");
const oa = require("@saga-admin/client/openai-agents");
console.log(typeof client.Saga, typeof ai.sagaTool, typeof oa.sagaFunctionTool);
try { new client.Saga({ key: "sk_test" }); } catch (e) { console.log(`${e.name}:${e.option}`); }
const answer = async (url, init) => {
  const created = init.method === "POST" && String(url).endsWith("/runs");
  const body = JSON.stringify({ id: "run_cjs", status: created ? "running" : "succeeded" });
  return new Response(body, { status: 200, headers: { "Content-Type": "application/json" } });
};
const saga = new client.Saga({ url: "http://saga.invalid", key: "sk_test", fetch: answer, heartbeatIntervalS: 0 });
import("@saga-admin/client").then((esm) =>
  saga.run({ agent: "a", request: "r" }, async () => [client.currentRun()?.id, esm.currentRun()?.id]),
).then((ids) => console.log(ids.join(" ")), (e) => { console.error(e); process.exit(1); });
"""
