"""How long the two stores the worker prunes keep their rows: the Idempotency-Key records (the API's
replay store) and the notification outbox's finished rows. Read once, from the environment, when
the settings load, in the one duration grammar (``infra.durations``: ``36h``, ``7d``, ``90d``);
a value that is not a duration, or is below the store's floor, stops every process with a message
naming the variable (manage.py and the web process turn it into one line).

The floors are what correctness needs, not taste:

- Idempotency: the contract keeps a key at least 24 h, and a client that resends a request with
  the same key after its record is gone gets it run again (a second run or checkpoint) or an
  invalid transition instead of the original answer. The clients resend within a minute (four
  retries, backoff to 5 s); an agent framework that paused a graph on a person resumes it and
  resends its keys up to a day later (the default approval deadline, ``SAGA_APPROVAL_EXPIRY_H``).
  So never below a day; by default a week. (An action's own recording key is the action row
  itself, kept with the action; records of an action still in play are never pruned, whatever
  their age: ``ledger.services.idempotency``.)
- Notifications: only delivered, dropped and failed-for-good rows are pruned, never one still to
  be sent; a day at least, so yesterday's failures are still on the Notifications page.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from infra.durations import duration_read, duration_words

DAY_S = 86400
# Beyond this a window is a typo (and a date that far back overflows).
MAX_S = 3650 * DAY_S


@dataclass(frozen=True)
class Window:
    variable: str
    default: str
    floor_s: int
    why_floor: str


IDEMPOTENCY = Window(
    variable="SAGA_IDEMPOTENCY_RETENTION",
    default="7d",
    floor_s=DAY_S,
    why_floor=(
        "the API promises an Idempotency-Key is remembered at least 24 h, and a client resending "
        "a request after its key was forgotten would have it run again instead of replayed"
    ),
)
NOTIFICATIONS = Window(
    variable="SAGA_NOTIFICATION_RETENTION",
    default="30d",
    floor_s=DAY_S,
    why_floor="a failed delivery must stay on the Notifications page at least a day",
)
# The older setting, in whole hours; still read when the new one is not set.
LEGACY_IDEMPOTENCY_HOURS = "SAGA_IDEMPOTENCY_KEY_TTL_H"


def window_seconds(window: Window, text: str) -> int:
    """``text`` (a duration) in whole seconds, at least the window's floor; ``ImproperlyConfigured``
    naming the variable otherwise."""
    duration = duration_read(text)
    if duration is None:
        raise ImproperlyConfigured(
            f"{window.variable}={text.strip()[:40]!r} is not a duration: write a number and a unit "
            f"(s, m, h or d), e.g. {window.default}."
        )
    seconds = duration.seconds
    if seconds != int(seconds):
        raise ImproperlyConfigured(f"{window.variable}={text.strip()}: give a whole number of seconds.")
    if seconds < window.floor_s:
        raise ImproperlyConfigured(
            f"{window.variable}={text.strip()} is shorter than the floor of "
            f"{duration_words(window.floor_s)}: {window.why_floor}. Set it to "
            f"{window.floor_s // DAY_S}d or more (default {window.default})."
        )
    if seconds > MAX_S:
        raise ImproperlyConfigured(f"{window.variable}={text.strip()}: at most {MAX_S // DAY_S}d.")
    return int(seconds)


def idempotency_retention_s(environ: Mapping[str, str] = os.environ) -> int:
    text = environ.get(IDEMPOTENCY.variable, "").strip()
    legacy = environ.get(LEGACY_IDEMPOTENCY_HOURS, "").strip()
    if text and legacy:
        raise ImproperlyConfigured(
            f"Both {IDEMPOTENCY.variable} and {LEGACY_IDEMPOTENCY_HOURS} are set: keep "
            f"{IDEMPOTENCY.variable} only (a duration, e.g. {IDEMPOTENCY.default})."
        )
    if legacy:
        if not legacy.isdigit():
            raise ImproperlyConfigured(
                f"{LEGACY_IDEMPOTENCY_HOURS}={legacy[:40]!r} is not a whole number of hours; "
                f"better, set {IDEMPOTENCY.variable} (a duration, e.g. {IDEMPOTENCY.default})."
            )
        text = f"{legacy}h"
    return window_seconds(IDEMPOTENCY, text or IDEMPOTENCY.default)


def notification_retention_s(environ: Mapping[str, str] = os.environ) -> int:
    text = environ.get(NOTIFICATIONS.variable, "").strip()
    return window_seconds(NOTIFICATIONS, text or NOTIFICATIONS.default)
