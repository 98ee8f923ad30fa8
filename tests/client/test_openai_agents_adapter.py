"""The OpenAI Agents SDK adapter against the real server and the real SDK: the SDK's own
``ScriptedModel`` (no network) asks for tool calls; a gated call comes back as an interruption,
Bob's approval bot decides over the API, and ``saga_decisions`` carries the decision into the
SDK's run state."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import httpx
import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from saga_client import AsyncSaga  # noqa: E402
from saga_client.openai_agents import saga_decisions, saga_function_tool  # noqa: E402

from ledger.models import Action, Run  # noqa: E402
from recovery.models import Approval  # noqa: E402
from tests.client.examples import run_example  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"
NO_TRACING = RunConfig(tracing_disabled=True)


class Payments:
    """The payment provider the agent charges, in memory: it counts every real charge."""

    def __init__(self) -> None:
        self.charges: list[dict[str, Any]] = []


def billing_agent(payments: Payments, *calls: dict[str, Any]) -> tuple[Agent, ScriptedModel]:
    @saga_function_tool(name="payments.charge", target=lambda customer: ("customer", customer))
    def charge(customer: str, amount: int, currency: str) -> str:
        """Charge a customer."""
        payments.charges.append({"customer": customer, "amount": amount, "currency": currency})
        return f"charged {amount} {currency} to {customer}"

    @saga_function_tool(name="hr.create_user", target=lambda email: ("user", email))
    def create_user(email: str, name: str) -> dict:
        """Create the HR user."""
        return {"user_id": 7, "email": email}

    steps = [[function_call(call["name"], call["args"], call_id=f"call_{n}")] for n, call in enumerate(calls)]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    return Agent(
        name="billing", instructions="Bill customers.", model=model, tools=[charge, create_user]
    ), model


CHARGE = {"name": "charge", "args": {"customer": "c-9", "amount": 300, "currency": "EUR"}}


@pytest.fixture
def async_saga(live_server, agent_key, onboarding_policies):
    return lambda: AsyncSaga(live_server.url, agent_key[1], poll_interval_s=0.05, backoff_s=0.01)


@pytest.fixture
def approvals_api(live_server, approver_key):
    """Bob's approval bot: an approver-scope key talking to the API over HTTP."""
    with httpx.Client(
        base_url=f"{live_server.url}/api/v1", headers={"Authorization": f"Bearer {approver_key[1]}"}
    ) as client:
        yield client


def test_a_gated_tool_interrupts_the_run_and_runs_once_after_bob_approves_over_the_api(
    async_saga, approvals_api
):
    payments = Payments()
    agent, model = billing_agent(payments, CHARGE)

    async def main() -> tuple[str, Any]:
        async with async_saga() as saga, saga.run(agent="billing", request="Charge the first month") as run:
            result = await Runner.run(agent, "Charge c-9 for the first month", run_config=NO_TRACING)
            [item] = result.interruptions
            assert (item.tool_name, item.arguments) == (
                "charge",
                '{"customer":"c-9","amount":300,"currency":"EUR"}',
            )
            assert payments.charges == []
            approval = await asyncio.to_thread(Approval.objects.get, status="pending")
            answer = await asyncio.to_thread(
                approvals_api.post, f"/approvals/{approval.pk}/approve", json={"reason": "first month"}
            )
            assert answer.status_code == 200, answer.text
            result = await Runner.run(agent, await saga_decisions(result), run_config=NO_TRACING)
            return run.id, result

    run_id, result = asyncio.run(main())
    assert result.interruptions == [] and result.final_output == "done"
    assert payments.charges == [{"customer": "c-9", "amount": 300, "currency": "EUR"}]
    action = Action.objects.get(run_id=run_id)
    assert (action.tool, action.status, action.attempts) == ("payments.charge", "succeeded", 1)
    assert (action.target_type, action.target_id) == ("customer", "c-9")
    assert action.args == {"customer": "c-9", "amount": 300, "currency": "EUR"}
    assert Run.objects.get(pk=run_id).status == "succeeded"
    model.assert_complete()


def test_saga_decisions_waits_for_the_approver(async_saga, approvals_api):
    payments = Payments()
    agent, _ = billing_agent(payments, CHARGE)

    async def approve_when_asked() -> None:
        while not (pending := await asyncio.to_thread(list, Approval.objects.filter(status="pending"))):
            await asyncio.sleep(0.05)
        await asyncio.to_thread(
            approvals_api.post, f"/approvals/{pending[0].pk}/approve", json={"reason": "ok"}
        )

    async def main() -> Any:
        async with async_saga() as saga, saga.run(agent="billing", request="Charge"):
            result = await Runner.run(agent, "Charge c-9", run_config=NO_TRACING)
            _, state = await asyncio.gather(approve_when_asked(), saga_decisions(result, timeout_s=10))
            return await Runner.run(agent, state, run_config=NO_TRACING)

    assert asyncio.run(main()).final_output == "done"
    assert len(payments.charges) == 1


def test_approving_in_the_sdk_alone_runs_nothing(async_saga):
    """Saga's approver decides: a host that approves the interruption itself gets a tool error."""
    payments = Payments()
    agent, model = billing_agent(payments, CHARGE)

    async def main() -> Any:
        async with async_saga() as saga, saga.run(agent="billing", request="Charge"):
            result = await Runner.run(agent, "Charge c-9", run_config=NO_TRACING)
            state = result.to_state()
            state.approve(result.interruptions[0])
            return await Runner.run(agent, state, run_config=NO_TRACING)

    result = asyncio.run(main())
    assert result.final_output == "done" and payments.charges == []
    [output] = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert "waiting for approval" in output
    assert Action.objects.get().status == "awaiting_approval"


def test_a_rejection_reaches_the_model_as_the_approvers_reason_and_nothing_is_charged(
    async_saga, approvals_api
):
    payments = Payments()
    agent, model = billing_agent(payments, CHARGE)

    async def main() -> tuple[str, Any]:
        async with async_saga() as saga, saga.run(agent="billing", request="Charge") as run:
            result = await Runner.run(agent, "Charge c-9", run_config=NO_TRACING)
            approval = await asyncio.to_thread(Approval.objects.get, status="pending")
            answer = await asyncio.to_thread(
                approvals_api.post,
                f"/approvals/{approval.pk}/reject",
                json={"reason": "not before the trial"},
            )
            assert answer.status_code == 200, answer.text
            return run.id, await Runner.run(agent, await saga_decisions(result), run_config=NO_TRACING)

    run_id, result = asyncio.run(main())
    assert result.final_output == "done" and payments.charges == []
    [output] = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert output == "Saga Admin: an approver rejected payments.charge: not before the trial"
    # The model's next turn saw the refusal as the call's output.
    assert any(entry.get("output") == output for entry in model.last_call.input if isinstance(entry, dict))
    assert Action.objects.get(run_id=run_id).status == "rejected"


def test_a_tool_that_needs_no_approval_is_a_step_with_its_args_by_name(saga):
    """With the blocking client too (``Runner.run_sync``)."""
    agent, _ = billing_agent(Payments(), {"name": "create_user", "args": {"email": EMAIL, "name": "Ashu"}})
    with saga.run(agent="onboarding", request="Onboard Ashu") as run:
        result = Runner.run_sync(agent, "Onboard Ashu", run_config=NO_TRACING)
    assert result.interruptions == [] and result.final_output == "done"
    action = Action.objects.get(run_id=run.id)
    assert (action.tool, action.status, action.attempts) == ("hr.create_user", "succeeded", 1)
    assert action.args == {"email": EMAIL, "name": "Ashu"}
    assert action.result == {"user_id": 7, "email": EMAIL}
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_the_client_imports_without_the_agents_sdk():
    code = "import sys, saga_client; assert not {'agents', 'openai'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_example_runs_against_the_server(live_server, agent_key, onboarding_policies, approvals_api):
    out = run_example(
        "openai_agents_agent.py", url=live_server.url, key=agent_key[1], approvals_api=approvals_api
    )
    assert "waiting for Saga Admin's approver: charge" in out
    assert "Ashu is set up and the first month is charged." in out
    run_id = out.strip().splitlines()[-1].removeprefix("run ")
    assert sorted(Action.objects.filter(run_id=run_id).values_list("tool", "status")) == [
        ("hr.create_user", "succeeded"),
        ("payments.charge", "succeeded"),
    ]


def test_a_call_nobody_decided_before_its_deadline_is_rejected_in_the_sdk_saying_so(async_saga):
    from recovery.actions.periodic import approvals_expire

    payments = Payments()
    agent, _ = billing_agent(payments, CHARGE)

    async def main() -> Any:
        async with async_saga() as saga, saga.run(agent="billing", request="Charge"):
            result = await Runner.run(agent, "Charge c-9", run_config=NO_TRACING)
            approval = await asyncio.to_thread(Approval.objects.get, status="pending")
            assert await asyncio.to_thread(approvals_expire, now=approval.expires_at) == 1
            state = await saga_decisions(result, timeout_s=10)
            return await Runner.run(agent, state, run_config=NO_TRACING)

    result = asyncio.run(main())
    assert result.final_output == "done" and payments.charges == []
    said = [str(item.raw_item) for item in result.new_items if "approval deadline" in str(item.raw_item)]
    assert said and "nobody approved payments.charge before its approval deadline" in said[0]
