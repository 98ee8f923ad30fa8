"""The triggers that make a table append-only to everyone but its owner's migrations: the audit log,
its signed heads, the archived runs' tombstones."""

from __future__ import annotations

import pgtrigger


def append_only_triggers(prefix: str, *, what: str) -> list[pgtrigger.Trigger]:
    """UPDATE and DELETE refused row by row (``<prefix>_append_only``); TRUNCATE, which row
    triggers do not see, refused by a statement trigger (``<prefix>_no_truncate``) saying
    "<what> append-only: TRUNCATE of <table> is refused"."""
    return [
        pgtrigger.Protect(name=f"{prefix}_append_only", operation=pgtrigger.Update | pgtrigger.Delete),
        pgtrigger.Trigger(
            name=f"{prefix}_no_truncate",
            operation=pgtrigger.Truncate,
            when=pgtrigger.Before,
            level=pgtrigger.Statement,
            func=f"RAISE EXCEPTION '{what} append-only: TRUNCATE of % is refused', TG_TABLE_NAME;",
        ),
    ]
