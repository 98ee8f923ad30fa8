"""The client's HTTP behaviour against a scripted transport: retries, keys, typed errors — the same
for Saga and AsyncSaga, which drive the same flows."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from scripted import Script, error

from saga_client import (
    ApprovalPending,
    AsyncSaga,
    Conflict,
    InvalidRequest,
    NotFound,
    Paused,
    PolicyDenied,
    RateLimited,
    Saga,
    SagaAuthError,
    SagaError,
    SagaUnavailable,
    ServerError,
    StepInDoubt,
)
from saga_client._core import Api, Send, Settings, Sleep
from saga_client.responses import RunDict

RUN = {"id": "run_1", "status": "running"}


def sync_and_async(script: Script, call: str, *args: Any, **options: Any) -> Any:
    """``call`` on Saga, then on AsyncSaga, with the same script twice: both must behave alike."""
    answers = list(script.answers)
    outcomes = []
    for kind in ("sync", "async"):
        script.answers, script.seen = list(answers), []
        try:
            if kind == "sync":
                saga = Saga(
                    "http://saga.test", "sk_a_b", transport=script.transport, backoff_s=0.001, **options
                )
                outcomes.append(("ok", getattr(saga, call)(*args), list(script.seen)))
            else:

                async def go() -> Any:
                    transport = httpx.MockTransport(script.handle)
                    async with AsyncSaga(
                        "http://saga.test", "sk_a_b", transport=transport, backoff_s=0.001, **options
                    ) as saga:
                        return await getattr(saga, call)(*args)

                outcomes.append(("ok", asyncio.run(go()), list(script.seen)))
        except SagaError as exc:
            outcomes.append(("raised", exc, list(script.seen)))
    (kind_a, value_a, seen_a), (kind_b, value_b, seen_b) = outcomes
    assert kind_a == kind_b and len(seen_a) == len(seen_b)
    if kind_a == "raised":
        assert type(value_a) is type(value_b) and value_a.code == value_b.code
        raise value_a
    assert value_a == value_b
    return value_a


def test_it_retries_transient_failures_with_the_same_idempotency_key():
    script = Script(
        (503, error("service_unavailable")),
        httpx.ConnectError("reset"),
        (409, error("idempotency_key_in_flight")),
        (201, RUN),
    )
    saga = Saga("http://saga.test", "sk_a_b", transport=script.transport, backoff_s=0.001)
    assert saga.create_run(agent="a", request="r") == RUN
    keys = {request.headers["Idempotency-Key"] for request in script.seen}
    assert len(script.seen) == 4 and len(keys) == 1
    assert script.seen[0].headers["Authorization"] == "Bearer sk_a_b"
    assert script.seen[0].url.path == "/api/v1/runs"


def test_the_async_client_retries_with_the_same_key_too():
    script = Script(httpx.ReadTimeout("slow"), (502, error("bad_gateway")), (201, RUN))

    async def go() -> RunDict:
        async with AsyncSaga(
            "http://saga.test", "k", transport=httpx.MockTransport(script.handle), backoff_s=0.001
        ) as saga:
            return await saga.create_run(agent="a", request="r")

    assert asyncio.run(go()) == RUN
    assert len(script.seen) == 3 and len({r.headers["Idempotency-Key"] for r in script.seen}) == 1


def test_it_gives_up_after_its_retries_with_a_typed_error():
    script = Script(*[(500, error("internal_error"))] * 3)
    with pytest.raises(ServerError) as caught:
        sync_and_async(script, "get_run", "run_1", retries=2)
    assert caught.value.status == 500 and caught.value.code == "internal_error"
    assert caught.value.request_id == "req-1"


def test_an_unreachable_server_is_retried_then_saga_unavailable():
    script = Script(*[httpx.ConnectError("connection refused")] * 3)
    with pytest.raises(SagaUnavailable) as caught:
        sync_and_async(script, "get_run", "run_1", retries=2)
    assert caught.value.code == "unavailable" and caught.value.attempts == 3
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert "connection refused" in str(caught.value)


def test_a_wrong_key_is_a_saga_auth_error_with_the_servers_message():
    script = Script((401, error("unauthorized", "Invalid or revoked API key.")))
    with pytest.raises(SagaAuthError) as caught:
        sync_and_async(script, "get_run", "run_1")
    assert caught.value.status == 401 and caught.value.code == "unauthorized"
    assert caught.value.message == "Invalid or revoked API key."


@pytest.mark.parametrize(
    "status, code, kind",
    [
        (404, "not_found", NotFound),
        (409, "invalid_transition", Conflict),
        (409, "paused", Paused),
        (403, "policy_denied", PolicyDenied),
        (403, "forbidden", SagaAuthError),
        (422, "idempotency_key_reused", InvalidRequest),
    ],
)
def test_client_errors_are_not_retried(status, code, kind):
    script = Script((status, error(code)))
    with pytest.raises(kind) as caught:
        sync_and_async(script, "complete_run", "run_1")
    # The exact type for the code and status, not just some SagaAPIError.
    assert type(caught.value) is kind and caught.value.status == status
    assert caught.value.code == code and caught.value.details == {"x": 1}


def test_a_429_is_retried_after_retry_after_then_raised():
    script = Script(*[(429, error("rate_limited"), {"Retry-After": "0"})] * 2)
    with pytest.raises(RateLimited):
        sync_and_async(script, "get_run", "run_1", retries=1)


def test_a_write_without_a_key_is_not_retried_on_a_connection_error():
    script = Script(httpx.ConnectError("reset"), (200, {}))
    saga = Saga("http://saga.test", "k", transport=script.transport, backoff_s=0.001)
    with pytest.raises(SagaUnavailable) as caught:
        saga.request("POST", "/runs/run_1/something", json_body={"x": 1})
    assert caught.value.attempts == 1 and len(script.seen) == 1


def test_a_heartbeat_is_retried_as_it_is_harmless_to_repeat():
    script = Script(httpx.ConnectError("reset"), (200, {"commands": []}))
    assert sync_and_async(script, "heartbeat", "run_1") == []


def test_a_body_that_is_not_json_is_a_typed_error():
    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>proxy login</html>", headers={"Content-Type": "text/html"})

    saga = Saga("http://saga.test", "k", transport=httpx.MockTransport(html))
    with pytest.raises(SagaError) as caught:
        saga.get_run("run_1")
    assert caught.value.code == "invalid_response" and "text/html" in str(caught.value)


def test_approval_waiting_backs_off_and_gives_up_at_the_timeout():
    """The flow itself, driven by hand: no transport, no clock but its own."""
    api = Api(Settings(poll_interval_s=1.0, max_poll_interval_s=3.0, approval_timeout_s=3600))
    flow = api.wait_for_approval({"id": "act_1", "status": "awaiting_approval"})
    sleeps = []
    effect = next(flow)
    while len(sleeps) < 6:
        if isinstance(effect, Sleep):
            sleeps.append(effect.seconds)
            effect = flow.send(None)
        else:
            assert isinstance(effect, Send) and effect.path == "/actions/act_1"
            effect = flow.send(httpx.Response(200, json={"id": "act_1", "status": "awaiting_approval"}))
    assert sleeps == [1.0, 1.5, 2.25, 3.0, 3.0, 3.0]
    flow.close()


def test_the_step_key_is_deterministic_and_content_addressed():
    script = Script((201, RUN))
    with Saga("http://saga.test", "k", transport=script.transport).run(agent="a", request="r") as run:
        run._finished = True  # nothing more to report in this unit test
        one = run.step_key("hr.create_user", ("user", "a@b.c"), {"x": 1, "y": 2})
        assert one == run.step_key("hr.create_user", ("user", "a@b.c"), {"y": 2, "x": 1})
        assert one != run.step_key("hr.create_user", ("user", "a@b.c"), {"x": 1, "y": 3})
        assert one.startswith("run_1:")


ACTION = {
    "id": "act_1",
    "run_id": "run_1",
    "tool": "hr.create_user",
    "args": {"email": "a@b.c"},
    "idempotency_key": "k1",
    "attempts": 1,
    "status": "running",
    "approval": None,
}


def test_a_record_whose_answer_was_lost_is_in_doubt_and_never_run_on_a_guess():
    """record+start went through but the answer was lost; the retry replays (200, running, attempt
    1). The server cannot tell this call's own first send from another caller's request with the
    same key (which may be running it right now), so ``do`` is not run on a guess: StepInDoubt,
    and the run's failure names the action for a person to reconcile."""
    script = Script(
        (201, RUN),
        httpx.ReadError("connection reset after send"),
        (200, ACTION, {"Idempotent-Replayed": "true"}),
        (200, {**RUN, "status": "failed"}),
    )
    calls = []
    saga = Saga("http://saga.test", "k", transport=script.transport, backoff_s=0.001)
    with pytest.raises(StepInDoubt), saga.run(agent="a", request="r") as run:
        run.step("hr.create_user", args={"email": "a@b.c"}, do=lambda: calls.append(1) or {"ok": 1})
    assert calls == []
    assert script.paths() == [
        "POST /runs",
        "POST /runs/run_1/actions",
        "POST /runs/run_1/actions",
        "POST /runs/run_1/fail",
    ]
    assert b'"start":true' in script.seen[1].content.replace(b" ", b"")
    assert b'"failed_action_id":"act_1"' in script.seen[3].content.replace(b" ", b"")


def test_wait_false_raises_approval_pending_and_leaves_the_run_running():
    gated = {
        **ACTION,
        "status": "awaiting_approval",
        "attempts": 0,
        "approval": {"id": "apr_1", "status": "pending"},
    }
    script = Script((201, RUN), (201, gated))
    saga = Saga("http://saga.test", "k", transport=script.transport)
    with pytest.raises(ApprovalPending) as caught, saga.run(agent="a", request="r") as run:
        run.step("payments.charge", args={"amount": 300}, do=lambda: pytest.fail("must not run"), wait=False)
    pending = caught.value
    assert (pending.action_id, pending.approval_id, pending.code) == ("act_1", "apr_1", "approval_pending")
    assert pending.idempotency_key == "k1" and run.pending_approvals.keys() == {"act_1"}
    # Neither completed nor failed: the run waits for the decision.
    assert script.paths() == ["POST /runs", "POST /runs/run_1/actions"]


def test_approval_pending_keeps_the_step_args_apart_from_the_exceptions_own():
    from saga_client import ApprovalPending

    pending = ApprovalPending({"id": "act_1", "tool": "payments.charge", "args": {"amount": 40}})
    assert pending.step_args == {"amount": 40}
    assert pending.args == (str(pending),)
    assert "act_1" in str(pending)
