"""What the browser tests share besides fixtures: signing in, screenshots, the compensators'
webhook secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.processes import ROOT

SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
WEBHOOK_SECRET = "e2e-webhook-secret"


def login(page: Any, username: str, password: str = "correct-horse-battery") -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/")


def screenshot(page: Any, name: str, *, full_page: bool = True) -> Path:
    """The page as shown, under artifacts/screenshots; ``full_page=False``: only the viewport (a
    phone's screen, small enough for the docs)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path
