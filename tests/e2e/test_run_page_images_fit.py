"""The run page's before/after/read-back block fits a phone (390 px: the images one under another)
and a laptop (1280 px: side by side), with long values wrapping inside their column: no sideways
scrolling, and every changed member marked in words as well as colour."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.factories import imaged_undo
from tests.support.browser import SCREENSHOTS, login, screenshot
from tests.support.fit import misfits

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "bea.a-very-long-address-that-has-no-place-to-break-" + "x" * 60 + "@example.com"
BEFORE = {
    "email": "bea@old.example",
    "phone": "+44 20 7946 0000",
    "address": {"city": "Leeds", "line1": LONG},
}
AFTER = {"email": "bea@new.example", "phone": "+44 20 7946 0000", "address": {"city": "York", "line1": LONG}}


@pytest.mark.parametrize("width", [390, 1280])
def test_the_images_sit_side_by_side_on_a_laptop_and_stack_on_a_phone(
    browser, live_server, tenant, agent, alice, width
):
    run, action, _step = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="failed",
        verified=False,
        error='The undo was acknowledged, but address.city is "York", not "Leeds".',
        read_checks={
            "now": AFTER,
            "read_back": {**BEFORE, "address": {"city": "York", "line1": LONG}},
            "differences": [{"path": "address.city", "expected": "Leeds", "actual": "York"}],
            "reads": [{"phase": "verify", "tool": "crm.get_contact", "kind": "python", "ok": True}],
        },
    )
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": width, "height": 900},
        device_scale_factor=1,
        is_mobile=width < 600,
        has_touch=width < 600,
    )
    page = context.new_page()
    try:
        login(page, "alice")
        page.goto(f"/runs/{run.pk}/")
        block = page.locator(f"[data-images='{action.seq}']")
        expect(block).to_be_visible()
        columns = block.locator(".image-col")
        expect(columns).to_have_count(4)
        block.scroll_into_view_if_needed()
        screenshot(page, f"run-images-{width}")
        block.screenshot(path=str(SCREENSHOTS / f"run-images-block-{width}.png"))
        boxes = [columns.nth(i).bounding_box() for i in range(4)]
        assert all(box is not None for box in boxes)
        lefts = [round(box["x"]) for box in boxes]
        tops = [round(box["y"]) for box in boxes]
        if width < 600:
            # Stacked: one column, each under the one before.
            assert len(set(lefts)) == 1, lefts
            assert tops == sorted(tops) and len(set(tops)) == 4, tops
        else:
            # Side by side: one row, left to right.
            assert len(set(tops)) == 1, tops
            assert lefts == sorted(lefts) and len(set(lefts)) == 4, lefts
        # Nothing in the block is wider than its box, and each column is on the screen.
        for element in (block, *(columns.nth(i) for i in range(4))):
            widths = element.evaluate("el => [el.scrollWidth, el.clientWidth]")
            assert 0 < widths[0] <= widths[1], widths
        for box in boxes:
            assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5
        # The changed members say so in words (not only by their tint).
        read_back = block.locator("[data-image='read_back'] [data-changed]")
        expect(read_back).to_have_count(1)
        expect(read_back).to_contain_text("not restored")
        expect(block.locator("[data-verdict='not_restored']")).to_contain_text("not restored")
        # And the page does not scroll sideways (nor is anything in it too small to tap).
        assert misfits(page) == []
    finally:
        context.close()
