"""The client's HTTP behaviour, against a scripted transport: retries, keys, typed errors."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from saga_client import (
    Conflict,
    InvalidRequest,
    NotFound,
    Saga,
    ServerError,
    verify_signature,
)
from saga_client.signing import signed_headers


def scripted(*answers):
    """A transport that answers with the given (status, body) pairs in order and records requests."""
    seen: list[httpx.Request] = []
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx.Response(status, json=body, headers={"X-Request-Id": "req-1"})

    return httpx.MockTransport(handler), seen


def error(code: str) -> dict:
    return {"error": {"code": code, "message": code.replace("_", " "), "details": {"x": 1}}}


RUN = {"id": "run_1", "status": "running"}


def test_it_retries_transient_failures_with_the_same_idempotency_key():
    transport, seen = scripted(
        (503, error("service_unavailable")),
        httpx.ConnectError("reset"),
        (409, error("idempotency_key_in_flight")),
        (201, RUN),
    )
    saga = Saga("http://saga.test", "sk_a_b", transport=transport, backoff_s=0.001)
    assert saga.create_run(agent="a", request="r") == RUN
    keys = {request.headers["Idempotency-Key"] for request in seen}
    assert len(seen) == 4 and len(keys) == 1
    assert seen[0].headers["Authorization"] == "Bearer sk_a_b"
    assert seen[0].url.path == "/api/v1/runs"


def test_it_gives_up_after_its_retries_with_a_typed_error():
    transport, seen = scripted(*[(500, error("internal_error"))] * 3)
    saga = Saga("http://saga.test/api/v1", "k", transport=transport, retries=2, backoff_s=0.001)
    with pytest.raises(ServerError) as caught:
        saga.get_run("run_1")
    assert caught.value.status == 500 and caught.value.code == "internal_error"
    assert caught.value.request_id == "req-1" and len(seen) == 3


@pytest.mark.parametrize(
    "status, code, kind",
    [
        (404, "not_found", NotFound),
        (409, "invalid_transition", Conflict),
        (422, "idempotency_key_reused", InvalidRequest),
    ],
)
def test_client_errors_are_not_retried(status, code, kind):
    transport, seen = scripted((status, error(code)))
    saga = Saga("http://saga.test", "k", transport=transport)
    with pytest.raises(kind) as caught:
        saga.complete_run("run_1")
    # The exact type for the status, not just some SagaAPIError (which pytest.raises(kind) already is).
    assert type(caught.value) is kind and caught.value.status == status
    assert caught.value.code == code and caught.value.details == {"x": 1} and len(seen) == 1


def test_a_write_without_a_key_is_not_retried_on_a_connection_error():
    transport, seen = scripted(httpx.ConnectError("reset"), (200, {"commands": []}))
    saga = Saga("http://saga.test", "k", transport=transport, backoff_s=0.001)
    with pytest.raises(httpx.ConnectError):
        saga.heartbeat("run_1")
    assert len(seen) == 1


def test_the_step_key_is_deterministic_and_content_addressed():
    transport, _ = scripted((201, RUN))
    with Saga("http://saga.test", "k", transport=transport).run(agent="a", request="r") as run:
        run._finished = True  # nothing more to report in this unit test
        one = run.step_key("hr.create_user", ("user", "a@b.c"), {"x": 1, "y": 2})
        assert one == run.step_key("hr.create_user", ("user", "a@b.c"), {"y": 2, "x": 1})
        assert one != run.step_key("hr.create_user", ("user", "a@b.c"), {"x": 1, "y": 3})
        assert one.startswith("run_1:")


def test_signatures_verify_for_receivers():
    body = json.dumps({"step_id": "stp_1"}).encode()
    headers = signed_headers("s3cret", body)
    assert verify_signature("s3cret", headers, body)
    assert not verify_signature("s3cret", headers, body + b" ")
    assert not verify_signature("other", headers, body)


def test_importing_the_client_does_not_import_django():
    code = "import sys, saga_client; assert not any(m.startswith('django') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
