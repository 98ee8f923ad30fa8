"""The agentSafety ``audit.retention`` setting of a policy file: how long a closed run stays in
PostgreSQL, and where it is archived then (``recovery.archive`` does the archiving).

``"audit": {"retention": {"closed_runs": "90d", "archive": "s3://bucket/prefix"}}`` (``closedRuns``
in the agentSafety layout), per tenant or global; a tenant's whole ``retention`` wins over the
global one. ``closed_runs`` is a duration of the policy grammar (``infra.durations``: ``1s``,
``15m``, ``90d``), more than nothing and at most ``MAX_DAYS``. ``archive`` is a destination the
operator allows (``ledger.archive.destinations``): a tenant admin writes it, so it is checked when
the file is loaded and again before every archive.

A bare string (``"retention": "90d"``, the spelling agentSafety files used before retention was
built, when ``audit`` was only stored) is still accepted and kept as written; it names no
destination, so it archives nothing and does not stand in for the global retention.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from infra.conf import saga
from infra.durations import UNIT_SECONDS, duration_read
from ledger.archive.destinations import Destination, DestinationError, destination_check

KEYS = ("closed_runs", "archive")
MAX_DAYS = 36500


@dataclass(frozen=True)
class Retention:
    """A checked ``retention``: the window as written and in time, and the destination."""

    closed_runs: str
    window: timedelta
    archive: Destination


class RetentionError(ValueError):
    """A ``retention`` that cannot be used; ``problems`` name the key each is about."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _window(value: Any) -> tuple[timedelta | None, str]:
    if not isinstance(value, str):
        return None, f"must be a duration such as 90d, 12h or 15m (a string), got {type(value).__name__}"
    duration = duration_read(value)
    if duration is None:
        return None, f"must be a duration such as 90d, 12h or 15m, got {value[:40]!r}"
    seconds = duration.count * UNIT_SECONDS[duration.unit]
    if seconds < 1:
        return None, f"must be at least 1s, got {value[:40]!r}"
    if seconds > MAX_DAYS * 86400:
        return None, f"must be at most {MAX_DAYS}d, got {value[:40]!r}"
    return timedelta(seconds=float(seconds)), ""


def retention_read(raw: Any) -> Retention:
    """A ``retention`` object checked against the policy grammar and the operator's allow-list;
    ``RetentionError`` listing every problem."""
    if not isinstance(raw, dict):
        raise RetentionError(
            [
                f"must be an object with {' and '.join(KEYS)} (or, kept but archiving nothing, "
                f"a duration string), got {type(raw).__name__}"
            ]
        )
    problems = [f"{key}: unknown key (allowed: {', '.join(KEYS)})" for key in raw if key not in KEYS]
    problems += [f"{key}: is required" for key in KEYS if key not in raw]
    window, problem = _window(raw.get("closed_runs")) if "closed_runs" in raw else (None, "")
    if problem:
        problems.append(f"closed_runs: {problem}")
    destination = None
    if "archive" in raw:
        try:
            destination = destination_check(raw["archive"], saga().archive_allowed_urls)
        except DestinationError as exc:
            problems.append(f"archive: {exc}")
    if problems or window is None or destination is None:
        raise RetentionError(problems)
    return Retention(closed_runs=str(raw["closed_runs"]).strip(), window=window, archive=destination)


def configured(raw: Any) -> bool:
    """Whether a stored ``retention`` configures archiving (a bare string, the earlier spelling,
    does not)."""
    return not isinstance(raw, str)


def retention_problems(audit: Any, prefix: str) -> list[str]:
    """Every problem of a policy file's ``audit.retention`` (as translated to the native layout),
    one line each, naming its place (``agentSafety.audit.retention.archive: …``)."""
    if not isinstance(audit, dict) or "retention" not in audit or not configured(audit["retention"]):
        return []
    try:
        retention_read(audit["retention"])
    except RetentionError as exc:
        return [f"{prefix}audit.retention: {problem}" for problem in exc.problems]
    return []
