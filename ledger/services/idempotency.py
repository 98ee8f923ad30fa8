"""Idempotency-Key records (the API's replay store, ``saga_admin/api/idempotency.py``): pruning
them once they are older than the window, ``SAGA_IDEMPOTENCY_RETENTION`` (``ledger.prune_windows``:
7 days by default, never less than one). A periodic job of the worker's and ``manage.py prune``;
the HTTP side owns how a record is claimed and replayed.

What is never pruned, whatever its age:

- a record of an action still in play (planned, awaiting approval, approved, running or with an
  unknown outcome): its ``…/start`` key is how a second caller of the action learns that the first
  one started it (a replay, not a second call), and that must hold however long the action waits
  for a person or runs;
- a record still being written (``in_flight``; such a row is uncommitted, so never seen, but the
  rule does not depend on it).

Recording an action is not in this store at all: the action row is its own idempotency record
(the body's ``idempotency_key``), kept with the action.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from infra.conf import saga
from ledger import pruning
from ledger.models import Action, IdempotencyRecord
from ledger.prune_windows import IDEMPOTENCY

# The action states in which its records are kept: it may still be started, run or reported.
LIVE_ACTION_STATES = (
    Action.Status.PLANNED,
    Action.Status.AWAITING_APPROVAL,
    Action.Status.APPROVED,
    Action.Status.RUNNING,
    Action.Status.UNKNOWN,
)

# An action transition's path: /api/v1/actions/<action id>/<verb> (any script prefix before it).
_ACTION_OF_PATH = r"/actions/([^/]+)/[^/]+$"

STORE = pruning.Store(
    name="idempotency",
    table=IdempotencyRecord._meta.db_table,
    time="created_at",
    # A scalar subquery, looked up per candidate through the action's primary key (an EXISTS would
    # be planned as a join, which may read every action).
    keep=(
        "t.state <> 'completed' OR COALESCE((SELECT a.status FROM ledger_action AS a"
        " WHERE a.id = substring(t.path FROM %s) AND a.tenant_id = t.tenant_id) = ANY(%s), FALSE)"
    ),
    keep_params=(_ACTION_OF_PATH, [str(state) for state in LIVE_ACTION_STATES]),
)


def idempotency_cutoff(now: datetime | None = None) -> datetime:
    """Records created before this are past the window (never less than the floor, whatever the
    settings dict was given after start-up)."""
    window_s = max(saga().idempotency_retention_s, IDEMPOTENCY.floor_s)
    return (now or timezone.now()) - timedelta(seconds=window_s)


def idempotency_prune(
    *, now: datetime | None = None, batch_size: int = pruning.BATCH, dry_run: bool = False
) -> int:
    """Delete the records past the window that nothing still needs, ``batch_size`` per statement
    (``ledger.pruning``); return how many (a dry run: how many would go). Safe to run
    concurrently and repeatedly."""
    return pruning.store_prune(STORE, cutoff=idempotency_cutoff(now), batch_size=batch_size, dry_run=dry_run)
