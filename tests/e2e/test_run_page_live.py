"""The run page keeps itself current without a reload: while a compensation someone else started
runs on a real worker and after it finishes, the header, the item's state, the decision buttons
and the nav badge follow (one poll, dashboard.selectors.live); a decision sent from a stale tab is refused
with a sentence, never an exception's text; and no console errors along the way."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import expect
from saga_client.signing import verify_signature

from ledger.audit import Actor
from ledger.models import Compensator
from recovery.actions.compensations import unwind_start
from recovery.models import Approval, RecoveryItem, Unwind
from tests.factories import gated_run, onboarding_run
from tests.support.browser import WEBHOOK_SECRET, login, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

UNDER_WAY = "A compensation is already under way for this run"


class GatedCompensators:
    """Signed webhook compensators that hold every call until the test opens the gate: the
    compensation stays "under way" for as long as the test needs to look at it."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[str] = []
        gate, calls = self.gate, self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if not verify_signature(WEBHOOK_SECRET, dict(self.headers.items()), raw):
                    self.send_response(401)
                    self.end_headers()
                    return
                gate.wait(timeout=35)
                tool = json.loads(raw)["tool"]
                calls.append(tool)
                payload = json.dumps({"state": {"undone": tool}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def gated_compensators() -> Iterator[GatedCompensators]:
    server = GatedCompensators()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    server.gate.set()
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def patient_worker(monkeypatch) -> None:
    """The worker (started after this) waits up to 40 s for a compensator's answer instead of 10:
    the held call must not time out while the test looks at the page."""
    monkeypatch.setenv("SAGA_WEBHOOK_TIMEOUT_S", "40")


def _watch_console(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


def test_the_run_page_follows_a_compensation_without_a_reload(
    page, live_server, patient_worker, rq_worker, gated_compensators, tenant, agent, alice, dave
):
    for tool in ("workspace.cancel_license", "hr.delete_user"):
        Compensator.objects.create(
            tool=tool,
            kind="webhook",
            url=f"{gated_compensators.url}/{tool}",
            secret=WEBHOOK_SECRET,
            source="tests/e2e",
        )
    run, item = onboarding_run(tenant, agent)
    errors = _watch_console(page)

    login(page, "alice")
    page.goto(f"/runs/{run.pk}/")
    header = page.locator("#run-summary")
    item_state = page.locator("#item-summary")
    expect(header).to_have_attribute("data-run-status", "failed")
    expect(page.get_by_role("link", name="Compensate…")).to_be_visible()
    expect(page.locator("#run-live")).to_have_attribute("data-live", "10s")
    # A mark on this document: if the page reloaded, it would be gone.
    page.evaluate("window.__sagaNoReload = 'still here'")

    # A second tab, left stale (its poll stopped, as on a laptop that slept), with the
    # compensation form filled in.
    stale = page.context.new_page()
    stale_errors = _watch_console(stale)
    stale.goto(f"/runs/{run.pk}/")
    stale.get_by_role("link", name="Compensate…").click()
    stale.locator("#decision-panel").get_by_label(re.compile("Reason")).fill("undo the onboarding")
    stale.evaluate("document.getElementById('run-live').remove()")

    # Dave starts the compensation elsewhere; the worker holds on the first compensator call.
    unwind_start(item=item, actor=Actor.for_user(dave), reason="HR withdrew the offer")

    # Alice's page follows without a reload: header, item, buttons, the unwind panel.
    expect(header).to_have_attribute("data-run-status", "compensating", timeout=20_000)
    expect(header).to_contain_text("Compensating")
    expect(item_state).to_have_attribute("data-item-status", "claimed")
    expect(page.locator("#unwind")).to_have_attribute("data-unwind-status", "running")
    for gone in ("Compensate…", "Resume…", "Close…", "Cancel run…", "Flag for review…"):
        expect(page.get_by_role("link", name=gone)).to_have_count(0)
    expect(page.locator("[data-not-offered]")).to_contain_text(UNDER_WAY)
    expect(page.get_by_role("link", name="Stop unwind…")).to_be_visible()
    expect(page.locator("#run-live")).to_have_attribute("data-live", "2s")
    screenshot(page, "run-compensating")

    # The stale tab confirms anyway: refused, in words, and nothing else starts.
    stale.locator("#decision-panel").get_by_role("button", name="Confirm compensation").click()
    message = stale.locator(".message-error")
    expect(message).to_contain_text(UNDER_WAY)
    assert "cannot become" not in message.inner_text() and item.pk not in message.inner_text()
    assert Unwind.objects.filter(run=run).count() == 1

    # The compensator answers; the compensation finishes; the page settles, still without a reload.
    gated_compensators.gate.set()
    expect(header).to_have_attribute("data-run-status", "compensated", timeout=30_000)
    expect(header).to_contain_text("Compensated")
    expect(item_state).to_have_attribute("data-item-status", "resolved")
    expect(page.locator("#unwind")).to_have_attribute("data-unwind-status", "completed")
    expect(page.get_by_role("link", name="Stop unwind…")).to_have_count(0)
    expect(page.locator("[data-not-offered]")).to_contain_text("already been decided")
    expect(page.locator("#trail")).to_contain_text("Put back")
    expect(page.locator("#action-state-1")).to_have_attribute("data-action-status", "compensated")
    expect(page.locator("#run-live")).to_have_attribute("data-live", "settled")
    assert page.evaluate("window.__sagaNoReload") == "still here"
    screenshot(page, "run-compensated")

    item.refresh_from_db()
    assert item.status == RecoveryItem.Status.RESOLVED
    assert gated_compensators.calls == ["workspace.cancel_license", "hr.delete_user"]
    assert errors == [] and stale_errors == []
    assert page.csp_violations == []  # the stale tab's would be among its console errors


def test_the_approvals_badge_drops_when_an_approver_decides(page, live_server, tenant, agent, bob):
    _run, _action, first = gated_run(tenant, agent, amount=40)
    _run, _action, second = gated_run(tenant, agent, amount=75)
    errors = _watch_console(page)

    login(page, "bob")
    page.get_by_role("link", name="Approvals 2 pending").click()
    page.evaluate("window.__sagaNoReload = 'still here'")
    card = page.locator(f"#approval-{first.pk}")
    card.get_by_label("Reason to approve").fill("Double charge confirmed in the ledger")
    card.get_by_label("Reason to approve").press("Enter")
    expect(card).to_contain_text("Approved by bob")
    expect(page.get_by_role("link", name="Approvals 1 pending")).to_be_visible()

    page.locator(f"#approval-{second.pk}").get_by_label("Reason to reject").fill("Not a double charge")
    page.locator(f"#approval-{second.pk}").get_by_label("Reason to reject").press("Enter")
    expect(page.locator(".count-badge")).to_have_count(0)
    expect(page.get_by_role("link", name="Approvals", exact=True)).to_be_visible()
    assert page.evaluate("window.__sagaNoReload") == "still here"
    second.refresh_from_db()
    assert second.status == Approval.Status.REJECTED
    assert errors == [] and page.csp_violations == []
