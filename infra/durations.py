"""Durations, one grammar for every place that reads one: a limit's ``window`` and the
agentSafety ``unwind.timeout`` of a policy file, and the period of a rate setting
(``SAGA_THROTTLE_RATE="60/m"``).

A duration is a number and a unit: ``30s``, ``2m``, ``1h``, ``7d``, ``1.5h``, ``500ms``. The
number is whole or decimal; the unit is one of ``ms``, ``s``, ``m``, ``h`` and ``d``, in either
case, and may be left out (seconds); spaces around either are allowed. What a reader accepts
beyond the grammar is the reader's own rule: a limit's window is a whole number of seconds, at
most 31 days; a step time-out is more than 0 and at most a day (and may also be written as a
plain number of seconds); a rate's period is a whole number of seconds, its number may be left
out (``/m`` is one minute) and its unit may also be a word (``sec``, ``min``, ``hour``, ``day``:
``100/day``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

UNIT_SECONDS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_UNIT_WORDS = {"ms": "millisecond", "s": "second", "m": "minute", "h": "hour", "d": "day"}
# A rate's period may name its unit in a word ("100/day").
_PERIOD_WORDS = {"sec": "s", "min": "m", "hour": "h", "day": "d"}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Duration:
    """A duration as written: its number and its unit (lower case; ``s`` when none was written)."""

    count: Decimal
    unit: str

    @property
    def seconds(self) -> int | float:
        """In seconds: an int when whole (``1.5h`` → 5400), else a float (``500ms`` → 0.5)."""
        seconds = self.count * UNIT_SECONDS[self.unit]
        return int(seconds) if seconds == seconds.to_integral_value() else float(seconds)

    def per(self) -> str:
        """In words, as a rate's denominator: ``per hour``, ``per 15 minutes``."""
        word = _UNIT_WORDS[self.unit]
        return f"per {word}" if self.count == 1 else f"per {self.count} {word}s"


def duration_read(text: str) -> Duration | None:
    """``text`` read by the grammar above, or None when it does not follow it."""
    match = _DURATION.match(text)
    if match is None:
        return None
    unit = match.group(2).lower() or "s"
    if unit not in UNIT_SECONDS:
        return None
    return Duration(count=Decimal(match.group(1)), unit=unit)


def period_read(text: str) -> Duration | None:
    """A rate's period (``"60/m"``'s ``m``): a duration, whose number may be left out (one of its
    unit; nothing at all is one second) and whose unit may be a word (``day``, ``10min``)."""
    match = _DURATION.match(text if text.strip()[:1].isdigit() else f"1{text.strip()}")
    if match is None:
        return None
    unit = match.group(2).lower()
    return duration_read(f"{match.group(1)}{_PERIOD_WORDS.get(unit, unit)}")


def parse_duration(value: Any) -> int | float:
    """A duration or a plain number of seconds → seconds: ``"30s"`` → 30, ``"2m"`` → 120,
    ``"1.5h"`` → 5400, ``"500ms"`` → 0.5, ``45`` → 45. ``ValueError`` for anything else (a
    boolean is not a number of seconds)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration such as 30s or 2m, got '{value}'")
    if isinstance(value, int | float):
        return value
    duration = duration_read(value) if isinstance(value, str) else None
    if duration is None:
        raise ValueError(f"must be a duration such as 30s or 2m, got '{value}'")
    return duration.seconds


# --- Saying a duration (the one humaniser: every page, card, chart and sentence reads these) ----


def duration_short(seconds: float | None) -> str:
    """A duration for a card, a chart or a badge: under a minute in seconds with at most one
    decimal (``0.4s``, ``45s``), else its two largest units in whole numbers (``1m 24s``,
    ``2h 5m``, ``1d 3h``) — the same text the dashboard's script ticks in countdowns. None → "—"."""
    if seconds is None:
        return "—"
    seconds = abs(float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s"


_WORD_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60))


def _counted(count: int, unit: str) -> str:
    return f"{count} {unit}{'s' if count != 1 else ''}"


def duration_words(
    seconds: float | None, *, parts: int = 2, rounded: bool = False, largest: str = "day"
) -> str:
    """A duration for a sentence: "40 seconds", "1 minute", "2 hours 5 minutes", "1 day 3 hours".
    Seconds are said only under a minute. None → "—"; a negative span reads as its size.

    ``parts``: how many units at most, the largest first (units that are zero are skipped).
    ``rounded``: the count is rounded rather than cut — to the second under a minute, else to the
    minute, or with ``parts=1`` to the one unit said ("12 minutes" for 11 min 59 s).
    ``largest``: the largest unit said ("hour": "48 hours" rather than "2 days")."""
    if seconds is None:
        return "—"
    value = abs(float(seconds))
    if value < 60:
        return _counted(round(value) if rounded else int(value), "second")
    units = _WORD_UNITS[[unit for unit, _ in _WORD_UNITS].index(largest) :]
    if parts == 1:
        unit, size = next((unit, size) for unit, size in units if value >= size)
        return _counted(round(value / size) if rounded else int(value // size), unit)
    rest = (round(value / 60) if rounded else int(value // 60)) * 60
    said = []
    for unit, size in units:
        count, rest = divmod(rest, size)
        if count:
            said.append(_counted(count, unit))
    return " ".join(said[:parts])


def ago_words(seconds: float | None) -> str:
    """How long ago, for a sentence: "just now" under a minute (never "0 minutes ago"), else
    "6 minutes ago". A moment in the future (clocks apart) is "just now" too. None → "—"."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return "just now"
    return f"{duration_words(seconds)} ago"
