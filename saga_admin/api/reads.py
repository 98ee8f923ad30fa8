"""The agent's hot reads, one statement each.

Each read is one round trip to PostgreSQL, as the append is (``ledger.services.writes``): the run
the key reaches (``ledger.scoping.Reach.of_key``, the one owner rule, as values) and everything
the response shows of it, selected together as one jsonb value, then turned into the model
instances the ORM would have read (``ledger.rows.model_from_row``) and read by the same output
schemas as every other response (``XOut.from_orm``), so the response is the one the ORM's reads
give, byte for byte. Each read returns its response schema, built once from those instances:
ninja does not validate it again. A run the key does not reach is the same 404 as an unknown id.
The rules stay where they are: the order of a run's actions and checkpoints
(``ledger.selectors``), which actions a warning can concern (``ledger.rules``, passed in as
values), the unresolved statuses of an item and which approval an action shows
(``recovery.selectors.latest_action_approvals``: the newest of the action kind). Equality with
the ORM's reads is tested (tests/api/test_reads.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

from infra import errors, json_text
from infra.pagination import NEWEST_FIRST, cursor_after, cursor_values
from ledger.models import Action, ActionClass, AgentKey, Checkpoint, Run
from ledger.rows import model_from_row
from ledger.rules import COMPENSATABLE_CLASSES
from ledger.scoping import Reach
from ledger.selectors import ACTIONS_IN_ORDER, RUN_DETAIL_ACTIONS, run_warnings
from recovery.models import Approval, ApprovalGrant, RecoveryItem
from saga_admin.api.schemas.actions import ActionPageOut, actions_shown
from saga_admin.api.schemas.checkpoints import CheckpointOut, CheckpointPageOut
from saga_admin.api.schemas.queue import RecoveryItemOut
from saga_admin.api.schemas.runs import RunDetailOut, RunOut, WarningOut

M = TypeVar("M", bound=Model)

# The run the key reaches: its id, its tenant and, for an agent key (or a write), its owner.
_RUN = "SELECT * FROM ledger_run WHERE id = %(run_id)s AND tenant_id = %(tenant_id)s"
_OWNED = " AND owner = %(owner)s"

# The newest approval of each gated action of ``page`` (recovery.selectors.latest_action_approvals),
# with its grants when it needs several people (saga_admin.api.schemas.approvals.approval_grants).
_APPROVALS = """
    (SELECT coalesce(jsonb_agg(newest.row), '[]'::jsonb) FROM (
        SELECT DISTINCT ON (ap.action_id) to_jsonb(ap) || jsonb_build_object('grants', (
            SELECT coalesce(jsonb_agg(to_jsonb(g) ORDER BY g.created_at, g.id), '[]'::jsonb)
            FROM recovery_approvalgrant g WHERE g.approval_id = ap.id AND ap.approvers_required > 1
        )) AS row
        FROM recovery_approval ap
        WHERE ap.run_id = (SELECT id FROM run) AND ap.kind = %(approval_kind)s
          AND ap.action_id IN (SELECT id FROM page WHERE requires_approval)
        ORDER BY ap.action_id, ap.created_at DESC, ap.id DESC
    ) newest)"""


def _select(sql: str, params: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The statement's one jsonb value, decoded; the same 404 as an unknown id when the key
    reaches no such run."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    value = row[0] if row else None
    answer = json_text.loads(value) if isinstance(value, str | bytes) else value
    if not isinstance(answer, dict) or answer.get("run") is None:
        raise errors.NotFound.for_id("Run", run_id)
    return answer


def _params(key: AgentKey, run_id: str) -> tuple[str, dict[str, Any]]:
    owner = Reach.of_key(key).owner
    run_sql = _RUN + (_OWNED if owner is not None else "")
    return run_sql, {
        "run_id": run_id,
        "tenant_id": key.tenant_id,
        "owner": owner,
        "approval_kind": Approval.Kind.ACTION,
    }


def _approvals(rows: list[dict[str, Any]]) -> dict[str, Approval]:
    out = {}
    for row in rows:
        approval = model_from_row(Approval, row)
        grants = [model_from_row(ApprovalGrant, grant) for grant in row["grants"]]
        if approval.approvers_required > 1:
            # As prefetch_related leaves it: approval.grants.all() is this list, not a query.
            cached = approval.grants.all()
            cached._result_cache = grants
            cached._prefetch_done = True  # type: ignore[attr-defined]
            approval._prefetched_objects_cache = {"grants": cached}  # type: ignore[attr-defined]
        out[approval.action_id] = approval
    return out


def _after(keys: Sequence[tuple[str, bool]], cursor: str | None, alias: str) -> tuple[str, dict[str, Any]]:
    """The keyset condition of a page after ``cursor`` (a row comparison, one index range), or
    nothing for the first page; a cursor the API did not hand out is refused (422) here."""
    if not cursor:
        return "", {}
    values = cursor_values(cursor, keys)
    op = "<" if keys[0][1] else ">"
    columns = ", ".join(f"{alias}.{name}" for name, _ in keys)
    names = [f"after_{i}" for i in range(len(keys))]
    return (
        f" AND ({columns}) {op} ({', '.join(f'%({n})s' for n in names)})",
        dict(zip(names, values, strict=True)),
    )


def _order(keys: Sequence[tuple[str, bool]], alias: str) -> str:
    return ", ".join(f"{alias}.{name}{' DESC' if descending else ''}" for name, descending in keys)


def _next_cursor(rows: list[Any], keys: Sequence[tuple[str, bool]], limit: int) -> str | None:
    if len(rows) <= limit:
        return None
    return cursor_after([getattr(rows[limit - 1], name) for name, _ in keys])


def _run_page(
    model: type[M],
    *,
    key: AgentKey,
    run_id: str,
    cursor: str | None,
    limit: int,
    ordering: Sequence[tuple[str, bool]],
    beside: str = "",
) -> tuple[list[M], dict[str, Any]]:
    """One page (``limit`` + 1 rows, for the next cursor) of the rows of ``model`` that belong to
    the run the key reaches, in ``ordering``, in one statement; with ``beside`` (``'name', sql``
    pairs over ``page``) read in the same statement. Returns the rows and the whole answer."""
    run_sql, params = _params(key, run_id)
    after, after_params = _after(ordering, cursor, "p")
    order = _order(ordering, "p")
    sql = f"""
        WITH run AS ({run_sql}),
        page AS (
            SELECT p.* FROM {model._meta.db_table} p WHERE p.run_id = (SELECT id FROM run){after}
            ORDER BY {order} LIMIT %(limit)s
        )
        SELECT jsonb_build_object(
            'run', (SELECT to_jsonb(run.id) FROM run),
            'rows', (SELECT coalesce(jsonb_agg(to_jsonb(p) ORDER BY {order}), '[]'::jsonb) FROM page p){beside}
        )"""  # noqa: S608 - fixed fragments of this module; every value is a parameter
    answer = _select(sql, {**params, **after_params, "limit": limit + 1}, run_id)
    return [model_from_row(model, row) for row in answer["rows"]], answer


def checkpoint_page(*, key: AgentKey, run_id: str, cursor: str | None, limit: int) -> CheckpointPageOut:
    """``GET /runs/{id}/checkpoints``: a page of the run's checkpoints, newest first."""
    rows, _ = _run_page(Checkpoint, key=key, run_id=run_id, cursor=cursor, limit=limit, ordering=NEWEST_FIRST)
    return CheckpointPageOut(
        items=[CheckpointOut.from_orm(checkpoint) for checkpoint in rows[:limit]],
        next_cursor=_next_cursor(rows, NEWEST_FIRST, limit),
    )


def actions_page(*, key: AgentKey, run_id: str, cursor: str | None, limit: int) -> ActionPageOut:
    """``GET /runs/{id}/actions``: a page of the run's actions, oldest first, with their approvals."""
    rows, answer = _run_page(
        Action,
        key=key,
        run_id=run_id,
        cursor=cursor,
        limit=limit,
        ordering=ACTIONS_IN_ORDER,
        beside=f", 'approvals', {_APPROVALS}",
    )
    return ActionPageOut(
        items=actions_shown(rows[:limit], _approvals(answer["approvals"])),
        next_cursor=_next_cursor(rows, ACTIONS_IN_ORDER, limit),
    )


# The actions a warning can concern (ledger.selectors.run_warnings): an unknown outcome, a possible
# pivot (an irreversible action) and the compensatable actions after the first of those, the
# only ones a pivot-order warning can name. Their few columns, never the whole run's rows.
_WARNING_ROWS = """
    (SELECT coalesce(jsonb_agg(jsonb_build_object(
        'id', w.id, 'seq', w.seq, 'tool', w.tool, 'status', w.status, 'action_class', w.action_class
    ) ORDER BY w.seq), '[]'::jsonb)
    FROM ledger_action w
    WHERE w.run_id = (SELECT id FROM run) AND w.status <> %(rejected)s AND (
        w.status = %(unknown)s OR w.action_class = %(irreversible)s OR (
            w.action_class = ANY(%(compensatable)s) AND w.seq > (
                SELECT min(p.seq) FROM ledger_action p
                WHERE p.run_id = (SELECT id FROM run) AND p.action_class = %(irreversible)s
                  AND p.status <> %(rejected)s
            )
        )
    ))"""


def run_detail(*, key: AgentKey, run_id: str, path: str) -> RunDetailOut:
    """``GET /runs/{id}``: the run, its newest actions (with their approvals), its latest
    checkpoint, its unresolved recovery item and its warnings (over the whole run)."""
    run_sql, params = _params(key, run_id)
    sql = f"""
        WITH run AS ({run_sql}),
        page AS (
            SELECT a.* FROM ledger_action a WHERE a.run_id = (SELECT id FROM run)
            ORDER BY a.seq DESC LIMIT %(limit)s
        )
        SELECT jsonb_build_object(
            'run', (SELECT to_jsonb(run) FROM run),
            'actions', (SELECT coalesce(jsonb_agg(to_jsonb(a) ORDER BY a.seq), '[]'::jsonb) FROM page a),
            'approvals', {_APPROVALS},
            'checkpoint', (
                SELECT to_jsonb(c) FROM ledger_checkpoint c WHERE c.run_id = (SELECT id FROM run)
                ORDER BY {_order(NEWEST_FIRST, "c")} LIMIT 1
            ),
            'item', (
                SELECT to_jsonb(i) FROM recovery_recoveryitem i
                WHERE i.run_id = (SELECT id FROM run) AND i.status = ANY(%(unresolved)s) LIMIT 1
            ),
            'warnings', {_WARNING_ROWS}
        )"""  # noqa: S608 - fixed fragments of this module; every value is a parameter
    answer = _select(
        sql,
        {
            **params,
            "limit": RUN_DETAIL_ACTIONS + 1,
            "unresolved": list(RecoveryItem.UNRESOLVED),
            "rejected": Action.Status.REJECTED,
            "unknown": Action.Status.UNKNOWN,
            "irreversible": ActionClass.EXTERNAL_IRREVERSIBLE,
            "compensatable": sorted(COMPENSATABLE_CLASSES),
        },
        run_id,
    )
    run = model_from_row(Run, answer["run"])
    actions = [model_from_row(Action, row) for row in answer["actions"]]
    more = len(actions) > RUN_DETAIL_ACTIONS
    newest = actions[1:] if more else actions
    checkpoint = model_from_row(Checkpoint, answer["checkpoint"]) if answer["checkpoint"] else None
    item = model_from_row(RecoveryItem, answer["item"]) if answer["item"] else None
    candidates = [
        Action(
            id=row["id"],
            seq=row["seq"],
            tool=row["tool"],
            status=row["status"],
            action_class=row["action_class"],
        )
        for row in answer["warnings"]
    ]
    return RunDetailOut(
        **dict(RunOut.from_orm(run)),
        actions=actions_shown(newest, _approvals(answer["approvals"])),
        # The whole list from its start (``path`` is this run's path, under any prefix).
        actions_next=f"{path}/actions" if more else None,
        latest_checkpoint=CheckpointOut.from_orm(checkpoint) if checkpoint else None,
        recovery_item=RecoveryItemOut.from_orm(item) if item else None,
        warnings=[
            WarningOut.model_validate(warning) for warning in run_warnings(run=run, actions=candidates)
        ],
    )
