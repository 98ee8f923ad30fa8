"""An OpenAI Agents SDK agent whose function tools are Saga Admin steps; the gated charge comes back
as an interruption that Saga Admin's approver decides.

    pip install './clients/python[openai-agents]'
    SAGA_URL=http://127.0.0.1:8000 SAGA_API_KEY=sk_… python clients/python/examples/openai_agents_agent.py

The model is the SDK's ScriptedModel so the example runs without an OpenAI key: drop ``model=`` to
use OpenAI's. Approve the charge in the dashboard's inbox or over the API with an approver key.
"""

from __future__ import annotations

import asyncio
import os

from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call

from saga_client import AsyncSaga
from saga_client.openai_agents import saga_decisions, saga_function_tool


@saga_function_tool(name="hr.create_user", target=lambda email: ("user", email))
def create_user(email: str, name: str) -> dict:
    """Create the new hire's account in the HR system."""
    return {"user_id": 7, "email": email}


@saga_function_tool(name="payments.charge", target=lambda customer: ("customer", customer))
async def charge(customer: str, amount: int, currency: str) -> str:
    """Charge a customer's card."""
    return f"charged {amount} {currency} to {customer}"


model = ScriptedModel(
    [
        [function_call("create_user", {"email": "ashu@company.com", "name": "Ashu"}, call_id="1")],
        [function_call("charge", {"customer": "c-9", "amount": 30, "currency": "EUR"}, call_id="2")],
        [assistant_message("Ashu is set up and the first month is charged.")],
    ]
)
agent = Agent(name="onboarding", instructions="Onboard new hires.", model=model, tools=[create_user, charge])


async def main() -> None:
    config = RunConfig(tracing_disabled=True)
    async with AsyncSaga(os.environ["SAGA_URL"], os.environ["SAGA_API_KEY"], poll_interval_s=0.5) as saga:
        async with saga.run(agent="onboarding", request="Onboard Ashu and charge the first month") as run:
            result = await Runner.run(agent, "Onboard Ashu, charge c-9 30 EUR", run_config=config)
            while result.interruptions:
                for item in result.interruptions:
                    print(f"waiting for Saga Admin's approver: {item.tool_name} {item.arguments}")
                result = await Runner.run(agent, await saga_decisions(result), run_config=config)
            print(result.final_output)
        print(f"run {run.id}")


if __name__ == "__main__":
    asyncio.run(main())
