"""Traces are off unless an OTLP endpoint is configured, and then cost nothing: the web process
loads without any of OpenTelemetry's SDK, exporter or instrumentations, and the ledger's span
helpers are switched off. A protocol the installation cannot speak is refused at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from infra import telemetry, tracing
from tests.support.processes import ROOT

# What a web process has loaded once the WSGI application is built: traces' state, and the
# OpenTelemetry tracing modules it imported. (redis-py 8 itself imports the metrics SDK when it is
# installed, and the MCP SDK the API: neither sets anything up.)
PROBE = """
import json, sys
import saga_admin.wsgi
from infra import telemetry, tracing
from ledger.services.actions import recording
print(json.dumps({
    "provider": telemetry.telemetry_provider() is not None,
    "spans_on": tracing.is_on(),
    "otel_modules": sorted(m for m in sys.modules if m.startswith(
        ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.instrumentation")
    )),
    "global_provider": getattr(sys.modules.get("opentelemetry.trace"), "_TRACER_PROVIDER", None) is not None,
    "middleware": [m for m in __import__("django.conf").conf.settings.MIDDLEWARE if "opentelemetry" in m],
}))
"""


def _web_process(**extra: str) -> subprocess.CompletedProcess[str]:
    keep = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={
            **keep,
            "SECRET_KEY": "x" * 50,
            "DEBUG": "0",
            "DATABASE_URL": "postgres://u@127.0.0.1/none",
            **extra,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_an_endpoint_no_provider_exporter_or_instrumentation_is_loaded():
    loaded = _web_process()
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout.strip().splitlines()[-1]) == {
        "provider": False,
        "spans_on": False,
        "otel_modules": [],
        "global_provider": False,
        "middleware": [],
    }


def test_with_an_endpoint_the_web_process_sets_up_the_exporter_and_django():
    loaded = _web_process(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9/")
    assert loaded.returncode == 0, loaded.stderr
    state = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert state["provider"] and state["spans_on"] and state["global_provider"]
    assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in state["otel_modules"]
    assert state["middleware"] == [
        "opentelemetry.instrumentation.django.middleware.otel_middleware._DjangoMiddleware"
    ]


def test_a_protocol_other_than_http_protobuf_refuses_to_start_naming_the_variable():
    loaded = _web_process(
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9/", OTEL_EXPORTER_OTLP_PROTOCOL="grpc"
    )
    assert loaded.returncode != 0
    assert "Saga Admin will not start: OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported" in loaded.stderr


def test_it_reads_the_standard_variables_for_on_and_off():
    assert not telemetry.traces_configured({})
    assert not telemetry.traces_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "})
    assert telemetry.traces_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert telemetry.traces_configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not telemetry.traces_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}
    )
    # The traces-specific protocol wins over the general one.
    telemetry.check_protocol(
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )


def test_the_ledgers_helpers_do_nothing_while_traces_are_off():
    assert not tracing.is_on()  # the suite's own process never starts traces
    assert tracing.carrier_of_current() == {}
    with tracing.unwind_step_span(
        {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, name="x", attributes={}
    ) as span:
        assert span is None


def test_the_worker_refuses_an_unsupported_protocol_too():
    keep = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    worker = subprocess.run(
        [sys.executable, "manage.py", "saga_worker", "--burst"],
        cwd=ROOT,
        env={
            **keep,
            "SECRET_KEY": "x" * 50,
            "DEBUG": "0",
            "DATABASE_URL": "postgres://u@127.0.0.1/none",
            "REDIS_URL": "redis://127.0.0.1:9/0",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 1
    assert (
        "Saga Admin will not start: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json is not supported"
        in worker.stderr
    )
