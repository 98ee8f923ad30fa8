"""What every phase says about what it measured: the progress line, and a load's summary (the
figures a section keeps for one load, one op)."""

from __future__ import annotations

import time
from typing import Any

from bench.loadgen import LoadResult, percentile


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def summarize(result: LoadResult, op: str | None = None) -> dict[str, Any]:
    lat = result.latencies(op)
    return {
        "clients": result.clients,
        "count": result.count(op),
        "throughput": result.throughput(op),
        "p50_ms": percentile(lat, 50) * 1000,
        "p95_ms": percentile(lat, 95) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "errors": result.error_count(),
        "error_detail": dict(result.errors),
        "client_cpu_s": result.client_cpu_s,
        "server_cpu_ms_per_request": result.server_cpu_ms_per_request,
        "requests_total": result.requests_total,
        "window_s": result.window_s,
    }
