"""An action's before- and after-image and what its undo read, side by side (the run page).

For an action whose policy takes images (its frozen policy has ``before``), or whose undo step
read something: the **before-image** (``Action.before_snapshot``), the **after-image**
(``Action.after_snapshot``), and from the undo step's ``read_checks`` the value read **now**
(before the undo, the drift check) and the value **read back** (after it). Each image is listed
member by member (dotted paths), every column with the same members in the same order, so they
line up side by side; a member that differs from what it is compared with is marked "changed"
in words, not only by colour (``ledger.policies.before_images.image_differences``):

- before and after: what the call changed (each compared with the other);
- now: against the after-image (what someone changed since the agent);
- read back: against the before-image (what the undo did not bring back).

And whether the undo was verified (``UnwindStep.verified``: True, False, or None: no reader, or
not checked yet), in a sentence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ledger.models import Action
from ledger.policies.before_images import image_differences
from recovery.models import UnwindStep

WHOLE = "(the whole value)"
_ABSENT = object()


@dataclass(frozen=True)
class Member:
    path: str
    value: str  # JSON text; "" when the image has no such member
    absent: bool
    changed: bool


@dataclass(frozen=True)
class ImageColumn:
    key: str  # "before" | "after" | "now" | "read_back"
    title: str
    note: str  # what it is compared with
    recorded: bool  # False: there is no such image (the members are then not listed)
    missing: str  # why there is none, when not recorded
    members: list[Member]
    mark: str  # what the column's count of changed members says ("2 changed by the call")

    @property
    def member_mark(self) -> str:
        """The word each changed member carries (its column's mark, shorter where it can be)."""
        return "changed" if self.mark == "changed by the call" else self.mark

    @property
    def changed(self) -> int:
        return sum(1 for m in self.members if m.changed)


@dataclass(frozen=True)
class Verdict:
    code: str  # "verified" | "not_restored" | "drifted" | "unverified" | "read_failed" | "pending" | "failed"
    tone: str  # the status badge's tone: ok, bad, info, warn
    label: str
    sentence: str


@dataclass(frozen=True)
class ActionImages:
    read: str  # the before read's tool ("" when the policy has none)
    path: str  # its path ("" for the whole result)
    columns: list[ImageColumn]
    verdict: Verdict | None  # None: no undo step yet

    @property
    def any_changed(self) -> bool:
        return any(c.changed for c in self.columns)


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Objects flattened to dotted paths (lists are leaves, as ``image_differences`` compares them
    whole); a scalar is the whole value."""
    if isinstance(value, Mapping) and value:
        flat: dict[str, Any] = {}
        for key in value:
            flat.update(_flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix or WHOLE: value}


def _differs(path: str, differences: Iterable[str]) -> bool:
    return any(
        d in (WHOLE, path) or path.startswith(f"{d}.") or d.startswith(f"{path}.") for d in differences
    )


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _column(
    key: str,
    title: str,
    note: str,
    mark: str,
    image: Any,
    *,
    against: Any,
    paths: list[str],
    missing: str,
) -> ImageColumn:
    if image is None:
        return ImageColumn(key, title, note, False, missing, [], mark)
    diffs = {d["path"] for d in image_differences(against, image)} if against is not None else set()
    flat = _flatten(image)
    members = []
    for path in paths:
        value = flat.get(path, _ABSENT)
        members.append(
            Member(
                path=path,
                value="" if value is _ABSENT else _show(value),
                absent=value is _ABSENT,
                changed=_differs(path, diffs),
            )
        )
    return ImageColumn(key, title, note, True, "", members, mark)


def _verdict(step: UnwindStep, read: str) -> Verdict:
    checks = step.read_checks if isinstance(step.read_checks, dict) else {}
    reads = [r for r in checks.get("reads") or [] if isinstance(r, dict)]
    failed_read = next((r for r in reversed(reads) if not r.get("ok")), None)
    if step.status == UnwindStep.Status.DRIFTED:
        return Verdict(
            "drifted",
            "bad",
            "drift: not undone",
            "Not undone: the value read before the undo is not the after-image (someone changed it "
            "since the agent), so the undo did not overwrite it.",
        )
    if step.verified is True:
        return Verdict(
            "verified",
            "ok",
            "verified",
            "Verified: the value read back after the undo equals the before-image.",
        )
    if step.verified is False:
        return Verdict(
            "not_restored",
            "bad",
            "not restored",
            "Not restored: the undo was acknowledged, but the value read back is not the before-image.",
        )
    if failed_read is not None:
        when = (
            "before the undo (the drift check)" if failed_read.get("phase") == "drift" else "after the undo"
        )
        return Verdict(
            "read_failed",
            "bad",
            "not verified",
            f"Not verified: reading the value {when} failed ({failed_read.get('error') or 'no value'}).",
        )
    if step.status == UnwindStep.Status.DONE:
        if any(r.get("phase") == "verify" for r in reads):
            sentence = "Undone, not verified: there was no before-image to compare the value read back with."
        elif read:
            sentence = f"Undone, not verified: no reader is registered for {read}, so nothing was read back."
        else:
            sentence = "Undone, not verified: the policy takes no before-image, so nothing was read back."
        return Verdict("unverified", "warn", "not verified", sentence)
    if step.status in (UnwindStep.Status.FAILED, UnwindStep.Status.SKIPPED):
        return Verdict("failed", "bad", step.get_status_display().lower(), "The undo step did not succeed.")
    return Verdict("pending", "info", "not checked yet", "The undo has not run yet.")


def action_images(action: Action, step: UnwindStep | None) -> ActionImages | None:
    """What the run page shows side by side for ``action`` (``step``: its latest undo step, if
    any); None for an action whose policy takes no images and whose undo read nothing."""
    before_read = action.policy.get("before") if isinstance(action.policy, dict) else None
    checks = step.read_checks if step is not None and isinstance(step.read_checks, dict) else {}
    if not isinstance(before_read, dict) and not checks:
        return None
    read = str(before_read.get("tool", "")) if isinstance(before_read, dict) else ""
    before, after = action.before_snapshot, action.after_snapshot
    now, read_back = checks.get("now"), checks.get("read_back")
    # Every column lists the same members in the same order (by path), so they line up.
    paths: dict[str, None] = {}
    for image in (before, after, now, read_back):
        if image is not None:
            paths.update(dict.fromkeys(_flatten(image)))
    ordered = sorted(paths)
    columns = [
        _column(
            "before",
            "Before-image",
            "read before the call",
            "changed by the call",
            before,
            against=after,
            paths=ordered,
            missing="Not recorded: the undo cannot restore the value exactly.",
        ),
        _column(
            "after",
            "After-image",
            "read after the call",
            "changed by the call",
            after,
            against=before,
            paths=ordered,
            missing="Not recorded: no drift check is possible."
            if action.status != Action.Status.RUNNING
            else "Not yet: the call has not succeeded.",
        ),
    ]
    drifted = step is not None and step.status == UnwindStep.Status.DRIFTED
    not_restored = step is not None and step.verified is False
    if now is not None or drifted:
        columns.append(
            _column(
                "now",
                "Now (before the undo)",
                "compared with the after-image",
                "changed since",
                now,
                against=after,
                paths=ordered,
                missing="No value: the read found nothing there." if drifted else "Not read.",
            )
        )
    if read_back is not None or not_restored:
        columns.append(
            _column(
                "read_back",
                "Read back (after the undo)",
                "compared with the before-image",
                "not restored",
                read_back,
                against=before,
                paths=ordered,
                missing="No value: the read found nothing there.",
            )
        )
    path = str(before_read.get("path") or "") if isinstance(before_read, dict) else ""
    verdict = _verdict(step, read) if step is not None else None
    return ActionImages(read=read, path=path, columns=columns, verdict=verdict)


def images_by_action(actions: Iterable[Action], steps: Mapping[str, UnwindStep]) -> dict[str, ActionImages]:
    """``action_images`` of each action that has them, by action id (``steps``: each action's
    latest undo step, ``dashboard.selectors.runs.latest_undo_steps``)."""
    shown = {}
    for action in actions:
        images = action_images(action, steps.get(action.pk))
        if images is not None:
            shown[action.pk] = images
    return shown
