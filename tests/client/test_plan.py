"""``run.plan([...])`` (Saga and AsyncSaga) against the real server: the steps recorded in one
request before any runs, each then run by ``run.step`` with the same tool, target and args; the
pivot lint and the approvals of the whole plan at once; a plan sent again comes back as it is now;
refusals raise the spec's error classes and record nothing."""

from __future__ import annotations

import asyncio

import pytest
from saga_client import AsyncSaga, Paused, PolicyDenied, SagaError
from saga_client.errors import InvalidRequest
from saga_client.responses import PlanDict

from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.services.pauses import pause_create
from tests.factories import charge_policy, load_policy_file

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"


def onboarding_steps() -> list[dict]:
    return [
        {
            "tool": "hr.create_user",
            "target": ("user", EMAIL),
            "args": {"email": EMAIL, "name": "Ashu Kumar"},
            "compensate": ("hr.delete_user", {"email": EMAIL}),
            "intent": {"reasoning": "HR asked for it"},
        },
        {
            "tool": "workspace.provision_license",
            "target": ("user", EMAIL),
            "args": {"email": EMAIL, "sku": "business-standard"},
        },
        {"tool": "email.send_welcome", "target": ("user", EMAIL), "args": {"to": EMAIL}},
    ]


def test_a_plan_is_recorded_up_front_and_its_steps_then_run_the_planned_actions(saga):
    calls: list[str] = []
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar", external_id="HR-17") as run:
        plan = run.plan(onboarding_steps())
        assert [a["status"] for a in plan["actions"]] == ["planned"] * 3
        assert plan["warnings"] == []
        assert plan["actions"][0]["intent"] == {"reasoning": "HR asked for it"}
        for step in onboarding_steps():
            run.step(
                step["tool"],
                target=step["target"],
                args=step["args"],
                compensate=step.get("compensate"),
                do=lambda args, tool=step["tool"]: calls.append(tool) or {"ok": True},
            )
    assert calls == ["hr.create_user", "workspace.provision_license", "email.send_welcome"]
    model = Run.objects.get(external_id="HR-17")
    assert model.status == "succeeded"
    actions = list(Action.objects.filter(run=model).order_by("seq"))
    # The steps ran the planned actions: no action beyond the plan's three.
    assert [a.pk for a in actions] == [a["id"] for a in plan["actions"]]
    assert [a.status for a in actions] == ["succeeded"] * 3


def test_the_pivot_lint_and_the_approvals_of_the_whole_plan(saga):
    run = saga.run(agent="onboarding", request="Charge, then onboard").open()
    plan = run.plan(
        [
            {"tool": "payments.charge", "target": ("customer", "cus_42"), "args": {"amount": 40}},
            {"tool": "hr.create_user", "target": ("user", EMAIL), "args": {"email": EMAIL}, "start": True},
        ]
    )
    charge, user = plan["actions"]
    assert (charge["status"], charge["approval"]["status"]) == ("awaiting_approval", "pending")
    assert (user["status"], user["attempts"]) == ("running", 1)
    assert [(w["code"], w["action_id"], w["pivot_action_id"]) for w in plan["warnings"]] == [
        ("pivot_order", user["id"], charge["id"])
    ]


def test_refusals_raise_the_spec_classes_and_record_nothing(saga, tenant):
    load_policy_file(
        {
            "policies": [
                charge_policy(rules=[{"if": {"arg": "currency", "in": ["gbp"]}, "then": {"effect": "deny"}}])
            ]
        }
    )
    run = saga.run(agent="onboarding", request="Charge").open()
    with pytest.raises(PolicyDenied) as denied:
        run.plan(
            [
                {"tool": "hr.create_user", "args": {"email": EMAIL}},
                {"tool": "payments.charge", "args": {"amount": 5, "currency": "gbp"}},
            ]
        )
    assert denied.value.code == "policy_denied" and denied.value.details["plan_index"] == 1
    pause_create(tenant=tenant, actor=Actor.system("tests"), tool="hr.*", reason="HR outage")
    with pytest.raises(Paused):
        run.plan(onboarding_steps())
    with pytest.raises(InvalidRequest) as invalid:
        run.plan([])
    assert invalid.value.code == "invalid_request"
    with pytest.raises(TypeError, match="compensation"):
        run.plan([{"tool": "hr.create_user", "compensation": ("hr.delete_user", {})}])
    assert not Action.objects.filter(run_id=run.id).exists()


def test_a_plan_before_its_run_is_open_is_refused(saga):
    run = saga.run(agent="onboarding", request="Onboard")
    with pytest.raises(SagaError) as refused:
        run.plan(onboarding_steps())
    assert refused.value.code == "run_not_open"


def test_the_async_client_plans_too_and_a_plan_sent_again_is_the_same_plan(
    live_server, agent_key, onboarding_policies
):
    async def agent() -> tuple[PlanDict, PlanDict, PlanDict]:
        async with AsyncSaga(live_server.url, agent_key[1], backoff_s=0.01) as saga:
            run = await saga.run(agent="onboarding", request="Onboard Ashu Kumar", external_id="HR-18")
            first = await run.plan(onboarding_steps())
            await saga.start_action(first["actions"][0])
            again = await run.plan(onboarding_steps())
            raw = await saga.record_plan(
                run.id,
                [{"tool": "crm.update_contact", "idempotency_key": "crm-1", "args": {"stage": "won"}}],
            )
            return first, again, raw

    first, again, raw = asyncio.run(agent())
    assert [a["id"] for a in again["actions"]] == [a["id"] for a in first["actions"]]
    assert [a["status"] for a in again["actions"]] == ["running", "planned", "planned"]
    assert raw["actions"][0]["idempotency_key"] == "crm-1"
    assert Action.objects.filter(run__external_id="HR-18").count() == 4
