"""A run that reads "compensated" is compensated.

A gateway records which upstream performed each call (``via``); an undo reaches it only through an
MCP compensator on that same upstream. Any other compensator — another MCP server, a webhook, a
Python callable, or any compensator of a stdio upstream — makes the step wait for a person, with
the mismatch shown in the plan, the approval, the audit, the policies page and ``load_policies``;
no automatic compensation starts, and a worker never calls such a compensator unapproved.

The headline tests run everything for real: the demo HR MCP server in subprocesses, ``saga-mcp
--namespace people`` as a real process in front of one of them (as docs/MCP.md walks a new user
through it, with the demo's policy file), Saga Admin over HTTP (the live server) and a real
worker.
"""

from __future__ import annotations

import asyncio
import json
from io import StringIO
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command
from mcp import Client

from ledger.audit import Actor
from ledger.models import Action, Compensator, Event, PolicySet, Run, ToolPolicy
from ledger.upstreams import upstream_key
from recovery.models import Approval, Unwind, UnwindStep
from recovery.unwinds.runner import step_run, unwind_advance
from tests.support.api import Api, error_of
from tests.support.mcp_servers import http_gateway, http_upstream
from tests.support.processes import ROOT, dump_worker_logs, wait_for

pytestmark = pytest.mark.timeout(180)

DEMO_POLICIES = ROOT / "demo" / "policies" / "native.json"
ASHU = "ashu@company.com"

# What the Python compensator below was asked to do, in this process.
python_calls: list[dict[str, Any]] = []


def delete_user(**fields: Any) -> dict[str, Any]:
    python_calls.append({"tool": fields["tool"], "args": fields["args"]})
    return {}


@pytest.fixture(autouse=True)
def _no_calls_yet() -> None:
    python_calls.clear()


# --- Over real processes ------------------------------------------------------------------------


def load_demo_policies(tenant: Any, tmp_path: Path, people_url: str) -> str:
    """The demo's policy file (docs/MCP.md: "Against make run, use --namespace people"), its
    ``people.*`` MCP compensators and readers pointed at ``people_url``; returns what the loader warned about
    upstreams (its other warnings, on the same stream, are about unattended compensations)."""
    data = json.loads(DEMO_POLICIES.read_text())
    for section in ("compensators", "readers"):
        for tool, spec in data[section].items():
            if tool.startswith("people."):
                spec["mcp"] = people_url
    path = tmp_path / "native.json"
    path.write_text(json.dumps(data))
    warnings = StringIO()
    call_command("load_policies", str(path), tenant=tenant.slug, stdout=StringIO(), stderr=warnings)
    return "\n".join(line for line in warnings.getvalue().splitlines() if "was performed on" in line)


async def onboarding_session(gateway_url: str) -> None:
    """A user is created through the gateway, then a licence the upstream refuses: the run fails."""
    async with Client(gateway_url, mode="legacy") as client:
        created = await client.call_tool("create_user", {"email": ASHU, "name": "Ashu Kumar"})
        assert not created.is_error, created
        refused = await client.call_tool("assign_license", {"email": ASHU, "sku": "enterprise-max"})
        assert refused.is_error


async def users_on(upstream_url: str) -> list[str]:
    async with Client(upstream_url, mode="legacy") as client:
        listed = await client.call_tool("list_users", {})
    return [user["email"] for user in (listed.structured_content or {})["users"]]


def _the_failed_run() -> Run | None:
    return Run.objects.filter(status=Run.Status.FAILED).first()


def _operator(live_server: Any, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def _record_a_failed_people_session(live_server: Any, agent_secret: str, people: Any, tmp_path: Path) -> Run:
    with http_gateway(live_server.url, people.url, agent_secret, tmp_path, namespace="people") as gateway:
        asyncio.run(onboarding_session(gateway))
    run = wait_for(_the_failed_run, timeout=30, what="the session's run to fail")
    created = run.actions.get(tool="people.create_user")
    # The action says which upstream performed it, and through what.
    assert created.via is not None and created.via["upstream"] == people.url
    assert created.via["gateway"].startswith("saga-mcp/")
    return run


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_undo_sent_to_another_mcp_server_waits_for_a_person_and_the_run_is_not_compensated(
    live_server, tenant, agent_key, operator_key, tmp_path, start_worker
):
    with http_upstream(tmp_path) as people, http_upstream(tmp_path) as elsewhere:
        # The policy's compensator for people.delete_user is another MCP server than the one the
        # gateway fronts.
        assert load_demo_policies(tenant, tmp_path, elsewhere.url) == ""
        run = _record_a_failed_people_session(live_server, agent_key[1], people, tmp_path)
        assert asyncio.run(users_on(people.url)) == [ASHU]

        worker = start_worker()
        with _operator(live_server, operator_key[1]) as operator:
            [item] = operator.get("/recovery", params={"run": run.pk}).json()["items"]
            plan = operator.get(f"/recovery/{item['id']}").json()["plan"]
            (step,) = plan["steps"]
            assert step["tool"] == "people.delete_user" and step["requires_approval"] is True
            assert step["upstream"]["performed_on"] == people.url
            assert step["upstream"]["compensator"] == elsewhere.url
            assert step["upstream"]["reaches"] is False
            assert "upstream mismatch" in step["note"]
            assert [w["code"] for w in plan["warnings"] if w["code"] == "upstream_mismatch"] == [
                "upstream_mismatch"
            ]
            started = operator.post(
                f"/recovery/{item['id']}/compensate", json={"reason": "the hire withdrew"}
            )
            assert started.status_code == 202, started.text

            def waiting_for_a_person() -> UnwindStep | None:
                found = UnwindStep.objects.filter(
                    unwind_id=started.json()["id"], status=UnwindStep.Status.AWAITING_APPROVAL
                ).first()
                return found

            try:
                waiting = wait_for(waiting_for_a_person, timeout=60, what="the step to wait for a person")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc

        # Nothing was sent anywhere; the user still exists where it was created, and the run does
        # not claim otherwise.
        assert [c["tool"] for c in elsewhere.calls()] == []
        assert asyncio.run(users_on(people.url)) == [ASHU]
        run.refresh_from_db()
        assert run.status == Run.Status.COMPENSATING
        assert Unwind.objects.get(pk=waiting.unwind_id).status == Unwind.Status.PAUSED
        assert Approval.objects.get(step=waiting).status == Approval.Status.PENDING
        [audited] = Event.objects.filter(run_id=run.pk, kind="unwind.started")
        [mismatch] = audited.data["upstream_mismatch"]
        assert (mismatch["performed_on"], mismatch["compensator"]) == (people.url, elsewhere.url)

        # Loading the file again now warns about the pair, from the recorded action's upstream.
        warned = load_demo_policies(tenant, tmp_path, elsewhere.url)
        assert "people.create_user was performed on " + people.url in warned
        assert elsewhere.url in warned


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_an_undo_on_the_upstream_that_performed_the_call_runs_unattended_and_is_undone_for_real(
    live_server, tenant, agent_key, operator_key, tmp_path, start_worker
):
    with http_upstream(tmp_path) as people:
        # The same upstream, written as another spelling of its URL: still the same server.
        same = people.url.replace("/mcp", "/mcp/").replace("http://", "HTTP://")
        assert load_demo_policies(tenant, tmp_path, same) == ""
        run = _record_a_failed_people_session(live_server, agent_key[1], people, tmp_path)

        worker = start_worker()
        with _operator(live_server, operator_key[1]) as operator:
            [item] = operator.get("/recovery", params={"run": run.pk}).json()["items"]
            (step,) = operator.get(f"/recovery/{item['id']}").json()["plan"]["steps"]
            assert step["upstream"]["reaches"] is True and step["requires_approval"] is False
            started = operator.post(f"/recovery/{item['id']}/compensate", json={"reason": "withdrawn"})
            assert started.status_code == 202, started.text

            def finished() -> dict | None:
                unwind = operator.get(f"/unwinds/{started.json()['id']}").json()
                return unwind if unwind["status"] in ("completed", "failed") else None

            try:
                unwind = wait_for(finished, timeout=60, what="the unwind to finish")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
        assert unwind["status"] == "completed", unwind
        assert [(c["tool"], c["args"]) for c in people.calls() if c["tool"] == "delete_user"] == [
            ("delete_user", {"email": ASHU})
        ]
        assert asyncio.run(users_on(people.url)) == []
        run.refresh_from_db()
        assert run.status == Run.Status.COMPENSATED


# --- The rule, in process -------------------------------------------------------------------------

PEOPLE_URL = "http://127.0.0.1:8765/mcp"
VIA = {"gateway": "saga-mcp/1.0", "upstream": PEOPLE_URL}


@pytest.fixture
def people_policies(db: Any) -> None:
    """people.create_user is undone by people.delete_user (automatic, medium risk), served by the
    MCP server at PEOPLE_URL; automatic compensation is on up to medium risk."""
    for tool, compensation_tool in (("people.create_user", "people.delete_user"), ("people.delete_user", "")):
        ToolPolicy.objects.create(
            tool=tool,
            risk="medium",
            approval="auto",
            action_class="internal_update",
            compensation="custom" if compensation_tool else "none",
            compensation_tool=compensation_tool,
            compensation_args={"email": "$args.email"} if compensation_tool else None,
            source="tests/security",
        )
    Compensator.objects.create(tool="people.delete_user", kind="mcp", url=PEOPLE_URL, mcp_tool="delete_user")
    PolicySet.objects.create(
        tenant=None, default_policy={}, auto_compensate={"max_risk": "medium"}, unwind={}, source="tests"
    )


def _record(agent: Api, run_id: str, key: str, **extra: Any) -> Any:
    return agent.post(
        f"/runs/{run_id}/actions",
        {"tool": "people.create_user", "args": {"email": ASHU}, "idempotency_key": key, **extra},
    )


def _succeeded_run(agent: Api, via: dict[str, str] | None) -> tuple[str, str]:
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "hire"}).json()["id"]
    response = _record(agent, run_id, f"k-{run_id}", start=True, **({"via": via} if via else {}))
    assert response.status_code == 201, response.content
    agent.post(f"/actions/{response.json()['id']}/succeed", {"result": {"user_id": "u1"}})
    return run_id, response.json()["id"]


def _plan_step(operator: Api, agent: Api, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    failed = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()
    plan = operator.get(f"/recovery/{failed['recovery_item']['id']}").json()["plan"]
    return failed, plan["steps"][0]


@pytest.mark.parametrize(
    ("compensator", "upstream"),
    [
        pytest.param(
            {"kind": "mcp", "url": "http://127.0.0.1:9999/mcp", "mcp_tool": "delete_user"},
            PEOPLE_URL,
            id="another-mcp-server",
        ),
        pytest.param(
            {"kind": "mcp", "url": "http://127.0.0.1:8765/other", "mcp_tool": "delete_user"},
            PEOPLE_URL,
            id="another-path",
        ),
        pytest.param(
            {"kind": "webhook", "url": "https://hr.example/saga", "secret": "s"}, PEOPLE_URL, id="webhook"
        ),
        pytest.param({"kind": "python", "python_path": f"{__name__}.delete_user"}, PEOPLE_URL, id="python"),
        pytest.param(
            {"kind": "mcp", "url": PEOPLE_URL, "mcp_tool": "delete_user"},
            "python people_mcp.py",
            id="stdio-upstream",
        ),
    ],
)
def test_a_compensator_that_does_not_reach_the_upstream_needs_a_person_and_no_auto_compensation_starts(
    people_policies, agent_key, operator_key, compensator, upstream
):
    Compensator.objects.filter(tool="people.delete_user").update(
        **{"url": "", "python_path": "", "mcp_tool": "", "secret": "", **compensator}
    )
    agent, operator = Api(agent_key[1]), Api(operator_key[1])
    run_id, action_id = _succeeded_run(agent, {**VIA, "upstream": upstream})
    failed, step = _plan_step(operator, agent, run_id)
    # Medium risk, an automatic compensating tool, auto-compensation on up to medium: it would
    # have been undone unattended. The mismatch withholds it.
    assert failed["unwind"] is None
    assert step["requires_approval"] is True and step["upstream"]["reaches"] is False
    assert step["upstream"]["performed_on"] == upstream and "upstream mismatch" in step["note"]


@pytest.mark.parametrize(
    "spelling",
    [
        "http://127.0.0.1:8765/mcp",
        "http://127.0.0.1:8765/mcp/",
        "HTTP://127.0.0.1:8765/mcp",
        "http://u:pw@127.0.0.1:8765/mcp?x=1",
    ],
)
def test_an_mcp_compensator_on_the_same_upstream_reaches_it_and_auto_compensation_still_runs(
    people_policies, agent_key, operator_key, spelling
):
    Compensator.objects.filter(tool="people.delete_user").update(url=spelling)
    agent = Api(agent_key[1])
    run_id, _ = _succeeded_run(agent, VIA)
    failed = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()
    assert failed["unwind"] is not None and failed["unwind"]["automatic"] is True
    (step,) = Unwind.objects.get(pk=failed["unwind"]["id"]).plan["steps"]
    assert step["upstream"]["reaches"] is True and step["requires_approval"] is False


def test_an_action_without_via_is_planned_as_before(people_policies, agent_key, operator_key):
    Compensator.objects.filter(tool="people.delete_user").update(url="http://127.0.0.1:9999/mcp")
    agent = Api(agent_key[1])
    run_id, action_id = _succeeded_run(agent, None)
    assert agent.get(f"/actions/{action_id}").json()["via"] is None
    failed = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()
    assert failed["unwind"] is not None  # nothing to compare: automatic, as it always was


def test_a_worker_does_not_call_a_compensator_that_stopped_reaching_the_upstream_after_planning(
    people_policies, agent_key, operator_key
):
    agent, operator = Api(agent_key[1]), Api(operator_key[1])
    run_id, _ = _succeeded_run(agent, VIA)
    # Auto-compensation off: the operator compensates while the compensator still reaches it...
    PolicySet.objects.update(auto_compensate={})
    failed, step = _plan_step(operator, agent, run_id)
    assert step["requires_approval"] is False
    unwind_id = operator.post(
        f"/recovery/{failed['recovery_item']['id']}/compensate", {"reason": "undo"}
    ).json()["id"]
    # ...then the policy file points people.delete_user at a Python callable before a worker runs
    # the step: the worker checks again and does not call it.
    Compensator.objects.filter(tool="people.delete_user").update(
        kind="python", url="", mcp_tool="", python_path=f"{__name__}.delete_user"
    )
    unwind_advance(unwind_id=unwind_id, batch_s=5)
    assert python_calls == []
    step_row = UnwindStep.objects.get(unwind_id=unwind_id)
    assert step_row.status == UnwindStep.Status.FAILED and "upstream mismatch" in step_row.error
    assert Run.objects.get(pk=run_id).status != Run.Status.COMPENSATED
    assert Action.objects.get(run_id=run_id).status != Action.Status.COMPENSATED


def test_an_approved_mismatched_step_runs_once_a_person_decided(
    people_policies, agent_key, operator_key, approver_key, bob
):
    from django.test import Client as Browser
    from django.urls import reverse

    Compensator.objects.filter(tool="people.delete_user").update(
        kind="python", url="", mcp_tool="", python_path=f"{__name__}.delete_user"
    )
    agent, operator, approver = Api(agent_key[1]), Api(operator_key[1]), Api(approver_key[1])
    run_id, _ = _succeeded_run(agent, VIA)
    failed, _ = _plan_step(operator, agent, run_id)
    unwind_id = operator.post(
        f"/recovery/{failed['recovery_item']['id']}/compensate", {"reason": "undo"}
    ).json()["id"]
    unwind_advance(unwind_id=unwind_id, batch_s=5)
    approval = Approval.objects.get(step__unwind_id=unwind_id)
    assert python_calls == []
    # The approver is told why this automatic-looking step waits for them.
    browser = Browser()
    browser.force_login(bob)
    card = browser.get(reverse("dashboard:approvals")).content.decode()
    assert "upstream mismatch" in card and PEOPLE_URL in card
    granted = approver.post(f"/approvals/{approval.pk}/approve", {"reason": "checked: same directory"})
    assert granted.status_code == 200, granted.content
    step_run(step_id=approval.step_id, batch_s=5)
    assert [c["args"] for c in python_calls] == [{"email": ASHU}]
    assert Unwind.objects.get(pk=unwind_id).status == Unwind.Status.COMPLETED


def test_upstreams_are_compared_as_written_with_default_ports_and_trailing_slashes_normalised():
    assert upstream_key("https://HR.example/mcp/") == upstream_key("https://hr.example:443/mcp")
    assert upstream_key("http://hr.example/mcp") == upstream_key("http://hr.example:80/mcp")
    assert upstream_key("http://localhost:8765/mcp") != upstream_key("http://127.0.0.1:8765/mcp")
    assert upstream_key("https://hr.example/mcp") != upstream_key("http://hr.example/mcp")
    assert upstream_key("python people_mcp.py") is None
    assert upstream_key("http://hr.example:99999/mcp") is None


# --- Recording via: what is accepted, and replays ---------------------------------------------------


def test_via_is_stored_on_both_write_paths_and_returned(people_policies, agent_key):
    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "hire"}).json()["id"]
    fast = _record(agent, run_id, "fast", via=VIA)
    assert fast.status_code == 201 and fast.json()["via"] == VIA
    # An active pause (of another tool) sends the record down the checked path.
    from ledger.services import pauses

    pauses.pause_create(
        tenant=Run.objects.get(pk=run_id).tenant, actor=Actor.system("tests"), tool="payments.*", reason="x"
    )
    checked = _record(agent, run_id, "checked", via={**VIA, "gateway": "saga-mcp/2"})
    assert checked.status_code == 201 and checked.json()["via"]["gateway"] == "saga-mcp/2"
    assert {a.idempotency_key: a.via for a in Action.objects.filter(run_id=run_id)} == {
        "fast": VIA,
        "checked": {**VIA, "gateway": "saga-mcp/2"},
    }
    recorded = Event.objects.get(subject_id=fast.json()["id"], kind="action.recorded")
    assert recorded.data["via"] == VIA


def test_a_replay_with_another_upstream_is_another_action(people_policies, agent_key):
    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "hire"}).json()["id"]
    assert _record(agent, run_id, "k1", via=VIA).status_code == 201
    assert _record(agent, run_id, "k1", via=VIA).status_code == 200
    for other in ({**VIA, "upstream": "http://127.0.0.1:9999/mcp"}, None):
        replay = _record(agent, run_id, "k1", **({"via": other} if other else {}))
        assert (replay.status_code, error_of(replay)["code"]) == (422, "idempotency_key_reused")
    assert Action.objects.get(idempotency_key="k1").via == VIA


@pytest.mark.parametrize(
    "via",
    [
        {"gateway": "g", "upstream": PEOPLE_URL, "extra": 1},
        {"gateway": "g"},
        {"gateway": "g", "upstream": 5},
        {"gateway": "", "upstream": PEOPLE_URL},
        {"gateway": "g", "upstream": "x" * 2001},
        {"gateway": "g" * 201, "upstream": PEOPLE_URL},
        {"gateway": "g", "upstream": "http://a/\x00"},
        {"gateway": "g\n", "upstream": PEOPLE_URL},
        "http://127.0.0.1:8765/mcp",
        [PEOPLE_URL],
    ],
)
def test_a_malformed_via_is_refused_and_records_nothing(people_policies, agent_key, via):
    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "hire"}).json()["id"]
    refused = _record(agent, run_id, "bad", via=via)
    assert (refused.status_code, error_of(refused)["code"]) == (422, "invalid_request")
    assert not Action.objects.filter(run_id=run_id).exists()


def test_the_policies_page_and_the_run_page_show_the_upstream(people_policies, agent_key, alice):
    from django.test import Client as Browser
    from django.urls import reverse

    Compensator.objects.filter(tool="people.delete_user").update(url="http://127.0.0.1:9999/mcp")
    agent = Api(agent_key[1])
    run_id, _ = _succeeded_run(agent, VIA)
    browser = Browser()
    browser.force_login(alice)
    policies = browser.get(reverse("dashboard:policies")).content.decode()
    warned = policies.split("data-upstream-mismatches", 1)[1].split("</div>", 1)[0]
    assert "people.create_user" in warned and PEOPLE_URL in warned and "127.0.0.1:9999" in warned
    page = browser.get(reverse("dashboard:run-detail", args=[run_id])).content.decode()
    assert "Performed on" in page and PEOPLE_URL in page and "saga-mcp/1.0" in page
    # The compensator fixed: no warning any more.
    Compensator.objects.filter(tool="people.delete_user").update(url=PEOPLE_URL)
    assert "data-upstream-mismatches" not in browser.get(reverse("dashboard:policies")).content.decode()
