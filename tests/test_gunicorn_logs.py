"""gunicorn's own lines are JSON lines, as docs/CONFIGURATION.md promises of the logs: the web line
started as a deployment starts it, a few requests (one with a key in its query string), and every
line of its output parsed as one JSON object — the access log's one per request with its fields."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import (
    RedisServer,
    database_url_for_subprocesses,
    free_port,
    procfile_web,
    wait_for,
)

# A whole gunicorn: the slow lane.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180), pytest.mark.django_db(transaction=True)]


def test_gunicorns_access_log_is_one_json_object_per_request(own_redis: RedisServer, tmp_path: Path) -> None:
    port = free_port()
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    static = tmp_path / "static"
    static.mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": own_redis.url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "LOG_LEVEL": "INFO",
        "PORT": str(port),
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "2",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
        # Where a deployment's collectstatic put the files (the image does it at build time).
        "STATIC_ROOT": str(static),
    }
    log = tmp_path / "web.log"
    base = f"http://127.0.0.1:{port}"
    with procfile_web(env, log):
        missing = httpx.get(
            f"{base}/api/v1/runs/run_nope?api_key=sk_abc123_topsecretvalue",
            headers={"User-Agent": "ergo-test/1.0", "X-Request-Id": "ergo-req-0001"},
            timeout=10,
        )
        assert missing.status_code == 401

        def access_lines() -> list[dict[str, Any]]:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            for line in lines:
                if not line.startswith("{"):
                    raise AssertionError(f"not a JSON line: {line!r}")
            parsed = [json.loads(line) for line in lines]  # every line is one JSON object
            return [p for p in parsed if p.get("logger") == "gunicorn.access"]

        wait_for(lambda: len(access_lines()) >= 2, timeout=30, what="the access log lines")

    text = log.read_text(errors="replace")
    assert "topsecretvalue" not in text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert any(r.get("logger") == "gunicorn.error" and "Booting worker" in r["event"] for r in records)
    [request] = [r for r in records if r.get("logger") == "gunicorn.access" and r["path"].startswith("/api/")]
    assert request["event"] == "request" and request["level"] == "info"
    assert (request["method"], request["path"], request["status"]) == ("GET", "/api/v1/runs/run_nope", 401)
    assert request["query"] == "api_key=sk_abc123_[redacted]"
    assert request["request_id"] == "ergo-req-0001" and request["user_agent"] == "ergo-test/1.0"
    assert request["remote_addr"] == "127.0.0.1" and request["bytes"] > 0 and request["duration_ms"] >= 0
    assert isinstance(request["pid"], int) and request["timestamp"].endswith("Z")
