"""One approval, one call, in the Python client: a step whose action another call already moved
to ``running`` never runs ``do`` again — not when the replay of the record reaches it after a
lost answer (a resend), not when its start is a replay of another caller's start. It raises
``StepInDoubt`` while the other call runs, and returns the recorded result once it finished.

Real parts: the live server, the client over real HTTP, and between them a real HTTP proxy that
loses or holds one answer, as a flaky network or a slow hop would.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from saga_client import AsyncSaga, Saga, StepInDoubt

from ledger.audit import Actor
from ledger.models import Action
from recovery.actions.approvals import approval_approve
from recovery.models import Approval
from tests.support.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

STEP: dict[str, Any] = {"target": ("user", "ashu@company.com"), "args": {"email": "ashu@company.com"}}


@dataclass
class Rule:
    """What the proxy does to the first request matching ``method`` and ``path``: ``drop`` its
    answer (the request reaches the server, the client gets a closed connection) or ``hold`` the
    request until ``release`` is set."""

    method: str
    path: str
    effect: str
    release: threading.Event = field(default_factory=threading.Event)
    seen: threading.Event = field(default_factory=threading.Event)
    used: bool = False


@contextmanager
def proxy(upstream: str, rule: Rule) -> Iterator[str]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                applies = not rule.used and self.command == rule.method and re.fullmatch(rule.path, self.path)
                rule.used = rule.used or bool(applies)
            if applies:
                rule.seen.set()
                if rule.effect == "hold":
                    assert rule.release.wait(timeout=60)
            keep = ("authorization", "content-type", "idempotency-key", "accept")
            headers = {k: v for k, v in self.headers.items() if k.lower() in keep}
            answer = httpx.request(
                self.command, upstream + self.path, content=body, headers=headers, timeout=30
            )
            if applies and rule.effect == "drop":
                self.close_connection = True  # the server acted; the client never hears of it
                return
            self.send_response(answer.status_code)
            for name, value in answer.headers.items():
                if name.lower() not in (
                    "content-length",
                    "transfer-encoding",
                    "connection",
                    "content-encoding",
                ):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = _relay

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        rule.release.set()
        server.shutdown()
        server.server_close()


class Tool:
    """The agent's real tool: counts its calls and holds the first one until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, args: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        call = self.calls
        self.entered.set()
        if call == 1:  # a second call (the bug) answers at once, so the test fails fast
            assert self.release.wait(timeout=60)
        return {"call": call, **args}


def first_caller(saga: Saga, run_id: str, tool: Tool, name: str = "hr.create_user") -> threading.Thread:
    """Another process of the same agent running the same step (here a thread with its own client)."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        outcome["result"] = saga.attach(run_id).step(name, do=tool, **STEP)

    thread = threading.Thread(target=work)
    thread.outcome = outcome  # type: ignore[attr-defined]
    thread.start()
    return thread


@pytest.fixture
def tool() -> Iterator[Tool]:
    tool = Tool()
    yield tool
    tool.release.set()  # a failing test must not leave the first caller holding its call


@pytest.fixture
def direct(live_server, agent_key, onboarding_policies) -> Iterator[Saga]:
    saga = Saga(live_server.url, agent_key[1], poll_interval_s=0.05, backoff_s=0.01)
    yield saga
    saga.close()


def test_a_resent_record_that_finds_the_step_running_does_not_run_it_again_sync(
    live_server, agent_key, direct, tool
):
    run = direct.run(agent="onboarding", request="Onboard Ashu").open()
    first = first_caller(direct, run.id, tool)
    assert tool.entered.wait(timeout=30)
    rule = Rule("POST", rf"/api/v1/runs/{run.id}/actions", "drop")
    with proxy(live_server.url, rule) as url, Saga(url, agent_key[1], backoff_s=0.01) as resender:
        again = resender.attach(run.id)
        with pytest.raises(StepInDoubt) as doubt:
            again.step("hr.create_user", do=tool, **STEP)
        assert rule.used  # the first answer was lost: the client sent it again and got a replay
        assert doubt.value.action["status"] == "running" and "not run again" in str(doubt.value)
        assert tool.calls == 1
        tool.release.set()
        first.join(timeout=30)
        # Once the first call reported, the same step returns its recorded result.
        assert again.step("hr.create_user", do=tool, **STEP) == {"call": 1, "email": "ashu@company.com"}
    assert tool.calls == 1
    [action] = Action.objects.filter(tool="hr.create_user")
    assert (action.status, action.attempts) == (Action.Status.SUCCEEDED, 1)


def test_a_resent_record_that_finds_the_step_running_does_not_run_it_again_async(
    live_server, agent_key, direct, tool
):
    run = direct.run(agent="onboarding", request="Onboard Ashu").open()
    first = first_caller(direct, run.id, tool)
    assert tool.entered.wait(timeout=30)
    rule = Rule("POST", rf"/api/v1/runs/{run.id}/actions", "drop")

    async def do(args: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(tool, args)

    async def resend(url: str) -> None:
        async with AsyncSaga(url, agent_key[1], backoff_s=0.01) as resender:
            again = resender.attach(run.id)
            with pytest.raises(StepInDoubt):
                await again.step("hr.create_user", do=do, **STEP)
            assert rule.used and tool.calls == 1
            tool.release.set()
            await asyncio.to_thread(first.join, 30)
            assert await again.step("hr.create_user", do=do, **STEP) == {
                "call": 1,
                "email": "ashu@company.com",
            }

    with proxy(live_server.url, rule) as url:
        asyncio.run(resend(url))
    assert tool.calls == 1


def test_a_start_that_replays_another_callers_start_does_not_run_the_step(
    live_server, agent_key, direct, bob, tool
):
    """Two callers of one gated step both saw it approved; the one whose start comes second gets
    the first one's start replayed (the key is per attempt) and must not run it too."""
    gated: dict[str, Any] = {
        "target": ("customer", "c-9"),
        "args": {"customer": "c-9", "amount": 300, "currency": "EUR"},
    }
    run = direct.run(agent="onboarding", request="Charge the first month").open()
    action = direct.record_action(
        run.id, tool="payments.charge", idempotency_key="charge-c-9", **_body(gated)
    )
    approval_approve(
        approval=Approval.objects.get(action_id=action["id"]), actor=Actor.for_user(bob), reason="ok"
    )
    rule = Rule("POST", rf"/api/v1/actions/{action['id']}/start", "hold")
    with proxy(live_server.url, rule) as url, Saga(url, agent_key[1], backoff_s=0.01) as second:
        outcome: dict[str, Any] = {}

        def second_caller() -> None:
            try:
                outcome["result"] = second.attach(run.id).step(
                    "payments.charge", do=tool, idempotency_key="charge-c-9", **gated
                )
            except StepInDoubt as exc:
                outcome["doubt"] = exc

        thread = threading.Thread(target=second_caller)
        thread.start()
        assert rule.seen.wait(timeout=30)  # it saw the action approved; its start is on the way
        first = threading.Thread(
            target=lambda: direct.attach(run.id).step(
                "payments.charge", do=tool, idempotency_key="charge-c-9", **gated
            )
        )
        first.start()
        assert tool.entered.wait(timeout=30)  # the first caller started it and runs it
        rule.release.set()
        thread.join(timeout=30)
        assert "doubt" in outcome, outcome
        assert tool.calls == 1
        tool.release.set()
        first.join(timeout=30)
    wait_for(lambda: Action.objects.get(pk=action["id"]).status == Action.Status.SUCCEEDED, what="the charge")
    assert tool.calls == 1


def _body(step: dict[str, Any]) -> dict[str, Any]:
    target = step["target"]
    return {"target_type": target[0], "target_id": target[1], "args": step["args"]}
