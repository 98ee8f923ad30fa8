"""A tool policy's limits, checked when an action is recorded.

A limit counts the recorded, not rejected actions of the same tool in a sliding window — of the
tenant (``per: tenant``) or of the recording agent (``per: agent``: the recording key's name,
stored on each action as ``Action.owner``; the name a run declares plays no part) — either how
many (``max_count``) or the sum of one numeric arg (``sum_arg`` + ``max_sum``). A call that would
go over needs manual approval (``on_exceed: approve``, the default) or is refused (``deny`` →
``PolicyDenied``).

Concurrent records cannot overshoot: before counting, the record takes a transaction-scoped
advisory lock per (tenant, tool, limit scope), so records of one tool by one agent (or one tenant)
count one after another, each seeing the rows of those committed before it; the lock is released
when the record commits. Locks are taken in one sorted statement (no deadlock between records
holding them in another order), and the counts are one statement after it: two round trips,
each an index range scan (``action_limit_owner``, ``action_tenant_tool``). A count stops at
``max_count`` rows (``LIMIT``), so a busy tool does not make the check slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection

from infra import errors
from ledger.policies.resolve import ResolvedPolicy
from ledger.policies.rules import Limit, is_number, value_at


@dataclass(frozen=True)
class LimitExceeded:
    """The limit a call would exceed (and with ``on_exceed: approve`` it then waits for a person)."""

    limit: Limit
    used: Any  # the count, or the sum, in the window before this call (None: not a sum of numbers)
    this: Any  # 1, or this call's amount (None: not a finite number)

    def stamp(self) -> dict[str, Any]:
        """What the action records about it (``policy.limit``)."""
        return {
            **self.limit.stamp(),
            "on_exceed": self.limit.on_exceed,
            "used": float(self.used) if isinstance(self.used, Decimal) else self.used,
            "this": self.this,
        }


def _amount(args: Any, limit: Limit) -> Decimal | None:
    """This call's amount for a sum limit: a finite number (a negative one counts as 0); None when
    the value is missing, malformed (the path runs through another kind) or not a finite number."""
    value = value_at(args, limit.sum_arg)
    # ``is_number`` is false for MISSING, MALFORMED, NaN and the infinities as for any non-number.
    if not is_number(value):
        return None
    amount = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    return max(amount, Decimal(0))


# Each limit's count as a scalar subquery; every value is a parameter. ``count`` stops at the
# limit's max_count rows. The sum adds the numeric values at a path, and is NULL when the window
# holds a value that is not a number (missing, malformed, text, …): a person let that call through,
# and what the tool made of it — "900" may have moved 900 — cannot be shown to leave room. The
# inner CASE stays: the aggregate runs over every row whatever the outer CASE picks, and a cast of
# a JSON string to numeric would fail.
_COUNT = {
    "tenant": "(SELECT count(*) FROM (SELECT 1 FROM ledger_action WHERE tenant_id = %s AND tool = %s"
    " AND created_at >= %s AND status <> 'rejected' LIMIT %s) AS hit)",
    "agent": "(SELECT count(*) FROM (SELECT 1 FROM ledger_action WHERE tenant_id = %s AND tool = %s"
    " AND owner = %s AND created_at >= %s AND status <> 'rejected' LIMIT %s) AS hit)",
}
_SUM_OF = (
    "(SELECT CASE WHEN bool_or(jsonb_typeof(args #> %s) IS DISTINCT FROM 'number') THEN NULL"
    " ELSE coalesce(sum(CASE WHEN jsonb_typeof(args #> %s) = 'number'"
    " THEN greatest((args #> %s)::numeric, 0) END), 0) END FROM ledger_action"
)
_SUM = {
    "tenant": _SUM_OF + " WHERE tenant_id = %s AND tool = %s AND created_at >= %s AND status <> 'rejected')",
    "agent": _SUM_OF
    + " WHERE tenant_id = %s AND tool = %s AND owner = %s AND created_at >= %s AND status <> 'rejected')",
}


def limits_check(
    *, policy: ResolvedPolicy, tenant_id: int, tool: str, owner: str, args: Any, now: datetime
) -> LimitExceeded | None:
    """Lock the policy's limit scopes for this transaction and count them. Returns the first limit
    this call would exceed (None: within all of them); a limit with ``on_exceed: deny`` that it
    would exceed → ``PolicyDenied`` (a deny wins over an approval). The caller holds the
    transaction and inserts the action in it."""
    limits = policy.limits
    if not limits:
        return None
    keys = sorted(
        {f"limit:{tenant_id}:{tool}:{limit.per}:{owner if limit.per == 'agent' else ''}" for limit in limits}
    )
    selects: list[str] = []
    params: list[Any] = []
    for limit in limits:
        scope = [tenant_id, tool, *([owner] if limit.per == "agent" else [])]
        since = now - timedelta(seconds=limit.window_s)
        if limit.max_count is not None:
            selects.append(_COUNT[limit.per])
            params.extend([*scope, since, limit.max_count])
        else:
            selects.append(_SUM[limit.per])
            path = list(limit.sum_arg)
            params.extend([path, path, path, *scope, since])
    with connection.cursor() as cursor:
        # Its own statement: a statement's snapshot is taken when it starts, so the counts must
        # start after the locks are held to see what the previous holder committed.
        cursor.execute(
            "SELECT " + ", ".join("pg_advisory_xact_lock(hashtextextended(%s, 0))" for _ in keys), keys
        )
        cursor.execute("SELECT " + ", ".join(selects), params)
        used = cursor.fetchone()
    exceeded: list[LimitExceeded] = []
    for limit, value in zip(limits, used, strict=True):
        if limit.max_count is not None:
            if value + 1 > limit.max_count:
                exceeded.append(LimitExceeded(limit=limit, used=value, this=1))
            continue
        amount = _amount(args, limit)
        # ``value`` None: the window holds an amount that is not a number (see _SUM).
        if amount is None or value is None or value + amount > Decimal(repr(limit.max_sum)):
            exceeded.append(
                LimitExceeded(limit=limit, used=value, this=None if amount is None else float(amount))
            )
    for hit in exceeded:
        if hit.limit.on_exceed == "deny":
            raise errors.PolicyDenied(
                f"The policy for {tool} ({policy.pattern}) refuses this call: limit {hit.limit.index} "
                f"({hit.limit.description}) would be exceeded. Nothing was recorded.",
                details={
                    "policy": policy.pattern,
                    "limit": hit.limit.index,
                    "description": hit.limit.description,
                },
            )
    return exceeded[0] if exceeded else None
