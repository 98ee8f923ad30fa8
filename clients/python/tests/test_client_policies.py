"""Which policy governs a tool, as the client picks it (``saga_client._policies``, the server's
precedence in ``ledger/policies/resolve.py``), and what a step sends when its policy has ``before``,
without a server (the real-server tests are ``tests/client/test_client_before_images.py``)."""

from __future__ import annotations

import asyncio
import json

import pytest
from scripted import Script

from saga_client import AsyncSaga, BeforeImageFailed, Saga
from saga_client._policies import policy_for

RUN = {"id": "run_1", "status": "running"}
BEFORE = {"tool": "inv.get_item", "args": {"sku": "$args.sku"}, "path": "item.price"}
POLICIES = [
    {"tool": "inv.get_item", "scope": "tenant", "before": None},
    {"tool": "inv.set_price", "scope": "tenant", "before": BEFORE},
]


def _action(**extra) -> dict:
    return {
        "id": "act_1",
        "run_id": "run_1",
        "tool": "inv.set_price",
        "args": {"sku": "A-1", "price": 12.5},
        "idempotency_key": "k",
        "attempts": 1,
        "status": "running",
        "approval": None,
        **extra,
    }


@pytest.mark.parametrize(
    ("policies", "tool", "expected"),
    [
        (
            [{"tool": "crm.*", "scope": "tenant"}, {"tool": "crm.update", "scope": "global"}],
            "crm.update",
            "crm.update",
        ),
        (
            [{"tool": "crm.*", "scope": "global"}, {"tool": "crm.up*", "scope": "global"}],
            "crm.update",
            "crm.up*",
        ),
        (
            [{"tool": "crm.*", "scope": "global", "n": 1}, {"tool": "crm.*", "scope": "tenant", "n": 2}],
            "crm.x",
            "crm.*",
        ),
        ([{"tool": "crm.?pdate", "scope": "global"}], "crm.update", "crm.?pdate"),
        ([{"tool": "crm.update", "scope": "tenant"}], "crm.updater", None),
    ],
)
def test_the_client_picks_the_governing_policy_as_the_server_does(policies, tool, expected):
    picked = policy_for(policies, tool)
    assert (picked["tool"] if picked else None) == expected


def test_a_tenant_glob_beats_the_global_one_with_the_same_pattern():
    picked = policy_for([{"tool": "crm.*", "scope": "global"}, {"tool": "crm.*", "scope": "tenant"}], "crm.x")
    assert picked is not None and picked["scope"] == "tenant"


def test_the_images_go_with_the_record_and_the_success():
    script = Script(
        (201, RUN),
        (201, _action()),
        (200, _action(status="succeeded", result="ok")),
        (200, {**RUN, "status": "succeeded"}),
        policies=POLICIES,
    )
    prices = {"A-1": 10}
    saga = Saga("http://saga.test", "k", transport=script.transport)
    saga.reader("inv.get_item")(lambda sku: json.dumps({"item": {"price": prices[sku]}}))

    def set_price(args: dict) -> str:
        prices[args["sku"]] = args["price"]
        return "ok"

    with saga.run(agent="a", request="r") as run:
        run.step("inv.set_price", args={"sku": "A-1", "price": 12.5}, do=set_price)
    assert json.loads(script.seen[1].content)["before_snapshot"] == 10
    assert json.loads(script.seen[2].content)["after_snapshot"] == 12.5
    assert len(script.policy_requests) == 1


def test_the_blocking_client_refuses_an_async_reader_before_recording_anything():
    script = Script((201, RUN), (200, {**RUN, "status": "failed"}), policies=POLICIES)
    saga = Saga("http://saga.test", "k", transport=script.transport)

    @saga.reader("inv.get_item")
    async def get_item(sku: str) -> dict:
        return {"item": {"price": 10}}

    with (
        pytest.raises(BeforeImageFailed, match="cannot await it") as refused,
        saga.run(agent="a", request="r") as run,
    ):
        run.step("inv.set_price", args={"sku": "A-1", "price": 12.5}, do=lambda: "never")
    assert refused.value.read_tool == "inv.get_item"
    assert script.paths() == ["POST /runs", "POST /runs/run_1/fail"]


def test_a_step_that_does_not_need_images_sends_none_and_reads_nothing():
    script = Script(
        (201, RUN),
        (201, _action(tool="inv.get_item", args={"sku": "A-1"})),
        (200, _action(tool="inv.get_item", args={"sku": "A-1"}, status="succeeded")),
        (200, {**RUN, "status": "succeeded"}),
        policies=POLICIES,
    )
    saga = AsyncSaga("http://saga.test", "k", transport=script.transport)

    async def agent() -> None:
        async with saga.run(agent="a", request="r") as run:
            await run.step("inv.get_item", args={"sku": "A-1"}, do=lambda: {"item": {"price": 10}})

    asyncio.run(agent())
    recorded = json.loads(script.seen[1].content)
    assert "before_snapshot" not in recorded
    assert json.loads(script.seen[2].content)["after_snapshot"] is None
