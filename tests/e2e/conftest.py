"""Browser tests: Playwright (sync API) drives Debian's Chromium against pytest-django's live
server, while a real ``saga_worker`` process — pointed at the same test database and this suite's
Redis — executes the unwinds through signed webhook compensators served by a local HTTP server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.conf import settings
from saga_client.signing import verify_signature

from tests.support.browser import CHROMIUM, WEBHOOK_SECRET
from tests.support.parallel import per_worker
from tests.support.processes import ROOT, database_url_for_subprocesses


@dataclass
class WebhookCall:
    tool: str
    idempotency_key: str
    at: float
    body: dict[str, Any]


@dataclass
class CompensatorServer:
    """The tools' side: records every compensation call, refuses unsigned ones."""

    url: str
    calls: list[WebhookCall] = field(default_factory=list)
    rejected: int = 0


@pytest.fixture
def compensator_server() -> Iterator[CompensatorServer]:
    server_state = CompensatorServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if not verify_signature(WEBHOOK_SECRET, dict(self.headers.items()), raw):
                server_state.rejected += 1
                self.send_response(401)
                self.end_headers()
                return
            body = json.loads(raw)
            # Slow enough that a person (and the test) can watch the steps move.
            time.sleep(0.4)
            server_state.calls.append(
                WebhookCall(
                    tool=body["tool"],
                    idempotency_key=self.headers["Idempotency-Key"],
                    at=time.monotonic(),
                    body=body,
                )
            )
            payload = json.dumps({"state": {"undone": body["tool"]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield server_state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def rq_worker(transactional_db) -> Iterator[subprocess.Popen]:
    """A real worker process on the live test database and this suite's Redis database."""
    import django_rq

    # The worker must listen where this process (the live server) enqueues: RQ's own setting,
    # which a test elsewhere in the session may have pointed at another Redis.
    redis_url = str(settings.RQ_QUEUES["default"]["URL"])
    django_rq.get_connection("default").flushdb()  # only this suite's Redis database: stale jobs
    env: dict[str, str] = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": redis_url,
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "DB_CONN_MAX_AGE": "0",
    }
    log_path = per_worker(ROOT / "artifacts" / "e2e-worker.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    command = [
        sys.executable,
        "manage.py",
        "saga_worker",
        "--no-periodic",
        "-v",
        "2",
        "--name",
        f"e2e-{os.getpid()}",
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    yield process
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
    log.close()


@pytest.fixture(scope="module")
def browser():
    """Chromium for one test module. Not for the session: Playwright's sync API keeps an asyncio
    loop running in this thread while it is open, and a parallel worker that runs an e2e module
    and then an async test (asyncio.run) of another would find that loop still running."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
            headless=True,
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.csp_violations = []

    def on_console(message: Any) -> None:
        if "Content Security Policy" in message.text or "Refused to" in message.text:
            page.csp_violations.append(message.text)

    page.on("console", on_console)
    yield page
    context.close()
