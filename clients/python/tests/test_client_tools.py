"""``@saga.tool`` without a server: how a call becomes a step, and the errors that come first."""

from __future__ import annotations

import asyncio
import inspect
import json

import pytest
from scripted import Script

from saga_client import AsyncSaga, NoActiveRun, Saga

RUN = {"id": "run_1", "status": "running"}


def _action(args: dict, **extra) -> dict:
    return {
        "id": "act_1",
        "run_id": "run_1",
        "tool": "hr.create_user",
        "args": args,
        "idempotency_key": "k",
        "attempts": 1,
        "status": "running",
        "approval": None,
        **extra,
    }


def test_it_keeps_the_wrapped_functions_name_signature_and_docs():
    saga = Saga("http://saga.test", "k")

    @saga.tool("hr.create_user")
    def create_user(email: str, name: str, *, admin: bool = False) -> dict:
        """Create the HR record."""
        return {}

    assert create_user.__name__ == "create_user" and create_user.__doc__ == "Create the HR record."
    assert (
        str(inspect.signature(create_user))
        == "(email: 'str', name: 'str', *, admin: 'bool' = False) -> 'dict'"
    )
    assert create_user.__saga_tool__ == "hr.create_user"


def test_a_tool_called_outside_a_run_raises_a_clear_error():
    saga = Saga("http://saga.test", "k")

    @saga.tool("hr.create_user")
    def create_user(email: str) -> dict:
        return {}

    with pytest.raises(
        NoActiveRun, match=r"hr.create_user was called outside a run.*with saga.run"
    ) as caught:
        create_user("a@b.c")
    assert caught.value.code == "no_active_run"


def test_an_async_tool_called_outside_an_async_run_raises_too():
    saga = AsyncSaga("http://saga.test", "k")

    @saga.tool("hr.create_user")
    async def create_user(email: str) -> dict:
        return {}

    with pytest.raises(NoActiveRun, match="async with saga.run"):
        asyncio.run(create_user("a@b.c"))


def test_the_blocking_client_refuses_to_decorate_an_async_function():
    saga = Saga("http://saga.test", "k")
    with pytest.raises(TypeError, match="AsyncSaga.tool"):

        @saga.tool("hr.create_user")
        async def create_user(email: str) -> dict:
            return {}


def test_each_call_is_a_step_with_its_arguments_by_name():
    script = Script(
        (201, RUN),
        (201, _action({"email": "a@b.c", "name": "Ashu", "admin": False})),
        (200, _action({}, status="succeeded", result={"id": 7})),
        (200, {**RUN, "status": "succeeded"}),
    )
    saga = Saga("http://saga.test", "k", transport=script.transport)
    received = []

    @saga.tool(
        "hr.create_user",
        target=lambda email: ("user", email),
        compensate=lambda email, **_: ("hr.delete_user", {"email": email}),
    )
    def create_user(email: str, name: str, admin: bool = False) -> dict:
        received.append((email, name, admin))
        return {"id": 7}

    with saga.run(agent="a", request="r"):
        assert create_user("a@b.c", name="Ashu") == {"id": 7}
    assert received == [("a@b.c", "Ashu", False)]
    recorded = json.loads(script.seen[1].content)
    assert recorded["args"] == {"email": "a@b.c", "name": "Ashu", "admin": False}
    assert (recorded["target_type"], recorded["target_id"]) == ("user", "a@b.c")
    assert recorded["compensation"] == {"tool": "hr.delete_user", "args": {"email": "a@b.c"}}


def test_a_call_that_does_not_fit_the_signature_records_nothing():
    script = Script((201, RUN), (200, {**RUN, "status": "failed"}))
    saga = Saga("http://saga.test", "k", transport=script.transport)

    @saga.tool("hr.create_user")
    def create_user(email: str) -> dict:
        return {}

    with pytest.raises(TypeError), saga.run(agent="a", request="r"):
        create_user("a@b.c", "surplus")
    assert script.paths() == ["POST /runs", "POST /runs/run_1/fail"]


def test_approver_edited_args_reach_the_function_by_name():
    gated = _action({"amount": 300, "note": "x"}, status="awaiting_approval", attempts=0)
    approved = _action({"amount": 30, "note": "x"}, status="approved", attempts=0)
    script = Script(
        (201, RUN),
        (201, gated),
        (200, approved),
        (200, {**approved, "status": "running", "attempts": 1}),
        (200, _action({}, status="succeeded", result=30)),
        (200, {**RUN, "status": "succeeded"}),
    )
    saga = AsyncSaga("http://saga.test", "k", transport=script.transport, poll_interval_s=0.001)

    @saga.tool("payments.charge")
    def charge(amount: int, note: str) -> int:  # a sync function: AsyncSaga.tool makes it awaitable
        return amount

    async def agent() -> int:
        async with saga.run(agent="a", request="r"):
            return await charge(300, "x")

    assert asyncio.run(agent()) == 30
    assert script.paths()[2:4] == ["GET /actions/act_1", "POST /actions/act_1/start"]
