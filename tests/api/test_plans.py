"""Plans through the whole URL stack (``POST /runs/{id}/plan``): several planned actions recorded in
one request, all or nothing, each exactly as if recorded alone — policies, rules, limits, pauses,
the compensation rule, ``start`` — with the pivot lint over the whole plan, every approval it
needs requested at once, and idempotency through its actions' keys. Hostile plans change nothing
and never answer 500."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ledger.models import Action, Event, Run
from ledger.services import runs
from recovery.models import Approval
from tests.factories import charge_policy, issue_key, load_policy_file, new_action, new_run
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db


def create_user(key: str = "create-ashu", **fields: Any) -> dict[str, Any]:
    return {
        "tool": "hr.create_user",
        "target_type": "user",
        "target_id": "ashu@company.com",
        "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
        "idempotency_key": key,
        "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        **fields,
    }


def provision_license(key: str = "license-ashu", **fields: Any) -> dict[str, Any]:
    return {
        "tool": "workspace.provision_license",
        "target_type": "user",
        "target_id": "ashu@company.com",
        "args": {"email": "ashu@company.com", "sku": "business-standard"},
        "idempotency_key": key,
        **fields,
    }


def send_welcome(key: str = "welcome-ashu", **fields: Any) -> dict[str, Any]:
    return {
        "tool": "email.send_welcome",
        "target_type": "user",
        "target_id": "ashu@company.com",
        "args": {"to": "ashu@company.com"},
        "idempotency_key": key,
        **fields,
    }


def charge(key: str, amount: int = 50, currency: str = "usd", **fields: Any) -> dict[str, Any]:
    return {
        "tool": "payments.charge",
        "target_type": "customer",
        "target_id": "cus_42",
        "args": {"amount": amount, "currency": currency},
        "idempotency_key": key,
        **fields,
    }


def onboarding_plan() -> list[dict[str, Any]]:
    """The onboarding saga's three steps in the saga's order: what can be undone first, the
    irreversible welcome e-mail last."""
    return [create_user(), provision_license(), send_welcome()]


def plan(api: Api, run_id: str, actions: Any, **headers: str):
    return api.post(f"/runs/{run_id}/plan", {"actions": actions}, headers=headers or None)


@pytest.fixture
def run(api, onboarding_policies) -> dict[str, Any]:
    return new_run(api)


def _nothing_recorded(run_id: str) -> None:
    assert not Action.objects.filter(run_id=run_id).exists()
    assert not Approval.objects.filter(run_id=run_id).exists()
    assert Run.objects.get(pk=run_id).action_count == 0
    assert not Event.objects.filter(run_id=run_id, kind="action.recorded").exists()


# --- Recording ---------------------------------------------------------------------------------


def test_it_records_the_plan_in_order_as_the_single_record_would(api, run):
    response = plan(api, run["id"], onboarding_plan())
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"actions", "warnings"}
    assert body["warnings"] == []
    actions = body["actions"]
    assert [a["tool"] for a in actions] == [
        "hr.create_user",
        "workspace.provision_license",
        "email.send_welcome",
    ]
    assert [a["seq"] for a in actions] == [1, 2, 3]
    assert [a["status"] for a in actions] == ["planned"] * 3
    assert [a["action_class"] for a in actions] == [
        "internal_update",
        "external_reversible",
        "external_irreversible",
    ]
    # The same policy, compensation and shape the single record gives.
    alone = new_action(Api(api.secret), new_run(api)["id"], key="alone")
    assert {k: actions[0][k] for k in ("risk", "policy", "compensation", "requires_approval")} == {
        k: alone[k] for k in ("risk", "policy", "compensation", "requires_approval")
    }
    recorded = Event.objects.filter(run_id=run["id"], kind="action.recorded").order_by("id")
    assert [e.subject_id for e in recorded] == [a["id"] for a in actions]
    assert Run.objects.get(pk=run["id"]).action_count == 3


def test_a_pivot_before_steps_that_can_be_undone_is_a_warning_naming_both(api, run):
    response = plan(api, run["id"], [send_welcome(), create_user(), provision_license()])
    assert response.status_code == 201, response.content
    body = response.json()
    welcome, user, license_ = body["actions"]
    assert [(w["code"], w["action_id"], w["pivot_action_id"]) for w in body["warnings"]] == [
        ("pivot_order", user["id"], welcome["id"]),
        ("pivot_order", license_["id"], welcome["id"]),
    ]
    assert "email.send_welcome" in body["warnings"][0]["message"]
    assert "hr.create_user" in body["warnings"][0]["message"]
    # Each action carries its own warning, as a single record would; the run shows them too.
    assert [w["code"] for w in user["warnings"]] == ["pivot_order"]
    detail = api.get(f"/runs/{run['id']}").json()
    assert sorted(w["action_id"] for w in detail["warnings"] if w["code"] == "pivot_order") == sorted(
        [user["id"], license_["id"]]
    )


def test_start_is_honoured_per_action(api, run):
    response = plan(
        api,
        run["id"],
        [create_user(start=True), provision_license(), charge("charge-1", start=True)],
    )
    assert response.status_code == 201, response.content
    user, license_, gated = response.json()["actions"]
    assert (user["status"], user["attempts"]) == ("running", 1)
    assert (license_["status"], license_["attempts"]) == ("planned", 0)
    # payments.charge needs a person: start waits for the approval, as in the single path.
    assert (gated["status"], gated["attempts"]) == ("awaiting_approval", 0)
    started = Event.objects.filter(run_id=run["id"], kind="action.started")
    assert [e.subject_id for e in started] == [user["id"]]


def test_every_approval_the_plan_needs_is_requested_at_once_and_in_the_inbox(api, run, approver_key):
    response = plan(
        api,
        run["id"],
        [create_user(), charge("charge-1", amount=40), charge("charge-2", amount=60), send_welcome()],
    )
    assert response.status_code == 201, response.content
    actions = response.json()["actions"]
    gated = [a for a in actions if a["requires_approval"]]
    assert [a["status"] for a in gated] == ["awaiting_approval"] * 2
    assert all(a["approval"]["status"] == "pending" for a in gated)
    inbox = Api(approver_key[1]).get("/approvals")
    assert inbox.status_code == 200, inbox.content
    assert sorted(item["id"] for item in inbox.json()["items"]) == sorted(a["approval"]["id"] for a in gated)
    assert Event.objects.filter(run_id=run["id"], kind="approval.requested").count() == 2


# --- All or nothing ----------------------------------------------------------------------------


def test_a_rule_that_denies_an_action_in_the_middle_records_nothing(api, db):
    load_policy_file(
        {
            "policies": [
                charge_policy(
                    rules=[{"if": {"arg": "currency", "not_in": ["usd"]}, "then": {"effect": "deny"}}]
                ),
                {"tool": "hr.*", "risk": "low", "approval": "auto", "action_class": "internal_update"},
            ]
        }
    )
    run = new_run(api)
    actions = [
        {"tool": "hr.create_user", "args": {"email": "a@b.c"}, "idempotency_key": "user"},
        charge("charge-gbp", currency="gbp"),
        {"tool": "hr.update_user", "args": {"email": "a@b.c"}, "idempotency_key": "update"},
    ]
    response = plan(api, run["id"], actions)
    assert response.status_code == 403, response.content
    error = error_of(response)
    assert error["code"] == "policy_denied"
    assert error["details"]["plan_index"] == 1 and error["details"]["rule"] == 0
    _nothing_recorded(run["id"])
    refused = Event.objects.get(run_id=run["id"], kind="action.refused")
    assert refused.data["code"] == "policy_denied"
    assert refused.data["idempotency_key"] == "charge-gbp"
    assert refused.data["details"]["plan_index"] == 1
    # Nothing was kept of the refusal: the same keys record the corrected plan.
    actions[1] = charge("charge-gbp")
    assert plan(api, run["id"], actions).status_code == 201


def test_a_pause_on_one_tool_of_the_plan_records_nothing(api, run, operator_key):
    pause = Api(operator_key[1]).post("/pauses", {"tool": "workspace.*", "reason": "licence outage"}).json()
    response = plan(api, run["id"], onboarding_plan())
    assert response.status_code == 409, response.content
    error = error_of(response)
    assert error["code"] == "paused"
    assert error["details"] == {"pause_id": pause["id"], "agent": "", "tool": "workspace.*", "plan_index": 1}
    _nothing_recorded(run["id"])
    assert Event.objects.get(run_id=run["id"], kind="action.refused").data["code"] == "paused"


@pytest.mark.parametrize(
    ("compensation", "code"),
    [
        ({"tool": "made.up_undo", "args": {}}, "unknown_compensator"),
        ({"tool": "hr.delete_everyone", "args": {}}, "compensation_not_allowed"),
    ],
)
def test_a_compensation_the_policy_refuses_records_nothing(api, run, compensation, code):
    refused = (
        charge("charge-1", compensation=compensation)
        if code == "unknown_compensator"
        else create_user("user-2", compensation=compensation)
    )
    response = plan(api, run["id"], [send_welcome(), provision_license(), refused])
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert (error["code"], error["details"]["plan_index"]) == (code, 2)
    _nothing_recorded(run["id"])
    assert Event.objects.get(run_id=run["id"], kind="action.refused").data["code"] == code


@pytest.mark.parametrize("change", ["cancel", "close"])
def test_a_cancelled_or_closed_run_takes_no_plan(api, agent, run, change):
    model = Run.objects.get(pk=run["id"])
    if change == "cancel":
        runs.run_cancel(run=model, actor=agent, reason="user withdrew the request")
    else:
        runs.run_fail(run=model, actor=agent, error="x")
        runs.run_close(run=model, actor=agent, reason="nothing to undo")
    response = plan(api, run["id"], onboarding_plan())
    assert response.status_code == 409, response.content
    error = error_of(response)
    assert error["code"] == "run_not_accepting_actions"
    assert error["details"]["current"] == Run.objects.get(pk=run["id"]).status
    assert not Action.objects.filter(run_id=run["id"]).exists()


# --- Limits ------------------------------------------------------------------------------------


def test_two_actions_of_one_plan_both_count_towards_a_limit(api, db):
    load_policy_file({"policies": [charge_policy(limits=[{"window": "1h", "per": "agent", "max_count": 2}])]})
    run = new_run(api)
    response = plan(api, run["id"], [charge("c-1"), charge("c-2"), charge("c-3")])
    assert response.status_code == 201, response.content
    statuses = [a["status"] for a in response.json()["actions"]]
    assert statuses == ["planned", "planned", "awaiting_approval"]
    third = response.json()["actions"][2]
    assert third["policy"]["limit"]["used"] == 2


def test_a_denying_limit_the_plan_itself_exceeds_records_nothing(api, db):
    limits = [{"window": "1h", "per": "tenant", "max_count": 1, "on_exceed": "deny"}]
    load_policy_file({"policies": [charge_policy(limits=limits)]})
    run = new_run(api)
    response = plan(api, run["id"], [charge("c-1"), charge("c-2")])
    assert response.status_code == 403, response.content
    error = error_of(response)
    assert (error["code"], error["details"]["plan_index"], error["details"]["limit"]) == (
        "policy_denied",
        1,
        0,
    )
    _nothing_recorded(run["id"])
    # Alone, the first one is within the limit.
    assert plan(api, run["id"], [charge("c-1")]).status_code == 201


# --- Idempotency -------------------------------------------------------------------------------


def test_the_same_plan_again_is_a_replay_with_the_actions_as_they_are_now(api, run):
    first = plan(api, run["id"], onboarding_plan()).json()
    user = first["actions"][0]
    assert api.post(f"/actions/{user['id']}/start").status_code == 200
    # The agent rephrased its reasoning on the retry: still the same plan.
    again_actions = onboarding_plan()
    again_actions[0]["intent"] = {"reasoning": "retrying after a timeout"}
    again = plan(api, run["id"], again_actions)
    assert again.status_code == 200, again.content
    assert again["Idempotent-Replayed"] == "true"
    body = again.json()
    assert [a["id"] for a in body["actions"]] == [a["id"] for a in first["actions"]]
    assert body["actions"][0]["status"] == "running"
    assert Action.objects.filter(run_id=run["id"]).count() == 3
    assert Run.objects.get(pk=run["id"]).action_count == 3


def test_a_replay_of_a_plan_keeps_its_pivot_warnings(api, run):
    actions = [send_welcome(), create_user()]
    first = plan(api, run["id"], actions).json()
    again = plan(api, run["id"], actions)
    assert again.status_code == 200
    assert again.json()["warnings"] == first["warnings"] and len(first["warnings"]) == 1


def test_a_mix_of_known_and_new_keys_is_refused_and_records_nothing(api, run):
    plan(api, run["id"], [create_user(), provision_license()])
    for actions in (
        [create_user(), send_welcome()],  # known, then new
        [send_welcome(), create_user()],  # new, then known
    ):
        response = plan(api, run["id"], actions)
        assert response.status_code == 422, response.content
        assert error_of(response)["code"] == "idempotency_key_reused"
    assert sorted(Action.objects.filter(run_id=run["id"]).values_list("idempotency_key", flat=True)) == [
        "create-ashu",
        "license-ashu",
    ]


def test_a_known_key_with_another_payload_is_refused(api, run):
    plan(api, run["id"], [create_user(), provision_license()])
    changed = provision_license(args={"email": "ashu@company.com", "sku": "enterprise"})
    response = plan(api, run["id"], [create_user(), changed])
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert (error["code"], error["details"]["plan_index"]) == ("idempotency_key_reused", 1)
    # A key a single record used is known to a plan too (and the other way round).
    new_action(api, run["id"], key="alone")
    assert plan(api, run["id"], [create_user("alone", args={"other": 1})]).status_code == 422


def test_a_key_twice_in_one_plan_is_invalid(api, run):
    response = plan(api, run["id"], [create_user("same"), provision_license("same")])
    assert response.status_code == 422, response.content
    error = error_of(response)
    assert (error["code"], error["details"]["plan_index"]) == ("invalid_request", 1)
    _nothing_recorded(run["id"])


# --- Who may plan ------------------------------------------------------------------------------


def test_another_tenants_or_another_agents_run_is_not_found(api, run, tenant, outsider_api):
    _, other_agent = issue_key(tenant, "another-agent")
    for caller in (outsider_api, Api(other_agent)):
        response = plan(caller, run["id"], onboarding_plan())
        assert response.status_code == 404, response.content
        assert error_of(response)["code"] == "not_found"
    _nothing_recorded(run["id"])
    # Not even a replay of keys the owner recorded hands their actions over.
    plan(api, run["id"], onboarding_plan())
    assert plan(Api(other_agent), run["id"], onboarding_plan()).status_code == 404
    assert plan(caller, "run_doesnotexist", onboarding_plan()).status_code == 404


def test_an_operator_or_approver_key_cannot_plan(api, run, operator_key, approver_key):
    for secret in (operator_key[1], approver_key[1]):
        response = plan(Api(secret), run["id"], onboarding_plan())
        assert response.status_code == 403, response.content
    assert plan(Api(None), run["id"], onboarding_plan()).status_code == 401
    _nothing_recorded(run["id"])


# --- Hostile bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"actions": []},
        {"actions": [create_user(f"k-{n}") for n in range(101)]},
        {},
        {"actions": "hr.create_user"},
        {"actions": {"0": create_user()}},
        {"actions": ["hr.create_user"]},
        {"actions": [None]},
        {"actions": [create_user(start="true")]},
        {"actions": [create_user(args=["not", "an", "object"])]},
        {"actions": [create_user(idempotency_key=None)]},
        {"actions": [{k: v for k, v in create_user().items() if k != "idempotency_key"}]},
        {"actions": [create_user(idempotency_key="")]},
        {"actions": [create_user(idempotency_key="has space")]},
        {"actions": [create_user(tool="")]},
        {"actions": [create_user(tool="hr create user")]},
        {"actions": [create_user(typo_field=1)]},
        {"actions": [create_user()], "extra": True},
        {"actions": [create_user(compensation={"tool": 5})]},
        {"actions": [create_user(intent={"confidence": "high"})]},
        [create_user()],
        "plan",
        None,
    ],
)
def test_a_malformed_plan_is_invalid_and_records_nothing(api, run, body):
    response = api.post(f"/runs/{run['id']}/plan", raw=json.dumps(body))
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] == "invalid_request"
    _nothing_recorded(run["id"])


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [(b"{not json", 400, "invalid_json"), (b"\xff\xfe", 400, "invalid_json"), (b"", 422, "invalid_request")],
)
def test_a_body_that_is_not_json_is_refused(api, run, raw, status, code):
    response = api.post(f"/runs/{run['id']}/plan", raw=raw)
    assert response.status_code == status, response.content
    assert error_of(response)["code"] == code
    _nothing_recorded(run["id"])


def test_a_plan_over_the_body_limit_is_413_and_records_nothing(api, run):
    # A hundred actions of 11 kB each: over the default limit of 1 MiB for the whole request.
    big = [create_user(f"k-{n}", args={"blob": "x" * 11000}) for n in range(100)]
    response = plan(api, run["id"], big)
    assert response.status_code == 413, response.content
    assert error_of(response)["code"] == "payload_too_large"
    _nothing_recorded(run["id"])


def test_a_full_plan_of_a_hundred_actions_is_recorded(api, run):
    response = plan(
        api, run["id"], [create_user(f"k-{n}", target_id=f"u{n}@company.com") for n in range(100)]
    )
    assert response.status_code == 201, response.content
    assert [a["seq"] for a in response.json()["actions"]] == list(range(1, 101))


def test_the_openapi_documents_the_plan(api):
    document = api.get("/openapi.json").json()
    operation = document["paths"]["/api/v1/runs/{run_id}/plan"]["post"]
    assert {"200", "201", "403", "404", "409", "413", "422"} <= set(operation["responses"])
    schemas = document["components"]["schemas"]
    created = operation["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[
        -1
    ]
    assert set(schemas[created]["properties"]) == {"actions", "warnings"}
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert set(schemas[body]["properties"]) == {"actions"}
    # Schema names are global in the document: the recovery queue's compensation plan keeps its own.
    assert "plan_hash" in schemas["PlanOut"]["properties"]
