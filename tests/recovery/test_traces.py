"""OpenTelemetry traces end to end, against a real OTLP/HTTP receiver (``tests/support/otlp.py``):
the Procfile's web process (gunicorn) and real ``saga_worker`` processes export with
``OTEL_EXPORTER_OTLP_ENDPOINT`` set; the Python client, saga-mcp and an operator send a
``traceparent``; the compensator's webhook receiver sees the unwind's trace carried on."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import django_rq
import httpx
import pytest
from mcp import Client
from mcp_types import RequestParamsMeta
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import format_span_id, format_trace_id
from rq.job import Job
from saga_client import Saga

from recovery.models import Unwind
from tests.factories import HR_PATH, WS_PATH, load_onboarding_policies, onboarding_saga
from tests.support.mcp_servers import http_gateway, http_upstream
from tests.support.otlp import OtlpReceiver, ReceivedSpan, serve_otlp
from tests.support.processes import (
    ROOT,
    RedisServer,
    database_url_for_subprocesses,
    dump_worker_logs,
    free_port,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]

AGENT_TRACER = TracerProvider().get_tracer("the-agent")  # the agent's own SDK, not exported
SECRET_ARG = "s3cret-arg-value@company.com"


def _trace_env(receiver: OtlpReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-token=t0ken",
        "OTEL_SERVICE_NAME": service,
        # Export at once rather than every 5 s: the tests wait for spans, not for the batch timer.
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with serve_otlp() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def web(receiver, redis_server: RedisServer, tmp_path_factory) -> Iterator[str]:
    """The Procfile's web command, traced, on the test database and the throwaway Redis."""
    port = free_port()
    keep = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    env = {
        **keep,
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": redis_server.url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        **_trace_env(receiver, "saga-web-under-test"),
    }
    log = tmp_path_factory.mktemp("web") / "gunicorn.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "gunicorn"),
                "saga_admin.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "--worker-class",
                "gthread",
                "--threads",
                "2",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _answers(url) or process.poll() is not None, timeout=60, what="gunicorn")
            assert process.poll() is None, log.read_text()
            yield url
        finally:
            process.terminate()
            process.wait(timeout=20)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/livez", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return format_trace_id(context.trace_id), format_span_id(context.span_id)


def _one(receiver: OtlpReceiver, name: str, trace_id: str) -> ReceivedSpan:
    def found() -> ReceivedSpan | None:
        spans = [s for s in receiver.named(name) if s.trace_id == trace_id]
        return spans[0] if spans else None

    return cast(ReceivedSpan, wait_for(found, timeout=30, what=f"span {name!r} in trace {trace_id}"))


def _no_secrets(receiver: OtlpReceiver, *values: str) -> None:
    with receiver.lock:
        seen = [(s.name, k, v) for s in receiver.spans for k, v in s.attributes.items()]
    leaked = [entry for entry in seen if any(value in str(entry[2]) for value in values)]
    assert leaked == []


def test_a_recorded_tool_call_is_an_execute_tool_span_in_the_agents_trace(
    receiver, web, agent_key, onboarding_policies, transactional_db
):
    """Pass: the client, inside the agent's span, records an action; the web process exports an
    ``execute_tool hr.create_user`` span in the agent's trace whose parent chain (through the
    Django request span) reaches the agent's span, with the GenAI and saga attributes; the args
    appear nowhere; the exports were gzip'd and carried the configured header."""
    key_row, key = agent_key
    with (
        Saga(web, key, backoff_s=0.01) as saga,
        AGENT_TRACER.start_as_current_span("agent turn") as agent_span,
    ):
        run = saga.create_run(agent="onboarding-agent", request="Onboard a new hire")
        action = saga.record_action(
            run["id"],
            tool="hr.create_user",
            idempotency_key="trace-test-1",
            args={"email": SECRET_ARG, "name": "Ashu Kumar"},
            target_type="user",
            target_id="ashu",
        )
    trace_id, agent_span_id = _ids(agent_span)

    span = _one(receiver, "execute_tool hr.create_user", trace_id)
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == "hr.create_user"
    assert span.attributes["gen_ai.tool.call.id"] == action["id"]
    assert span.attributes["saga.action.id"] == action["id"]
    assert span.attributes["saga.run.id"] == run["id"]
    assert span.attributes["saga.tenant"] == key_row.tenant.slug
    assert span.service == "saga-web-under-test"
    chain = receiver.ancestors(span)
    assert chain[-1] == agent_span_id  # the agent's span, which only the agent has
    request_span = next(s for s in receiver.in_trace(trace_id) if s.span_id == chain[0])
    assert request_span.kind == 2  # SERVER: Django's request span joined the agent's trace
    # The ledger's write inside the tool call is a database span under it.
    assert any(
        s.parent_span_id == span.span_id and s.attributes.get("db.system") == "postgresql"
        for s in receiver.in_trace(trace_id)
    )
    _no_secrets(receiver, SECRET_ARG, key)
    assert receiver.requests[0]["content-encoding"] == "gzip"
    assert receiver.requests[0]["x-collector-token"] == "t0ken"


def test_saga_mcp_passes_the_agents_traceparent_on(receiver, web, agent_key, transactional_db, tmp_path):
    """Pass: an MCP client calls a tool through saga-mcp with ``_meta.traceparent``; the web
    process's ``execute_tool hr.create_user`` span is in that trace."""
    from tests.client.test_mcp_gateway import load_example_policies

    key_row, key = agent_key
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with http_upstream(tmp_path) as upstream:
        load_example_policies(key_row.tenant, tmp_path, upstream.url)
        with http_gateway(web, upstream.url, key, tmp_path) as gateway_url:

            async def call() -> Any:
                async with Client(gateway_url, mode="legacy") as client:
                    return await client.call_tool(
                        "create_user",
                        {"email": SECRET_ARG, "name": "Ashu Kumar"},
                        meta=cast(RequestParamsMeta, {"traceparent": f"00-{trace_id}-{parent_id}-01"}),
                    )

            result = asyncio.run(call())
    assert not result.is_error
    span = _one(receiver, "execute_tool hr.create_user", trace_id)
    assert parent_id in receiver.ancestors(span)


def _finished(unwind_id: str) -> bool:
    return Unwind.objects.get(pk=unwind_id).status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED)


def test_an_unwind_is_one_trace_of_its_steps_carried_on_to_the_compensators(
    receiver, web, tenant, agent, operator_key, webhooks, start_worker
):
    """Pass: an operator (inside a span of its own) asks the API to compensate; a traced worker
    runs the two steps in two jobs; both step spans are in the operator's trace, children of the
    one unwind span; each compensator webhook got a ``traceparent`` of that trace."""
    load_onboarding_policies(webhooks=webhooks)
    saga = onboarding_saga(tenant, agent)
    # A batch of 0 s: the second step runs in a job of its own.
    worker = start_worker(**_trace_env(receiver, "saga-worker-under-test"), SAGA_UNWIND_BATCH_S="0")
    with AGENT_TRACER.start_as_current_span("operator decides") as operator_span:
        trace_id, operator_span_id = _ids(operator_span)
        answer = httpx.post(
            f"{web}/api/v1/recovery/{saga.item.pk}/compensate",
            json={"reason": "the new hire withdrew"},
            headers={
                "Authorization": f"Bearer {operator_key[1]}",
                "traceparent": f"00-{trace_id}-{operator_span_id}-01",
            },
            timeout=10,
        )
    assert answer.status_code == 202, answer.text
    unwind_id = answer.json()["id"]
    try:
        wait_for(lambda: _finished(unwind_id), timeout=40, what="the unwind to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc

    root = _one(receiver, f"unwind {saga.run.pk}", trace_id)
    assert root.attributes["saga.unwind.id"] == unwind_id
    assert operator_span_id in receiver.ancestors(root)
    steps = [
        _one(receiver, "unwind_step workspace.cancel_license", trace_id),
        _one(receiver, "unwind_step hr.delete_user", trace_id),
    ]
    assert {s.parent_span_id for s in steps} == {root.span_id}
    assert {s.attributes["saga.step.outcome"] for s in steps} == {"done"}
    assert {s.attributes["saga.unwind.id"] for s in steps} == {unwind_id}
    assert {s.service for s in steps} == {"saga-worker-under-test"}
    # Two jobs carried the two steps, and still one trace.
    queue = django_rq.get_queue("compensations")
    ran = Counter(
        Job.fetch(job_id, connection=queue.connection).func_name
        for job_id in queue.finished_job_registry.get_job_ids()
    )
    assert ran == {"recovery.jobs.unwind_advance": 1, "recovery.jobs.step_run": 1}
    # The compensators' webhooks carried the trace on: each call's traceparent names a span of
    # the trace under its step.
    calls = {call.path: call for call in webhooks.calls}
    assert set(calls) == {WS_PATH, HR_PATH}
    for call in calls.values():
        version, call_trace, call_parent, _flags = call.headers["traceparent"].split("-")
        assert call_trace == trace_id
        sent_by = _one_by_id(receiver, call_parent)
        assert {a for a in receiver.ancestors(sent_by)} & {s.span_id for s in steps}


def _one_by_id(receiver: OtlpReceiver, span_id: str) -> ReceivedSpan:
    def found() -> ReceivedSpan | None:
        with receiver.lock:
            return next((s for s in receiver.spans if s.span_id == span_id), None)

    return cast(ReceivedSpan, wait_for(found, timeout=30, what=f"span {span_id}"))
