"""``make bench``'s audit stream phase: the ledger append (record action over HTTP, the
Procfile's web line) with the audit stream off and on, and with the log as it was before the
stream existed.

- ``before``: ``ledger_event`` without the stream's column default and index (ledger/0019 undone
  for the measurement, put back after): today's append before the audit stream;
- ``off``: the stream's column and index in place, no sink configured (every installation that
  does not use the stream pays this);
- ``on``: a worker delivering every event to a syslog sink on this machine (a TCP receiver that
  reads and counts frames) while the append runs, every second (SAGA_SWEEP_INTERVAL_S=1).

A Procfile worker runs in all three (one without a sink for ``before`` and ``off``, one with the
sink for ``on``), so the figures differ only by the stream. Each is measured twice (once in a
smoke run), interleaved, and the better run kept: the machine is shared and noisy.
"""

from __future__ import annotations

import socketserver
import threading
from typing import TYPE_CHECKING, Any

from bench import fixtures, procs
from bench.sizes import CLIENT_COUNTS
from bench.stats import log, summarize
from bench.tables import machine_limit, measured_row

if TYPE_CHECKING:
    from bench.harness import Harness

MODES = ("before", "off", "on")
LABELS = {
    "before": "append: record action, before the audit stream",
    "off": "append: record action, audit stream off",
    "on": "append: record action, audit stream on (syslog sink)",
}
_DROP = (
    "ALTER TABLE ledger_event ALTER COLUMN stream_txid DROP DEFAULT",
    "DROP INDEX IF EXISTS event_tenant_stream_txid",
)
_RESTORE = (
    "ALTER TABLE ledger_event ALTER COLUMN stream_txid SET DEFAULT pg_current_xact_id()",
    "CREATE INDEX IF NOT EXISTS event_tenant_stream_txid ON ledger_event (tenant_id, stream_txid) "
    "WHERE stream_txid IS NOT NULL",
)


class _Sink(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    frames = 0


def _sink() -> _Sink:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while True:
                digits = b""
                while (byte := self.rfile.read(1)) not in (b"", b" "):
                    digits += byte
                if not digits:
                    return
                self.rfile.read(int(digits))
                server.frames += 1

    server = _Sink(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _sql(statements: tuple[str, ...]) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def phase(harness: Harness) -> None:
    section: dict[str, Any] = harness.section("audit_stream")
    clients = max(CLIENT_COUNTS)
    keys = fixtures.agent_keys(tenant_slug="bench-stream", count=clients)
    fixtures.load_bench_policies(harness.log_dir)
    per_run = 10
    runs_needed = int(1500 * (harness.sizes.warmup_s + harness.sizes.window_s) / per_run / clients) + 2
    sink = _sink()
    web = harness.start_web("web-audit-stream")
    try:
        sink_env = {
            "SAGA_AUDIT_SYSLOG_URL": f"tcp://127.0.0.1:{sink.server_address[1]}",
            "SAGA_AUDIT_KEY": "bench-audit-key",
        }
        for attempt in (1,) if harness.args.smoke else (1, 2):
            # One worker without a sink for "before" and "off" (they differ only in the table),
            # one with the sink for "on".
            for modes, extra in ((("before", "off"), {}), (("on",), sink_env)):
                env = {**harness.env_for(), "SAGA_SWEEP_INTERVAL_S": "1", **extra}
                worker = procs.start(
                    f"worker-audit-{modes[-1]}", procs.worker_command(), env, harness.log_dir
                )
                harness.wait_worker_registered(worker)
                try:
                    for mode in modes:
                        _sql(_DROP if mode == "before" else _RESTORE)
                        log(f"audit stream {mode} (attempt {attempt}): record_action, {clients} clients")
                        runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
                        params = {
                            "runs": runs,
                            "per_run": per_run,
                            "headers_per_client": {
                                i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(clients)
                            },
                        }
                        result = harness.load("record_action", clients, params, web=web)
                        entry = summarize(result, "record_action")
                        entry["errors"] = result.error_count()
                        best = section.get(mode)
                        if best is None or entry.get("throughput", 0) > best.get("throughput", 0):
                            section[mode] = entry
                finally:
                    worker.stop()
        section["frames_received"] = sink.frames
        smoke = harness.args.smoke
        section["in_process"] = _in_process(
            keys[0][0], records=20 if smoke else 2000, rounds=2 if smoke else 5
        )
    finally:
        _sql(_RESTORE)
        web.stop()
        sink.shutdown()
        sink.server_close()


def _in_process(key_id: str, *, records: int, rounds: int) -> dict[str, Any]:
    """The record service called in this process, one client, no HTTP: the database side of the
    append (its one server-side call, where the stream's column default and index entry are paid),
    ``records`` actions per round, ``before`` and ``off`` alternating over ``rounds`` rounds; each
    mode's median round, in microseconds per record."""
    import statistics
    import time
    import uuid

    from ledger.audit import Actor
    from ledger.models import AgentKey
    from ledger.services.actions.recording import action_record
    from ledger.services.runs import run_create

    key = AgentKey.objects.select_related("tenant").get(pk=key_id)
    actor = Actor.for_key(key)
    timings: dict[str, list[float]] = {"before": [], "off": []}
    try:
        for _ in range(rounds):
            for mode in ("before", "off"):
                _sql(_DROP if mode == "before" else _RESTORE)
                runs = [
                    run_create(tenant=key.tenant, actor=actor, agent=key.name, request="bench")
                    for _ in range(records // 10)
                ]
                started = time.perf_counter()
                for n in range(records):
                    run = runs[n // 10]
                    action_record(
                        run=run,
                        actor=actor,
                        tool="bench.update_record",
                        idempotency_key=f"{run.pk}:{n}:{uuid.uuid4().hex[:8]}",
                        target_type="record",
                        target_id=f"{run.pk}-{n}",
                        args={"field": "status", "value": "active", "n": n},
                        intent={"reasoning": "benchmark: set the record active", "confidence": 0.9},
                        compensation={"tool": "bench.undo", "args": {"n": n}},
                    )
                timings[mode].append((time.perf_counter() - started) / records * 1e6)
    finally:
        _sql(_RESTORE)
    return {
        mode: {"us_per_record": statistics.median(values), "rounds_us": values}
        for mode, values in timings.items()
    }


def rows(section: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    out = []
    before = section.get("before", {}).get("throughput")
    for mode in MODES:
        entry = section.get(mode)
        if entry:
            row = measured_row(f"{LABELS[mode]} (16 clients)", entry, machine_limit(base, 16))
            if before and mode != "before":
                row[0] += f" [{entry['throughput'] / before:.0%} of before]"
            out.append(row)
    in_process = section.get("in_process", {})
    if in_process:
        before, off = in_process["before"]["us_per_record"], in_process["off"]["us_per_record"]
        spread = max(in_process["before"]["rounds_us"]) - min(in_process["before"]["rounds_us"])
        out.append(
            [
                "record service in process (1 client): before the stream / stream off",
                "1",
                "–",
                f"{before:.0f} / {off:.0f} µs",
                "–",
                "–",
                "0",
                f"off {off / before:.0%} of before (before's rounds spread {spread:.0f} µs)",
            ]
        )
    return out
