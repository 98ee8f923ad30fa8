"""The run page shows, per action whose policy takes images, its before-image, after-image and what
its undo read (now, read back) side by side, the differing members marked in words, and whether the
undo was verified; the unwind's step shows the reads' differences next to the worker's sentence."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from ledger.services import runs
from tests.factories import imaged_undo, load_onboarding_policies, perform_action

pytestmark = pytest.mark.django_db

BEFORE = {"email": "bea@old.example", "phone": "+44 1"}
AFTER = {"email": "bea@new.example", "phone": "+44 1"}


def _body(client, user, run) -> str:
    client.force_login(user)
    response = client.get(reverse("dashboard:run-detail", args=[run.pk]))
    assert response.status_code == 200
    return response.content.decode()


def _images(body: str, seq: int) -> str:
    found = re.search(rf'<section class="action-images"[^>]*data-images="{seq}".*?</section>', body, re.S)
    assert found is not None, "no images block"
    return found[0]


def _columns(block: str) -> dict[str, dict[str, tuple[str, bool]]]:
    """Each column's members: path → (value shown, marked changed)."""
    columns = {}
    for key, inner in re.findall(r'<div class="image-col" data-image="([a-z_]+)"(.*?)</dl>', block, re.S):
        members = {}
        for attrs, value in re.findall(
            r'<div class="image-member[^"]*" (data-path="[^"]+"[^>]*)>(.*?)</div>', inner, re.S
        ):
            path = re.search(r'data-path="([^"]+)"', attrs)
            shown = re.search(
                r"<dd>(?:<code>(.*?)</code>|<span class=\"muted\">(absent)</span>)", value, re.S
            )
            assert path is not None and shown is not None, value
            members[path[1]] = (shown[1] or shown[2], "data-changed" in attrs)
        columns[key] = members
    return columns


def _verdict(block: str) -> str:
    found = re.search(r'data-verdict="([a-z_]+)"', block)
    return found[1] if found else ""


def test_a_verified_undo_shows_the_three_images_and_says_verified(client, tenant, agent, carol):
    run, action, _step = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="done",
        verified=True,
        read_checks={"now": AFTER, "read_back": BEFORE, "differences": [], "reads": []},
    )
    block = _images(_body(client, carol, run), action.seq)
    assert "read by <code>crm.get_contact</code> at <code>contact</code>" in block
    columns = _columns(block)
    assert list(columns) == ["before", "after", "now", "read_back"]
    # What the call changed is marked in the before- and after-image, in words.
    assert columns["before"] == {
        "email": ("&quot;bea@old.example&quot;", True),
        "phone": ("&quot;+44 1&quot;", False),
    }
    assert columns["after"]["email"] == ("&quot;bea@new.example&quot;", True)
    assert "changed by the call" in block
    # Now equals the after-image, and the read back equals the before-image: nothing marked.
    assert not any(changed for _, changed in columns["now"].values())
    assert not any(changed for _, changed in columns["read_back"].values())
    assert _verdict(block) == "verified" and "equals the before-image" in block


def test_a_not_restored_undo_marks_what_did_not_come_back(client, tenant, agent, carol):
    sentence = 'The undo was acknowledged but email is "bea@new.example", not "bea@old.example".'
    run, action, step = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="failed",
        verified=False,
        error=sentence,
        read_checks={
            "now": AFTER,
            "read_back": AFTER,
            "differences": [{"path": "email", "expected": "bea@old.example", "actual": "bea@new.example"}],
            "reads": [{"phase": "verify", "tool": "crm.get_contact", "kind": "python", "ok": True}],
        },
    )
    body = _body(client, carol, run)
    block = _images(body, action.seq)
    columns = _columns(block)
    assert columns["read_back"]["email"] == ("&quot;bea@new.example&quot;", True)
    assert columns["read_back"]["phone"][1] is False
    assert "not restored" in block and _verdict(block) == "not_restored"
    # The unwind's step: the worker's sentence, and next to it the differences its reads found.
    step_match = re.search(r'data-step-tool="crm.update_contact">.*?</li>\s*</ol>', body, re.S)
    assert step_match is not None
    step_html = step_match[0]
    assert "bea@new.example&quot;, not &quot;bea@old.example&quot;" in step_html
    differences = re.search(
        r'<div class="step-differences" data-step-differences="failed">(.*?)</div>', step_html, re.S
    )
    assert differences is not None and "Read back, against the before-image" in differences[1]
    assert '<li data-path="email">' in differences[1] and "changed" in differences[1]


def test_a_drift_shows_the_value_now_and_says_it_was_not_overwritten(client, tenant, agent, carol):
    now = {"email": "bea@hand-edit.example", "phone": "+44 1"}
    run, action, _step = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="drifted",
        error='Someone changed crm.get_contact since the agent: email is now "bea@hand-edit.example".',
        read_checks={
            "now": now,
            "differences": [
                {"path": "email", "expected": "bea@new.example", "actual": "bea@hand-edit.example"}
            ],
            "reads": [{"phase": "drift", "tool": "crm.get_contact", "kind": "python", "ok": True}],
        },
    )
    body = _body(client, carol, run)
    block = _images(body, action.seq)
    columns = _columns(block)
    assert list(columns) == ["before", "after", "now"]
    assert columns["now"]["email"] == ("&quot;bea@hand-edit.example&quot;", True)
    assert "changed since" in block and _verdict(block) == "drifted"
    assert '<div class="step-differences" data-step-differences="drifted">' in body
    assert "Now, against the after-image" in body


def test_an_undo_without_a_reader_says_it_was_not_verified(client, tenant, agent, carol):
    run, action, _step = imaged_undo(tenant, agent, before=BEFORE, after=AFTER, step_status="done")
    block = _images(_body(client, carol, run), action.seq)
    assert list(_columns(block)) == ["before", "after"]
    assert _verdict(block) == "unverified" and "no reader is registered for crm.get_contact" in block


def test_a_missing_before_image_is_said_and_an_action_without_images_has_no_block(
    client, tenant, agent, carol
):
    run, blind, _ = imaged_undo(tenant, agent, before=None, after=AFTER)
    load_onboarding_policies()
    plain = perform_action(run, agent, "hr.create_user", target_id="u-1", args={"email": "u@x"})
    body = _body(client, carol, run)
    block = _images(body, blind.seq)
    assert "Not recorded: the undo cannot restore the value exactly." in block
    assert _verdict(block) == ""  # no undo yet
    assert f'data-images="{plain.seq}"' not in body


def test_a_scalar_image_is_shown_as_the_whole_value(client, tenant, agent, carol):
    run = runs.run_create(tenant=tenant, actor=agent, agent="inv", request="Set the price")
    run, action, _ = imaged_undo(
        tenant,
        agent,
        run=run,
        before=12.5,
        after=14,
        step_status="failed",
        verified=False,
        read_checks={"now": 14, "read_back": 14, "differences": [], "reads": []},
    )
    columns = _columns(_images(_body(client, carol, run), action.seq))
    assert columns["before"] == {"(the whole value)": ("12.5", True)}
    assert columns["read_back"] == {"(the whole value)": ("14", True)}


def test_the_load_more_page_shows_the_images_too(client, tenant, agent, carol):
    run, action, _ = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="done",
        verified=True,
        read_checks={"read_back": BEFORE, "differences": [], "reads": []},
    )
    client.force_login(carol)
    response = client.get(
        reverse("dashboard:run-detail", args=[run.pk]),
        headers={"HX-Request": "true", "HX-Target": "load-more"},
    )
    assert response.status_code == 200
    assert f'data-images="{action.seq}"' in response.content.decode()


def test_the_poll_brings_the_read_back_and_the_verdict_without_a_reload(client, tenant, agent, carol):
    from urllib.parse import parse_qsl, urlsplit

    from recovery.models import Unwind, UnwindStep

    run, action, _ = imaged_undo(tenant, agent, before=BEFORE, after=AFTER)
    page = _body(client, carol, run)
    assert _verdict(_images(page, action.seq)) == ""
    start = page.index('id="run-live"')
    tag = page[start : page.index(">", start)]
    url = tag.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    # The worker undoes it and reads it back (written as it would leave the step).
    unwind = Unwind.objects.create(tenant=tenant, run=run, reason="undo", status=Unwind.Status.COMPLETED)
    UnwindStep.objects.create(
        unwind=unwind,
        action=action,
        position=0,
        tool=action.compensation_tool,
        status="done",
        idempotency_key="s-1",
        verified=True,
        read_checks={"now": AFTER, "read_back": BEFORE, "differences": [], "reads": []},
    )
    response = client.get(
        reverse("dashboard:run-live", args=[run.pk]),
        dict(parse_qsl(urlsplit(url).query)),
        headers={"HX-Request": "true"},
    )
    assert response.status_code in (200, 286)
    swapped = re.search(
        rf'<section class="action-images" id="images-{action.seq}"[^>]*hx-swap-oob="true".*?</section>',
        response.content.decode(),
        re.S,
    )
    assert swapped is not None
    assert _verdict(swapped[0]) == "verified" and 'data-image="read_back"' in swapped[0]


def test_a_failed_read_back_says_not_verified_and_why(client, tenant, agent, carol):
    run, action, _ = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="failed",
        error="Reading the value after the undo, which the compensator reported done: timed out",
        read_checks={
            "now": AFTER,
            "read_back": None,
            "differences": [],
            "reads": [
                {"phase": "drift", "tool": "crm.get_contact", "kind": "python", "ok": True, "error": ""},
                {
                    "phase": "verify",
                    "tool": "crm.get_contact",
                    "kind": "python",
                    "ok": False,
                    "error": "timed out",
                },
            ],
        },
    )
    block = _images(_body(client, carol, run), action.seq)
    assert _verdict(block) == "read_failed" and "reading the value after the undo failed (timed out)" in block
    assert list(_columns(block)) == ["before", "after", "now"]


def test_a_value_gone_after_the_undo_is_not_restored_with_no_value_read_back(client, tenant, agent, carol):
    run, action, _ = imaged_undo(
        tenant,
        agent,
        before=BEFORE,
        after=AFTER,
        step_status="failed",
        verified=False,
        read_checks={"now": AFTER, "read_back": None, "differences": [], "reads": []},
    )
    block = _images(_body(client, carol, run), action.seq)
    assert _verdict(block) == "not_restored"
    assert 'data-image="read_back"' in block and "No value: the read found nothing there." in block
