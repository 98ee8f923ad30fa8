"""AsyncSaga, @saga.tool and the non-blocking approval primitive against the real server, and the
errors an integrator meets first (a wrong key, a server that is not there)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from saga_client import ApprovalPending, ApprovalRejected, AsyncSaga, Saga, SagaAuthError, SagaUnavailable

from ledger.audit import Actor
from ledger.models import Action, Run
from recovery.actions.approvals import approval_approve, approval_reject
from recovery.models import Approval, RecoveryItem

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"


@pytest.fixture
def async_saga_options(live_server, agent_key, onboarding_policies):
    """What an AsyncSaga needs; each test builds it inside its own event loop."""
    return {"base_url": live_server.url, "api_key": agent_key[1], "poll_interval_s": 0.05, "backoff_s": 0.01}


def test_an_async_run_with_a_failing_step_lands_in_the_recovery_queue(async_saga_options):
    async def agent() -> str:
        async with AsyncSaga(**async_saga_options) as saga:
            run = saga.run(agent="onboarding", request="Onboard Ashu Kumar", external_id="HR-17")
            async with run:
                await run.step(
                    "hr.create_user",
                    target=("user", EMAIL),
                    args={"email": EMAIL, "name": "Ashu Kumar"},
                    do=lambda args: {"user_id": 1},
                    compensate=("hr.delete_user", {"email": EMAIL}),
                )

                async def send_welcome() -> dict:
                    await asyncio.sleep(0)
                    raise RuntimeError("mail gateway 429")

                await run.step(
                    "email.send_welcome", target=("user", EMAIL), args={"to": EMAIL}, do=send_welcome
                )
            return run.id

    with pytest.raises(RuntimeError, match="mail gateway 429"):
        asyncio.run(agent())
    run = Run.objects.get(external_id="HR-17")
    assert run.status == "failed"
    welcome = Action.objects.get(run=run, tool="email.send_welcome")
    assert welcome.status == "failed" and welcome.error == "RuntimeError: mail gateway 429"
    item = RecoveryItem.objects.get(run=run)
    assert item.status == "open" and item.failed_action_id == welcome.pk
    assert Action.objects.get(run=run, tool="hr.create_user").status == "succeeded"


def test_an_async_do_is_awaited_not_recorded_as_done_unrun(async_saga_options):
    """The regression: an ``async def`` passed as ``do`` used to be called, its coroutine dropped,
    and the step recorded ``succeeded`` although nothing happened."""
    created: list[str] = []

    async def create_user(args: dict) -> dict:
        await asyncio.sleep(0.01)
        created.append(args["email"])
        return {"user_id": 42}

    async def agent() -> tuple[str, dict]:
        async with AsyncSaga(**async_saga_options) as saga, saga.run(agent="onboarding", request="r") as run:
            result = await run.step(
                "hr.create_user", target=("user", EMAIL), args={"email": EMAIL}, do=create_user
            )
            return run.id, result

    run_id, result = asyncio.run(agent())
    assert created == [EMAIL] and result == {"user_id": 42}
    action = Action.objects.get(run_id=run_id)
    assert action.status == "succeeded" and action.result == {"user_id": 42}
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_the_blocking_client_refuses_an_async_do_before_recording_anything(saga):
    async def create_user(args: dict) -> dict:
        return {"user_id": 42}

    with pytest.raises(TypeError, match="AsyncSaga"), saga.run(agent="onboarding", request="r") as run:
        run.step("hr.create_user", target=("user", EMAIL), args={"email": EMAIL}, do=create_user)
    assert not Action.objects.filter(run_id=run.id).exists()
    assert Run.objects.get(pk=run.id).status == "failed"


def test_the_decorator_records_each_call_with_its_arguments_by_name(saga):
    users: dict[str, str] = {}

    @saga.tool(
        "hr.create_user",
        target=lambda email: ("user", email),
        compensate=lambda email: ("hr.delete_user", {"email": email}),
    )
    def create_user(email: str, name: str, department: str = "Engineering") -> dict:
        users[email] = name
        return {"user_id": len(users)}

    with saga.run(agent="onboarding", request="Onboard two people") as run:
        assert create_user(EMAIL, name="Ashu Kumar") == {"user_id": 1}
        assert create_user("maya@company.com", "Maya Chen", department="Design") == {"user_id": 2}
        # The same call again is the same step: it replays, the function is not called twice.
        assert create_user(EMAIL, "Ashu Kumar") == {"user_id": 1}

    actions = list(Action.objects.filter(run_id=run.id).order_by("seq"))
    assert [a.args for a in actions] == [
        {"email": EMAIL, "name": "Ashu Kumar", "department": "Engineering"},
        {"email": "maya@company.com", "name": "Maya Chen", "department": "Design"},
    ]
    assert [(a.target_type, a.target_id, a.status) for a in actions] == [
        ("user", EMAIL, "succeeded"),
        ("user", "maya@company.com", "succeeded"),
    ]
    assert [(a.compensation_tool, a.compensation_args) for a in actions] == [
        ("hr.delete_user", {"email": EMAIL}),
        ("hr.delete_user", {"email": "maya@company.com"}),
    ]
    assert users == {EMAIL: "Ashu Kumar", "maya@company.com": "Maya Chen"}


def test_async_tools_run_concurrently_each_in_the_run_of_its_context(async_saga_options):
    async def agent() -> str:
        async with AsyncSaga(**async_saga_options) as saga:

            @saga.tool("hr.create_user", target=lambda email: ("user", email))
            async def create_user(email: str, name: str) -> dict:
                await asyncio.sleep(0.01)
                return {"email": email}

            async with saga.run(agent="onboarding", request="Onboard a team") as run:
                await asyncio.gather(*(create_user(f"u{i}@company.com", f"User {i}") for i in range(4)))
            return run.id

    run_id = asyncio.run(agent())
    assert sorted(Action.objects.filter(run_id=run_id).values_list("target_id", "status")) == [
        (f"u{i}@company.com", "succeeded") for i in range(4)
    ]
    assert Run.objects.get(pk=run_id).status == "succeeded"


def test_a_gated_step_without_waiting_raises_pending_then_runs_with_the_approved_args(saga, bob):
    run = saga.run(agent="onboarding", request="Charge the first month").open()
    with pytest.raises(ApprovalPending) as caught:
        run.step(
            "payments.charge",
            target=("customer", "c-9"),
            args={"customer": "c-9", "amount": 300, "currency": "EUR"},
            do=lambda args: pytest.fail("must not run before the decision"),
            wait=False,
        )
    pending = caught.value
    action = Action.objects.get(pk=pending.action_id)
    assert action.status == "awaiting_approval" and pending.approval_id == Approval.objects.get().pk

    approval_approve(
        approval=Approval.objects.get(pk=pending.approval_id),
        actor=Actor.for_user(bob),
        reason="first month only",
        args={"customer": "c-9", "amount": 30, "currency": "EUR"},
    )
    # The agent comes back later (another process, even): attach and call the same step again.
    again = saga.attach(run.id)
    with again:
        result = again.step(
            "payments.charge",
            target=("customer", "c-9"),
            args={"customer": "c-9", "amount": 300, "currency": "EUR"},
            do=lambda args: {"charge_id": "ch_1", "amount": args["amount"]},
            wait=False,
        )
    assert result == {"charge_id": "ch_1", "amount": 30}
    action.refresh_from_db()
    assert action.status == "succeeded" and action.args["amount"] == 30
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_a_rejected_pending_step_raises_rejected_when_called_again(saga, bob):
    with saga.run(agent="onboarding", request="Charge") as run:
        with pytest.raises(ApprovalPending) as caught:
            run.step(
                "payments.charge", args={"amount": 300}, do=lambda: pytest.fail("must not run"), wait=False
            )
        approval_reject(
            approval=Approval.objects.get(pk=caught.value.approval_id),
            actor=Actor.for_user(bob),
            reason="not for a new hire",
        )
        with pytest.raises(ApprovalRejected, match="not for a new hire"):
            run.step(
                "payments.charge", args={"amount": 300}, do=lambda: pytest.fail("must not run"), wait=False
            )
        assert run.pending_approvals == {}
        run.complete("Nothing charged.")
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_a_wrong_key_raises_saga_auth_error_with_the_servers_message(live_server, agent_key):
    with Saga(live_server.url, "sk_wrong_key") as saga, pytest.raises(SagaAuthError) as caught:
        saga.create_run(agent="onboarding", request="r")
    assert caught.value.status == 401 and caught.value.code
    assert caught.value.message and caught.value.message in str(caught.value)
    assert not Run.objects.exists()

    async def agent() -> None:
        async with AsyncSaga(live_server.url, "sk_wrong_key") as saga, saga.run(agent="a", request="r"):
            pass

    with pytest.raises(SagaAuthError) as async_caught:
        asyncio.run(agent())
    assert (async_caught.value.code, async_caught.value.message) == (caught.value.code, caught.value.message)


def test_an_unreachable_server_is_retried_then_saga_unavailable():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        Saga(f"http://127.0.0.1:{port}", "sk_x", retries=2, backoff_s=0.01) as saga,
        pytest.raises(SagaUnavailable) as caught,
        saga.run(agent="onboarding", request="r"),
    ):
        pytest.fail("the run was never created")
    assert caught.value.attempts == 3 and caught.value.code == "unavailable"

    async def agent() -> None:
        async with AsyncSaga(f"http://127.0.0.1:{port}", "sk_x", retries=1, backoff_s=0.01) as saga:
            await saga.get_run("run_x")

    with pytest.raises(SagaUnavailable) as async_caught:
        asyncio.run(agent())
    assert async_caught.value.attempts == 2
