"""``make bench``'s traces phase: what OpenTelemetry costs the ledger append.

The append (record action, 1 and 16 clients, as the append phase measures it) on the Procfile's
web line three times, one server after another: traces off (no ``OTEL_*`` variable, the default),
traces on (exporting over OTLP/HTTP to a local sink, as a collector on the same host would take
them), and off again, so the two "off" figures show this run's noise. The sink answers every
export at once and decodes the spans only after the windows, so the figures hold the exporter's
cost in the web process, not a collector's.
"""

from __future__ import annotations

import gzip
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from bench import fixtures, procs
from bench.sizes import CLIENT_COUNTS
from bench.stats import log, summarize
from bench.tables import load_row

if TYPE_CHECKING:
    from bench.harness import Harness

ROUNDS = ("off", "on", "off_again")
OTEL_PREFIX = "OTEL_"


@dataclass
class Sink:
    """An OTLP/HTTP endpoint that keeps each export's body, answering 200 at once."""

    port: int = 0
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def span_names(self) -> Counter[str]:
        """Every span received, by name (the first word: ``execute_tool``, ``POST``, ``SELECT``…)."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        names: Counter[str] = Counter()
        with self.lock:
            bodies = list(self.bodies)
        for body in bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    names.update(span.name.split(" ", 1)[0] for span in scope_spans.spans)
        return names


@contextmanager
def serve_sink() -> Iterator[Sink]:
    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                raw = gzip.decompress(raw)
            with sink.lock:
                sink.bodies.append(raw)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    sink.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        httpd.shutdown()
        httpd.server_close()


def measure(harness: Harness) -> dict[str, Any]:
    """The traces phase's figures: ``{round: {"record_action_N": summary}}`` plus what the sink got."""
    keys = fixtures.agent_keys(tenant_slug="bench-traces", count=max(CLIENT_COUNTS))
    fixtures.load_bench_policies(harness.log_dir)
    per_run = 10
    # Fresh runs for up to 800 appends/s, as the servers phase sizes them.
    runs_needed = int(800 * (harness.sizes.warmup_s + harness.sizes.window_s) / per_run / len(keys)) + 2
    out: dict[str, Any] = {}
    with serve_sink() as sink:
        for round_name in ROUNDS:
            env = {k: v for k, v in harness.env_for().items() if not k.startswith(OTEL_PREFIX)}
            if round_name == "on":
                env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_SERVICE_NAME": "saga-bench"})
            web = procs.start(f"web-traces-{round_name}", procs.web_command(), env, harness.log_dir)
            try:
                procs.wait_http(harness.port, "/healthz", web)
                procs.warm_http(harness.port, "/api/v1/policies", web, connections=8)
                for n in CLIENT_COUNTS:
                    log(f"traces {round_name}: record action over HTTP, {n} client(s)")
                    params = {
                        "runs": fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed),
                        "per_run": per_run,
                        "headers_per_client": {
                            i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)
                        },
                    }
                    result = harness.load("record_action", n, params, web=web)
                    out.setdefault(round_name, {})[f"record_action_{n}"] = summarize(result, "record_action")
            finally:
                # A stopped web process exports what it still holds (its exit handler flushes).
                web.stop()
        names = sink.span_names()
    out["exported"] = {"requests": len(sink.bodies), "spans": sum(names.values()), "by_name": dict(names)}
    return out


def phase(h: Harness) -> None:
    h.section("traces").update(measure(h))


# --- The report ----------------------------------------------------------------------------------


def rows(traces: dict[str, Any]) -> list[list[str]]:
    out: list[list[str]] = []
    for n in CLIENT_COUNTS:
        off = traces.get("off", {}).get(f"record_action_{n}")
        for round_name, label in (("off", "off"), ("on", "on, exporting"), ("off_again", "off, again")):
            entry = traces.get(round_name, {}).get(f"record_action_{n}")
            if not entry:
                continue
            note = "–"
            if round_name != "off" and off and off.get("throughput"):
                note = f"{entry['throughput'] / off['throughput']:.0%} of off"
            out.append(load_row(f"traces {label}: record action ({n} clients)", entry, note))
    return out


def targets(traces: dict[str, Any], append: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Off costs nothing: the append with traces off is within this run's noise of the append
    phase's (the larger of 10% and the spread of the two "off" rounds)."""
    off = traces.get("off", {}).get("record_action_16")
    again = traces.get("off_again", {}).get("record_action_16")
    today = append.get("record_action_16", {}).get("record_action")
    name = "append with traces off within noise of the append phase (16 clients)"
    if not (off and again and today and today.get("throughput")):
        return [(name, "not measured", None)]
    best = max(off["throughput"], again["throughput"])
    spread = abs(off["throughput"] - again["throughput"]) / max(off["throughput"], again["throughput"])
    noise = max(0.10, spread)
    ratio = best / today["throughput"]
    measured = f"{best:,.0f}/s vs {today['throughput']:,.0f}/s ({ratio:.0%}; noise ±{noise:.0%})"
    return [(name, measured, ratio >= 1 - noise)]


def markdown(traces: dict[str, Any]) -> list[str]:
    out = [
        "",
        "## Traces",
        "",
        "The append (record action) on the Procfile's web line with traces off (no `OTEL_*` variable), on "
        "(`OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a local OTLP/HTTP sink that answers at once: every "
        "request, its `execute_tool` span and its database spans exported by the batch processor) and off "
        "again, one server after another. Off is the default and loads none of OpenTelemetry; the two off "
        "rounds show this run's noise.",
        "",
    ]
    for round_name in ROUNDS:
        for key, e in traces.get(round_name, {}).items():
            out.append(
                f"- {round_name} / {key}: {e['count']:,} in {e['window_s']:.0f} s, {e['throughput']:,.1f}/s, p50 "
                f"{e['p50_ms']:.1f} ms, p99 {e['p99_ms']:.1f} ms, server CPU "
                f"{(e.get('server_cpu_ms_per_request') or 0):.2f} ms/request, errors {e['errors']}"
            )
    exported = traces.get("exported")
    if exported:
        by_name = ", ".join(
            f"{k} {v:,}" for k, v in sorted(exported["by_name"].items(), key=lambda kv: -kv[1])
        )
        out.append(
            f"- exported while on: {exported['spans']:,} spans in {exported['requests']:,} export requests "
            f"({by_name})"
        )
    return out
