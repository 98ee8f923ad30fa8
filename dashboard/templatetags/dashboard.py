"""Display helpers: pretty JSON, field-by-field snapshot diffs, badges that carry text (colour is
never the only signal), ages and countdowns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join

from infra.conf import saga
from infra.durations import ago_words, duration_short
from recovery import decisions

register = template.Library()

_MISSING = object()


@register.filter
def lookup(mapping: Any, key: Any) -> Any:
    """``{{ flags|lookup:step.tool }}``: a dict's value for a key the template computes ("" if none)."""
    return mapping.get(key, "") if isinstance(mapping, dict) else ""


@register.filter
def pretty_json(value: Any) -> str:
    if value is None:
        return "—"
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class DiffRow:
    path: str
    before: str
    after: str
    change: str  # "added", "removed", "changed", "same"

    @property
    def label(self) -> str:
        return {"added": "added", "removed": "removed", "changed": "changed", "same": "unchanged"}[
            self.change
        ]


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key in value:
            flat.update(_flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix or "(value)": value}


def _show(value: Any) -> str:
    if value is _MISSING:
        return ""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def snapshot_diff_rows(before: Any, after: Any) -> list[DiffRow]:
    """Nested objects flattened to dotted paths, compared field by field, changes first."""
    left = _flatten(before) if before is not None else {}
    right = _flatten(after) if after is not None else {}
    rows = []
    for path in sorted(set(left) | set(right)):
        old, new = left.get(path, _MISSING), right.get(path, _MISSING)
        if old is _MISSING:
            change = "added"
        elif new is _MISSING:
            change = "removed"
        elif old != new:
            change = "changed"
        else:
            change = "same"
        rows.append(DiffRow(path=path, before=_show(old), after=_show(new), change=change))
    order = {"changed": 0, "added": 1, "removed": 2, "same": 3}
    return sorted(rows, key=lambda r: (order[r.change], r.path))


@register.inclusion_tag("dashboard/_snapshot_diff.html")
def snapshot_diff(
    before: Any, after: Any, before_label: str = "Before", after_label: str = "After"
) -> dict[str, Any]:
    rows = snapshot_diff_rows(before, after)
    return {
        "rows": rows,
        "changed": sum(1 for r in rows if r.change != "same"),
        "empty": before is None and after is None,
        "before_label": before_label,
        "after_label": after_label,
    }


# A four-bar meter, filled up to the risk's level: read at a glance, and never a glyph that looks
# like a character ("▁" read as "_"). The word beside it carries the meaning for everyone.
_RISK_LEVELS = {"low": 1, "medium": 2, "high": 3, "critical": 4}


@register.simple_tag
def risk_badge(risk: str) -> str:
    label = str(risk or "low")
    level = _RISK_LEVELS.get(label, 1)
    bars = format_html_join("", '<i class="{}"></i>', (("on" if n <= level else "",) for n in range(1, 5)))
    return format_html(
        '<span class="badge risk risk-{}"><span class="risk-meter" aria-hidden="true">{}</span>{}</span>',
        label,
        bars,
        label.capitalize(),
    )


_STATUS_TONES = {
    "succeeded": "ok",
    "done": "ok",
    "compensated": "ok",
    "completed": "ok",
    "approved": "ok",
    "resolved": "ok",
    "acked": "ok",
    "delivered": "ok",
    "sending": "info",
    "failed": "bad",
    "compensation_failed": "bad",
    "drifted": "bad",
    "rejected": "bad",
    "expired": "bad",
    "unknown": "warn",
    "awaiting_approval": "warn",
    "paused": "warn",
    "pending": "warn",
    "open": "warn",
    "running": "info",
    "queued": "info",
    "compensating": "info",
    "claimed": "info",
}


@register.simple_tag
def status_badge(status: str, label: str = "") -> str:
    text = label or str(status).replace("_", " ")
    return format_html(
        '<span class="badge status status-{}">{}</span>', _STATUS_TONES.get(str(status), "neutral"), text
    )


@register.filter
def duration(seconds: float | None) -> str:
    """A measured duration on a card: the one short form (``infra.durations.duration_short``),
    the same the charts print."""
    return duration_short(seconds)


@register.filter
def ago(when: datetime | str | int | float | None) -> str:
    """How long ago ``when`` was, for a sentence: "just now", "6 minutes ago"
    (``infra.durations.ago_words``). ``when``: a datetime, the ISO string an item's details keep,
    or a number of seconds already elapsed."""
    if isinstance(when, int | float):
        return ago_words(when)
    moment = parse_datetime(when) if isinstance(when, str) else when
    if moment is None:
        return "—"
    return ago_words(max(0.0, (timezone.now() - moment).total_seconds()))


@register.simple_tag
def age_badge(since: datetime) -> str:
    """Time since an item opened, marked past the queue SLA in words as well as colour."""
    age = timezone.now() - since
    text = duration_short(int(age.total_seconds()))
    if age > timedelta(minutes=saga().queue_sla_minutes):
        return format_html(
            '<time class="age age-late" datetime="{}">{}<span class="sla-flag"> · past SLA</span></time>',
            since.isoformat(),
            text,
        )
    return format_html('<time class="age" datetime="{}">{}</time>', since.isoformat(), text)


@register.simple_tag
def countdown(until: datetime) -> str:
    """Expiry countdown; app.js keeps it ticking, the server-rendered text works without it."""
    remaining = until - timezone.now()
    if remaining.total_seconds() <= 0:
        return format_html('<time class="countdown expired" datetime="{}">expired</time>', until.isoformat())
    return format_html(
        '<time class="countdown" data-countdown datetime="{}">expires in {}</time>',
        until.isoformat(),
        duration_short(int(remaining.total_seconds())),
    )


@register.filter
def percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


@register.filter
def confidence(intent: Any) -> str:
    if not isinstance(intent, dict) or intent.get("confidence") is None:
        return ""
    try:
        return f"{float(intent['confidence']) * 100:.0f}%"
    except (TypeError, ValueError):
        return str(intent["confidence"])


@register.simple_tag
def step_decisions(step: Any, unwind: Any) -> Any:
    """``{% step_decisions step unwind as d %}``: what an operator may decide about a step now
    (``recovery.decisions.step_decisions``, the rule the services enforce)."""
    return decisions.step_decisions(step=step, unwind=unwind)
