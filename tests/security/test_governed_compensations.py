"""Compensations are governed, not requested.

An agent's compensation is a request: a tool that is not a registered compensator is refused
(422 ``unknown_compensator``), a tool other than the one its policy names too (422
``compensation_not_allowed``), and both change nothing but the audit log. A policy's own
compensation fills its ``compensation_args`` templates from the forward action (the approved args
when an approver edited them). Every compensation step is governed by the *compensating* tool's
policy: it runs unattended only when that policy says ``auto``.

Personas: the onboarding agent (``agent_key``), the supervisor automation that decides recovery
(``operator_key``), the approval bot (``approver_key``). The headline proofs run over real HTTP
against the live server; the rest use the in-process client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ledger.audit import Actor
from ledger.models import Action, Compensator, Event, PolicySet, Run, ToolPolicy
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policies_load_file
from recovery import compensators
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.unwinds.claim import step_claim
from recovery.unwinds.runner import step_run, unwind_advance
from tests.support.api import Api, error_of

pytestmark = pytest.mark.timeout(120)

# What the compensators below were asked to do, in this process (the tests drive the engine here).
compensator_calls: list[dict[str, Any]] = []


def refund(**fields: Any) -> dict[str, Any]:
    """The payment processor's refund (a Python compensator): money leaves the company."""
    compensator_calls.append(
        {"tool": fields["tool"], "args": fields["args"], "action_id": fields["action_id"]}
    )
    return {"state": {"refunded": True}}


def cancel_license(**fields: Any) -> dict[str, Any]:
    compensator_calls.append(
        {"tool": fields["tool"], "args": fields["args"], "action_id": fields["action_id"]}
    )
    return {}


@pytest.fixture(autouse=True)
def _no_calls_yet() -> Iterator[None]:
    compensator_calls.clear()
    yield
    compensator_calls.clear()


def _policy(tool: str, risk: str, approval: str, action_class: str, compensation: str, **extra: Any) -> None:
    ToolPolicy.objects.create(
        tool=tool,
        risk=risk,
        approval=approval,
        action_class=action_class,
        compensation=compensation,
        source="tests/security",
        **extra,
    )


@pytest.fixture
def policies(db: Any) -> None:
    """Adding a note is harmless (low, automatic) and leaves its undo to the agent. A refund is
    critical and always needs a person; it is a registered compensator. Provisioning a licence
    needs an approval and names its own undo, whose args the policy templates. Automatic
    compensation is on for low-risk runs."""
    _policy("notes.add", "low", "auto", "internal_update", "custom")
    _policy("payments.refund", "critical", "manual", "external_irreversible", "none")
    _policy(
        "workspace.provision_license",
        "low",
        "manual",
        "external_reversible",
        "custom",
        compensation_tool="workspace.cancel_license",
        compensation_args={
            "email": "$args.email",
            "sku": "$args.sku",
            "license_id": "$result.license_id",
            "user": "$target_id",
            "kind": "$target_type",
            "note": "$$ literal",
            "seats": [{"sku": "$args.sku", "count": 1}],
        },
    )
    _policy("workspace.cancel_license", "low", "auto", "internal_update", "none")
    Compensator.objects.create(tool="payments.refund", kind="python", python_path=f"{__name__}.refund")
    Compensator.objects.create(
        tool="workspace.cancel_license", kind="python", python_path=f"{__name__}.cancel_license"
    )
    PolicySet.objects.create(
        tenant=None, default_policy={}, auto_compensate={"max_risk": "low"}, unwind={}, source="tests"
    )


def _http(live_server: Any, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def _refusals(run_id: str) -> list[Event]:
    return list(Event.objects.filter(run_id=run_id, kind="action.refused").order_by("id"))


# --- The headline: an agent-named refund never runs without a human --------------------------


@pytest.mark.django_db(transaction=True)
def test_an_agent_named_refund_waits_for_a_human_even_with_auto_compensation_on(
    live_server, policies, agent_key, operator_key, approver_key
):
    smuggled = {"amount": 5000, "currency": "EUR", "to": "attacker-iban"}
    with (
        _http(live_server, agent_key[1]) as agent,
        _http(live_server, operator_key[1]) as operator,
        _http(live_server, approver_key[1]) as approver,
    ):
        run = agent.post("/runs", json={"agent": "onboarding-agent", "request": "Add a note"}).json()
        recorded = agent.post(
            f"/runs/{run['id']}/actions",
            json={
                "tool": "notes.add",
                "target_type": "ticket",
                "target_id": "T-1",
                "args": {"text": "hello"},
                "idempotency_key": "note-1",
                "compensation": {"tool": "payments.refund", "args": smuggled},
            },
        )
        assert recorded.status_code == 201, recorded.text
        action = recorded.json()
        assert action["compensation"] == {"strategy": "custom", "tool": "payments.refund", "args": smuggled}
        agent.post(f"/actions/{action['id']}/start").raise_for_status()
        agent.post(f"/actions/{action['id']}/succeed", json={"result": {"ok": True}}).raise_for_status()

        # The run fails. Its action is low risk, but the refund that would undo it is critical:
        # auto-compensation (max_risk low) does not start.
        failed = agent.post(f"/runs/{run['id']}/fail", json={"error": "the agent gave up"}).json()
        assert failed["unwind"] is None
        item_id = failed["recovery_item"]["id"]

        # The preview shows the refund's own policy governing the step, and that it needs a person.
        (step,) = operator.get(f"/recovery/{item_id}").json()["plan"]["steps"]
        assert (step["tool"], step["args"], step["risk"], step["requires_approval"]) == (
            "payments.refund",
            smuggled,
            "critical",
            True,
        )
        assert step["policy"] == {
            "tool": "payments.refund",
            "pattern": "payments.refund",
            "scope": "global",
            "risk": "critical",
            "approval": "manual",
            "source": "tests/security",
        }

        # An operator clicks "compensate" without reading closely: the step waits for a person.
        unwind = operator.post(f"/recovery/{item_id}/compensate", json={"reason": "undo the run"})
        assert unwind.status_code == 202, unwind.text
        unwind_id = unwind.json()["id"]
        unwind_advance(unwind_id=unwind_id, batch_s=5)
        unwind_advance(unwind_id=unwind_id, batch_s=5)  # a second job changes nothing

        progress = operator.get(f"/unwinds/{unwind_id}").json()
        assert progress["status"] == "paused"
        (waiting,) = progress["steps"]
        assert (waiting["status"], waiting["tool"], waiting["args"]) == (
            "awaiting_approval",
            "payments.refund",
            smuggled,
        )
        assert compensator_calls == []

        # The approver sees exactly what would run: the tool and its args.
        (approval,) = approver.get("/approvals", params={"kind": "compensation"}).json()["items"]
        assert (approval["tool"], approval["args"], approval["risk"]) == (
            "payments.refund",
            smuggled,
            "critical",
        )
        rejected = approver.post(f"/approvals/{approval['id']}/reject", json={"reason": "not a refund"})
        assert rejected.status_code == 200, rejected.text

    unwind_advance(unwind_id=unwind_id, batch_s=5)
    assert compensator_calls == []  # never ran
    step_row = UnwindStep.objects.get(unwind_id=unwind_id)
    assert step_row.status == UnwindStep.Status.FAILED and "rejected" in step_row.error
    assert Action.objects.get(pk=action["id"]).status == Action.Status.SUCCEEDED  # nothing was undone


@pytest.mark.django_db(transaction=True)
def test_an_approved_refund_runs_once_with_exactly_the_args_the_approver_saw(
    live_server, policies, agent_key, operator_key, approver_key
):
    with (
        _http(live_server, agent_key[1]) as agent,
        _http(live_server, operator_key[1]) as operator,
        _http(live_server, approver_key[1]) as approver,
    ):
        run = agent.post("/runs", json={"agent": "onboarding-agent", "request": "Add a note"}).json()
        action = agent.post(
            f"/runs/{run['id']}/actions",
            json={
                "tool": "notes.add",
                "args": {"text": "hello"},
                "idempotency_key": "note-1",
                "compensation": {"tool": "payments.refund", "args": {"amount": 5000}},
            },
        ).json()
        agent.post(f"/actions/{action['id']}/start").raise_for_status()
        agent.post(f"/actions/{action['id']}/succeed", json={"result": {}}).raise_for_status()
        item_id = agent.post(f"/runs/{run['id']}/fail", json={"error": "x"}).json()["recovery_item"]["id"]
        unwind_id = operator.post(f"/recovery/{item_id}/compensate", json={"reason": "undo"}).json()["id"]
        unwind_advance(unwind_id=unwind_id, batch_s=5)
        assert compensator_calls == []
        (approval,) = approver.get("/approvals", params={"kind": "compensation"}).json()["items"]
        approved = approver.post(
            f"/approvals/{approval['id']}/approve",
            json={"reason": "a real refund this time", "args_hash": approval["args_hash"]},
        )
        assert approved.status_code == 200, approved.text

    step_run(step_id=UnwindStep.objects.get(unwind_id=unwind_id).pk, batch_s=5)
    assert compensator_calls == [
        {"tool": "payments.refund", "args": {"amount": 5000}, "action_id": action["id"]}
    ]
    assert Unwind.objects.get(pk=unwind_id).status == Unwind.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_an_unknown_or_disallowed_compensation_is_refused_over_http_and_changes_nothing(
    live_server, policies, agent_key
):
    with _http(live_server, agent_key[1]) as agent:
        run_id = agent.post("/runs", json={"agent": "onboarding-agent", "request": "x"}).json()["id"]
        before = Run.objects.get(pk=run_id).action_count

        unknown = agent.post(
            f"/runs/{run_id}/actions",
            json={
                "tool": "notes.add",
                "args": {},
                "idempotency_key": "k-unknown",
                "compensation": {"tool": "payments.wire_transfer", "args": {"amount": 1}},
            },
        )
        assert unknown.status_code == 422
        assert unknown.json()["error"]["code"] == "unknown_compensator"
        assert unknown.json()["error"]["details"] == {"tool": "payments.wire_transfer"}

        # The licence's policy names its undo: a registered compensator is still not allowed.
        other = agent.post(
            f"/runs/{run_id}/actions",
            json={
                "tool": "workspace.provision_license",
                "target_id": "ashu@company.com",
                "args": {"email": "ashu@company.com", "sku": "basic"},
                "idempotency_key": "k-other",
                "compensation": {"tool": "payments.refund", "args": {"amount": 1}},
            },
        )
        assert other.status_code == 422
        error = other.json()["error"]
        assert error["code"] == "compensation_not_allowed"
        assert error["details"] == {
            "tool": "payments.refund",
            "allowed": "workspace.cancel_license",
            "policy": "workspace.provision_license",
        }

        # Sent again with the same key: refused again (nothing was stored to replay).
        again = agent.post(
            f"/runs/{run_id}/actions",
            json={
                "tool": "notes.add",
                "args": {},
                "idempotency_key": "k-unknown",
                "compensation": {"tool": "payments.wire_transfer", "args": {"amount": 1}},
            },
        )
        assert again.status_code == 422 and again.json()["error"]["code"] == "unknown_compensator"

    assert not Action.objects.filter(run_id=run_id).exists()
    assert Run.objects.get(pk=run_id).action_count == before
    refusals = _refusals(run_id)
    assert [(e.data["code"], e.data["compensation"]["tool"]) for e in refusals] == [
        ("unknown_compensator", "payments.wire_transfer"),
        ("compensation_not_allowed", "payments.refund"),
        ("unknown_compensator", "payments.wire_transfer"),
    ]
    assert {(e.actor_type, e.actor_id) for e in refusals} == {
        (Event.ActorType.AGENT_KEY, str(agent_key[0].pk))
    }


# --- Templates, from the approved args --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_policy_templates_are_filled_from_the_approved_edited_args_and_the_result(
    live_server, policies, agent_key, operator_key, approver_key
):
    with (
        _http(live_server, agent_key[1]) as agent,
        _http(live_server, operator_key[1]) as operator,
        _http(live_server, approver_key[1]) as approver,
    ):
        run_id = agent.post("/runs", json={"agent": "onboarding-agent", "request": "licence"}).json()["id"]
        action = agent.post(
            f"/runs/{run_id}/actions",
            json={
                "tool": "workspace.provision_license",
                "target_type": "user",
                "target_id": "ashu@company.com",
                "args": {"email": "ashu@company.com", "sku": "enterprise"},
                "idempotency_key": "lic-1",
            },
        ).json()
        assert action["status"] == "awaiting_approval"
        assert action["compensation"]["tool"] == "workspace.cancel_license"
        assert action["compensation"]["args"]["sku"] == "$args.sku"  # a template until it is planned
        (approval,) = approver.get("/approvals", params={"kind": "action"}).json()["items"]
        approver.post(
            f"/approvals/{approval['id']}/approve",
            json={"reason": "basic is enough", "args": {"email": "ashu@company.com", "sku": "basic"}},
        ).raise_for_status()
        agent.post(f"/actions/{action['id']}/start").raise_for_status()
        agent.post(
            f"/actions/{action['id']}/succeed", json={"result": {"license_id": "L-7"}}
        ).raise_for_status()
        failed = agent.post(f"/runs/{run_id}/fail", json={"error": "x"}).json()
        # Everything is low risk and automatic, the undo too: Saga Admin compensates on its own.
        assert failed["unwind"]["automatic"] is True
        unwind_id = failed["unwind"]["id"]
        item_id = failed["recovery_item"]["id"]

        filled = {
            "email": "ashu@company.com",
            "sku": "basic",  # the approved args, not what the agent asked for
            "license_id": "L-7",
            "user": "ashu@company.com",
            "kind": "user",
            "note": "$ literal",
            "seats": [{"sku": "basic", "count": 1}],
        }
        (step,) = operator.get(f"/recovery/{item_id}").json()["plan"]["steps"]
        assert (step["tool"], step["args"], step["args_error"]) == ("workspace.cancel_license", filled, "")
        assert step["requires_approval"] is False and step["policy"]["approval"] == "auto"
        frozen = operator.get(f"/unwinds/{unwind_id}").json()["steps"]
        assert [(s["tool"], s["args"]) for s in frozen] == [("workspace.cancel_license", filled)]

    unwind_advance(unwind_id=unwind_id, batch_s=5)
    assert compensator_calls == [
        {"tool": "workspace.cancel_license", "args": filled, "action_id": action["id"]}
    ]
    assert Unwind.objects.get(pk=unwind_id).status == Unwind.Status.COMPLETED


def test_a_path_the_action_lacks_fails_the_step_naming_it(policies, agent_key, operator_key, approver_key):
    agent, operator, approver = Api(agent_key[1]), Api(operator_key[1]), Api(approver_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "licence"}).json()["id"]
    action = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "workspace.provision_license",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com"},  # no sku
            "idempotency_key": "lic-1",
        },
    ).json()
    # Seen already when it is recorded: $args.sku cannot be filled.
    assert [w["code"] for w in action["warnings"]] == ["compensation_args_unfillable"]
    assert action["warnings"][0]["path"] == "$args.sku"
    (approval,) = approver.get("/approvals").json()["items"]
    approver.post(f"/approvals/{approval['id']}/approve", {"reason": "ok"})
    agent.post(f"/actions/{action['id']}/start")
    agent.post(f"/actions/{action['id']}/succeed", {"result": {"license_id": "L-7"}})
    failed_run = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()
    item_id = failed_run["recovery_item"]["id"]

    (step,) = operator.get(f"/recovery/{item_id}").json()["plan"]["steps"]
    assert "$args.sku" in step["args_error"] and "$args.sku" in step["note"]
    unwind_id = failed_run["unwind"]["id"]  # low risk throughout: compensated automatically
    unwind_advance(unwind_id=unwind_id, batch_s=5)

    failed = UnwindStep.objects.get(unwind_id=unwind_id)
    assert failed.status == UnwindStep.Status.FAILED and "$args.sku" in failed.error
    assert compensator_calls == []  # nothing was called with half-filled args
    assert Action.objects.get(pk=action["id"]).status == Action.Status.SUCCEEDED
    item = RecoveryItem.objects.get(run_id=run_id, status=RecoveryItem.Status.OPEN)
    assert item.reason == RecoveryItem.Reason.COMPENSATION_FAILED and "workspace.cancel_license" in item.error

    # Retrying cannot conjure the value: it fails again, naming the path again.
    retried = operator.post(f"/unwind-steps/{failed.pk}/retry", {"reason": "try again"})
    assert retried.status_code == 200, retried.content
    unwind_advance(unwind_id=unwind_id, batch_s=5)
    failed.refresh_from_db()
    assert failed.status == UnwindStep.Status.FAILED and "$args.sku" in failed.error
    assert compensator_calls == []


# --- The compensating tool's policy governs the step ------------------------------------------


def test_a_compensating_tool_without_a_policy_gets_the_default_and_waits_for_a_person(
    policies, agent_key, operator_key, monkeypatch
):
    # Registered in code, with no policy of its own: the default policy (built-in: high, manual).
    monkeypatch.setitem(compensators._REGISTRY, "notes.remove", lambda **_: {})
    agent, operator = Api(agent_key[1]), Api(operator_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "note"}).json()["id"]
    action = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "notes.add",
            "args": {"text": "hi"},
            "idempotency_key": "n-1",
            "compensation": {"tool": "notes.remove", "args": {"id": 1}},
        },
    )
    assert action.status_code == 201, action.content
    action_id = action.json()["id"]
    agent.post(f"/actions/{action_id}/start")
    agent.post(f"/actions/{action_id}/succeed", {"result": {}})
    failed = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()
    # Auto-compensation weighs the compensating tool's (default, high) risk too.
    assert failed["unwind"] is None
    (step,) = operator.get(f"/recovery/{failed['recovery_item']['id']}").json()["plan"]["steps"]
    assert step["policy"]["scope"] == "default" and step["policy"]["pattern"] == "*default*"
    assert (step["requires_approval"], step["risk"], step["compensator"]) == (True, "high", "python")


def test_auto_compensation_runs_when_the_forward_and_compensating_risks_are_within_the_limit(
    policies, agent_key
):
    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "licence"}).json()["id"]
    # Licences are auto-approved here, and cancelling one is low risk and automatic.
    ToolPolicy.objects.filter(tool="workspace.provision_license").update(approval="auto")
    action_id = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "workspace.provision_license",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com", "sku": "basic"},
            "idempotency_key": "lic-1",
        },
    ).json()["id"]
    agent.post(f"/actions/{action_id}/start")
    agent.post(f"/actions/{action_id}/succeed", {"result": {"license_id": "L-1"}})
    failed = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()
    assert failed["unwind"] is not None and failed["unwind"]["automatic"] is True
    unwind_advance(unwind_id=failed["unwind"]["id"], batch_s=5)
    assert [c["tool"] for c in compensator_calls] == ["workspace.cancel_license"]

    # The same run shape, but cancelling a licence is now medium risk: no automatic undo.
    ToolPolicy.objects.filter(tool="workspace.cancel_license").update(risk="medium")
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "licence"}).json()["id"]
    action_id = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "workspace.provision_license",
            "target_id": "lee@company.com",
            "args": {"email": "lee@company.com", "sku": "basic"},
            "idempotency_key": "lic-2",
        },
    ).json()["id"]
    agent.post(f"/actions/{action_id}/start")
    agent.post(f"/actions/{action_id}/succeed", {"result": {"license_id": "L-2"}})
    assert agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()["unwind"] is None


def test_undoing_a_high_risk_action_needs_approval_even_with_an_automatic_compensating_tool(
    policies, agent_key, operator_key
):
    _policy("crm.bulk_update", "high", "auto", "internal_update", "custom", compensation_tool="notes.remove")
    _policy("notes.remove", "low", "auto", "internal_update", "none")
    agent, operator = Api(agent_key[1]), Api(operator_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "bulk"}).json()["id"]
    action_id = agent.post(
        f"/runs/{run_id}/actions", {"tool": "crm.bulk_update", "args": {"n": 500}, "idempotency_key": "b-1"}
    ).json()["id"]
    agent.post(f"/actions/{action_id}/start")
    agent.post(f"/actions/{action_id}/succeed", {"result": {}})
    item_id = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()["recovery_item"]["id"]
    (step,) = operator.get(f"/recovery/{item_id}").json()["plan"]["steps"]
    assert (step["tool"], step["args"], step["requires_approval"]) == ("notes.remove", {"n": 500}, True)
    assert step["policy"]["approval"] == "auto" and step["risk"] == "high"


# --- Recording: what is accepted, and replays ----------------------------------------------------


def test_a_compensator_registered_in_code_may_be_named_and_the_policys_own_tool_always(
    policies, agent_key, monkeypatch
):
    monkeypatch.setitem(compensators._REGISTRY, "notes.remove", lambda **_: {})
    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "x"}).json()["id"]
    named = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "notes.add",
            "args": {},
            "idempotency_key": "n-1",
            "compensation": {"tool": "notes.remove", "args": {"id": 1}},
        },
    )
    assert named.status_code == 201 and named.json()["compensation"]["tool"] == "notes.remove"
    # Naming the policy's own tool is agreeing with it: the policy's templates build the args.
    same = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "workspace.provision_license",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com", "sku": "basic"},
            "idempotency_key": "l-1",
            "compensation": {"tool": "workspace.cancel_license", "args": {"email": "someone@else.com"}},
        },
    )
    assert same.status_code == 201, same.content
    body = same.json()
    assert body["compensation"]["args"]["email"] == "$args.email"
    assert [w["code"] for w in body["warnings"]] == ["compensation_args_from_policy"]
    assert body["policy"]["compensation_args"]["email"] == "$args.email"


def test_a_replay_returns_the_accepted_action_even_after_its_compensator_was_removed(policies, agent_key):
    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "x"}).json()["id"]
    body = {
        "tool": "notes.add",
        "args": {},
        "idempotency_key": "n-1",
        "compensation": {"tool": "payments.refund", "args": {"amount": 1}},
    }
    first = agent.post(f"/runs/{run_id}/actions", body)
    assert first.status_code == 201
    Compensator.objects.filter(tool="payments.refund").delete()
    replay = agent.post(f"/runs/{run_id}/actions", body)
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    # A new action naming it now is refused, and audited on the run.
    refused = agent.post(f"/runs/{run_id}/actions", {**body, "idempotency_key": "n-2"})
    assert error_of(refused)["code"] == "unknown_compensator"
    assert Action.objects.filter(run_id=run_id).count() == 1
    assert [e.data["idempotency_key"] for e in _refusals(run_id)] == ["n-2"]


def test_a_tenants_own_compensator_is_not_registered_for_another_tenant(
    policies, agent_key, outsider_key, other_tenant
):
    Compensator.objects.create(
        tenant=other_tenant, tool="globex.undo", kind="python", python_path=f"{__name__}.refund"
    )
    acme, globex = Api(agent_key[1]), Api(outsider_key[1])
    body = {
        "tool": "notes.add",
        "args": {},
        "idempotency_key": "n-1",
        "compensation": {"tool": "globex.undo", "args": {}},
    }
    acme_run = acme.post("/runs", {"agent": "onboarding-agent", "request": "x"}).json()["id"]
    assert error_of(acme.post(f"/runs/{acme_run}/actions", body))["code"] == "unknown_compensator"
    globex_run = globex.post("/runs", {"agent": "globex-agent", "request": "x"}).json()["id"]
    assert globex.post(f"/runs/{globex_run}/actions", body).status_code == 201


# --- Loading the templates ---------------------------------------------------------------------


def _file(tmp_path: Any, policy: dict[str, Any]) -> Any:
    import json

    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"policies": [policy]}))
    return path


BASE = {"tool": "hr.create_user", "risk": "low", "approval": "auto", "action_class": "internal_update"}


def test_the_loader_stores_templates_and_the_api_shows_them(db, tmp_path, agent_key):
    template = {"email": "$args.email", "id": "$result.user_id", "keep": [1, "$$5"]}
    path = _file(tmp_path, {**BASE, "compensation_tool": "hr.delete_user", "compensation_args": template})
    policies_load_file(path=path, tenant=None, actor=Actor.system("tests"))
    assert ToolPolicy.objects.get(tool="hr.create_user").compensation_args == template
    (shown,) = Api(agent_key[1]).get("/policies").json()["policies"]
    assert shown["compensation_args"] == template


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"compensation_tool": "hr.delete_user", "compensation_args": {"email": "$arg.email"}},
            "compensation_args.email: '$arg.email' is not a template",
        ),
        (
            {"compensation_tool": "hr.delete_user", "compensation_args": {"a": {"b": ["$args."]}}},
            "compensation_args.a.b[0]: '$args.' is not a template",
        ),
        ({"compensation_args": {"email": "$args.email"}}, "compensation_args: needs compensation_tool"),
        (
            {"compensation": "snapshot", "compensation_tool": "x.restore", "compensation_args": {}},
            "compensation_args: a snapshot restore",
        ),
        (
            {"compensation_tool": "hr.delete_user", "compensation_args": 5},
            "compensation_args: must be an object",
        ),
    ],
)
def test_a_malformed_template_is_a_load_error_naming_the_policy_and_key(db, tmp_path, policy, message):
    path = _file(tmp_path, {**BASE, **policy})
    with pytest.raises(PolicyFileError) as excinfo:
        policies_load_file(path=path, tenant=None, actor=Actor.system("tests"))
    (problem,) = excinfo.value.problems
    assert problem.startswith('policies[0] (tool "hr.create_user"): ') and message in problem
    assert not ToolPolicy.objects.exists()


def test_an_approval_gated_compensation_step_is_never_claimed_before_it_is_approved(
    policies, agent_key, operator_key
):
    """The engine's own guard, whatever a job or the sweeper does: a step awaiting approval is
    never claimed, so its compensator cannot be called."""
    agent, operator = Api(agent_key[1]), Api(operator_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "x"}).json()["id"]
    action_id = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "notes.add",
            "args": {},
            "idempotency_key": "n-1",
            "compensation": {"tool": "payments.refund", "args": {"amount": 9}},
        },
    ).json()["id"]
    agent.post(f"/actions/{action_id}/start")
    agent.post(f"/actions/{action_id}/succeed", {"result": {}})
    item_id = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()["recovery_item"]["id"]
    unwind_id = operator.post(f"/recovery/{item_id}/compensate", {"reason": "undo"}).json()["id"]
    unwind_advance(unwind_id=unwind_id, batch_s=5)
    step = UnwindStep.objects.get(unwind_id=unwind_id)
    assert step.status == UnwindStep.Status.AWAITING_APPROVAL
    assert step_claim(step_id=step.pk) is None
    assert step_run(step_id=step.pk, batch_s=5) is None
    assert Approval.objects.get(step=step).status == Approval.Status.PENDING
    assert compensator_calls == []


def test_the_dashboards_plan_preview_shows_each_steps_governing_policy(policies, agent_key, alice):
    from django.test import Client
    from django.urls import reverse

    agent = Api(agent_key[1])
    run_id = agent.post("/runs", {"agent": "onboarding-agent", "request": "x"}).json()["id"]
    action_id = agent.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "notes.add",
            "args": {},
            "idempotency_key": "n-1",
            "compensation": {"tool": "payments.refund", "args": {"amount": 5000, "to": "attacker-iban"}},
        },
    ).json()["id"]
    agent.post(f"/actions/{action_id}/start")
    agent.post(f"/actions/{action_id}/succeed", {"result": {}})
    item_id = agent.post(f"/runs/{run_id}/fail", {"error": "x"}).json()["recovery_item"]["id"]

    browser = Client()
    browser.force_login(alice)
    page = browser.get(reverse("dashboard:item-compensate", args=[item_id]))
    assert page.status_code == 200
    html = page.content.decode()
    governing = html.split('class="small governing-policy"', 1)[1].split("</td>", 1)[0]
    assert "<code>payments.refund</code>" in governing and "(global policy)" in governing
    assert "critical risk" in governing and "manual approval" in governing
    assert "needs approval" in html and "attacker-iban" in html  # the exact args, shown before anything runs
