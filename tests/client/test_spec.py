"""The clients' language-neutral contract (``clients/spec``) against the server and the Python
client: the committed OpenAPI document is the served one, the error codes are the server's, the
generated code tables are current, and the Python client passes the key and error vectors (the
TypeScript client passes the same ones in ``clients/typescript/test/vectors.test.ts``; the
signature vectors are ``test_signature_vectors.py``'s)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from saga_client import Saga
from saga_client._core import Api, Settings
from saga_client._run import RunCore
from saga_client.errors import (
    ApprovalRejected,
    NotFound,
    RunArchived,
    SagaAPIError,
    error_from_response,
    rejection_for,
)

from tests.factories import make_run
from tests.support.archived import archive_run_for_test

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "clients" / "spec"
KEYS = json.loads((SPEC / "vectors" / "keys.json").read_text("utf-8"))
ERRORS = json.loads((SPEC / "vectors" / "errors.json").read_text("utf-8"))


@pytest.mark.django_db
def test_the_committed_openapi_document_is_the_served_one(client):
    served = client.get("/api/v1/openapi.json")
    assert served.status_code == 200
    committed = json.loads((SPEC / "openapi.json").read_text("utf-8"))
    assert served.json() == committed, (
        "clients/spec/openapi.json differs from the served document: run "
        "`python scripts/generate_client_spec.py`, then `npm run generate` in clients/typescript"
    )


def test_the_generated_code_tables_are_current():
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_client_spec.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# How the server's source names an error code: a class's ``code``, a ``code=`` argument, the
# request gate's ``error_json(status, "code", …)`` and the HTTP errors' table.
_CODE_PATTERNS = [
    re.compile(r'\bcode\s*(?::\s*str\s*)?=\s*"([a-z_]+)"'),
    re.compile(r'error_json\(\s*\d+,\s*"([a-z_]+)"'),
    re.compile(r'^\s*\d{3}: "([a-z_]+)",$', re.MULTILINE),
    re.compile(r'codes\.get\([^,]+,\s*"([a-z_]+)"'),
]


def _server_codes() -> set[str]:
    found: set[str] = set()
    for package in ("infra", "ledger", "recovery", "saga_admin"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            text = path.read_text("utf-8")
            for pattern in _CODE_PATTERNS:
                found.update(pattern.findall(text))
    return found


def test_the_spec_lists_exactly_the_codes_the_server_answers_with():
    spec = json.loads((SPEC / "errors.json").read_text("utf-8"))
    server = _server_codes()
    assert "run_not_accepting_actions" in server  # the scan reads what it should
    assert set(spec["api"]) == server, {
        "in the server, not the spec": sorted(server - set(spec["api"])),
        "in the spec, not the server": sorted(set(spec["api"]) - server),
    }


@pytest.mark.parametrize("vector", KEYS["step_keys"], ids=[v["name"] for v in KEYS["step_keys"]])
def test_the_python_client_derives_step_keys_as_specified(vector: dict[str, Any]):
    run = RunCore(Api(Settings()), agent="a", request="r", fields={}, run_id=vector["run_id"])
    target = tuple(vector["target"]) if vector["target"] else None
    assert run.step_key(vector["tool"], target, vector["args"]) == vector["expected"]


class _Recorder:
    """Drives one flow to its first request and keeps that request's idempotency key."""

    @staticmethod
    def key(flow: Any) -> str:
        send = next(flow)
        return str(send.headers.get("Idempotency-Key") or send.json.get("idempotency_key"))


@pytest.mark.parametrize("vector", KEYS["action_keys"])
def test_the_python_client_derives_action_keys_as_specified(vector: dict[str, Any]):
    api, action = Api(Settings()), {"id": "act_1", **vector["action"]}
    assert _Recorder.key(api.start(action)) == vector["start"]
    assert _Recorder.key(api.succeed_action(action, result=None)) == vector["succeed"]
    assert _Recorder.key(api.fail_action(action, error="boom")) == vector["fail"]


def test_the_python_client_derives_run_and_command_keys_as_specified():
    api = Api(Settings())
    for vector in KEYS["run_keys"]:
        assert _Recorder.key(api.complete_run(vector["run_id"])) == vector["complete"]
    for vector in KEYS["command_keys"]:
        assert _Recorder.key(api.ack_command(vector["command_id"])) == vector["ack"]


@pytest.mark.parametrize("vector", ERRORS["answers"], ids=[v["name"] for v in ERRORS["answers"]])
def test_the_python_client_reads_error_answers_as_specified(vector: dict[str, Any]):
    response = httpx.Response(
        vector["status"],
        content=vector["body"].encode(),
        headers=vector["headers"],
        extensions={"reason_phrase": vector["reason"].encode()},
    )
    error = error_from_response(response)
    expected = vector["expected"]
    assert type(error).__name__ == expected["class"]
    assert (error.code, error.message, error.details, error.request_id) == (
        expected["code"],
        expected["message"],
        expected["details"],
        expected["request_id"],
    )


@pytest.mark.parametrize("vector", ERRORS["rejections"], ids=[v["name"] for v in ERRORS["rejections"]])
def test_the_python_client_raises_rejections_as_specified(vector: dict[str, Any]):
    rejected = rejection_for(vector["action"])
    expected = vector["expected"]
    assert type(rejected).__name__ == expected["class"]
    assert isinstance(rejected, ApprovalRejected) is expected["is_rejection"]
    assert (rejected.code, rejected.reason, str(rejected)) == (
        expected["code"],
        expected["reason"],
        expected["message"],
    )


@pytest.mark.parametrize("vector", ERRORS["answers"], ids=[v["name"] for v in ERRORS["answers"]])
def test_the_python_client_retries_the_answers_the_spec_retries(vector: dict[str, Any]):
    calls = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(vector["status"], content=vector["body"].encode(), headers=vector["headers"])

    saga = Saga(
        "http://saga.invalid", "sk_test", retries=1, backoff_s=0, transport=httpx.MockTransport(answer)
    )
    with pytest.raises(SagaAPIError):
        saga.get_run("run_1")
    assert calls == (2 if vector["expected"]["retried"] else 1)


@pytest.mark.django_db
def test_the_server_answers_errors_in_the_shape_the_vectors_assume(client, tenant, agent, agent_key):
    gone = archive_run_for_test(make_run(tenant, agent), "s3://saga-archive/acme/run.manifest.json")
    archived = client.get(f"/api/v1/runs/{gone.run_id}", HTTP_AUTHORIZATION=f"Bearer {agent_key[1]}")
    unauthenticated = client.get("/api/v1/runs/run_x")
    missing = client.get("/api/v1/runs/run_x", HTTP_AUTHORIZATION=f"Bearer {agent_key[1]}")
    invalid = client.post(
        "/api/v1/runs",
        data=b'{"agent": "a"}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {agent_key[1]}",
    )
    for answer, cls, code in [
        (unauthenticated, "SagaAuthError", "unauthorized"),
        (missing, "NotFound", "not_found"),
        (invalid, "InvalidRequest", "invalid_request"),
        (archived, "RunArchived", "archived"),
    ]:
        body = answer.json()
        assert set(body) == {"error"} and {"code", "message", "details"} <= set(body["error"]), body
        error = error_from_response(httpx.Response(answer.status_code, content=answer.content))
        assert (type(error).__name__, error.code) == (cls, code)
        assert error.code in json.loads((SPEC / "errors.json").read_text("utf-8"))["api"]
    error = error_from_response(httpx.Response(archived.status_code, content=archived.content))
    assert isinstance(error, RunArchived) and isinstance(error, NotFound) and error.status == 410
    assert (error.archive, error.archived_at) == (gone.archive, gone.archived_at.isoformat())
