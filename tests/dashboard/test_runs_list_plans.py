"""The Runs page's queries walk indexes, never a whole table: EXPLAIN of every SELECT the page runs,
for the first page, a page after a cursor and each filter, over enough runs and actions that the
planner prefers a sequential scan wherever no index serves (``ledger/0021_runs_page_indexes``).

The scale targets (ten million runs) are ``make bench``'s; this proves the plans' shape with real
statistics (ANALYZE) on a few tens of thousands of rows.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Tenant
from tests.factories import member

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # big data: 40k runs, 120k actions

RUNS = reverse("dashboard:runs")
RUN_COUNT = 40_000
ACTIONS_PER_RUN = 3
BIG_TABLES = {"ledger_run", "ledger_action"}

INSERT_RUNS = """
INSERT INTO ledger_run (id, tenant_id, agent, owner, request, external_id, user_id, goal, trace_url,
    resume_url, metadata, status, summary, error, failure_reason, action_count, completion_count,
    created_at, updated_at)
SELECT 'run_' || lpad(i::text, 26, '0'),
       (ARRAY[%(t1)s, %(t2)s, %(t3)s])[1 + i %% 3],
       'agent-' || (i %% 50), 'key-' || (i %% 20),
       'Onboard person ' || i || ' ' || md5(i::text), 'ext-' || i, '', '', '', '', '{}',
       (ARRAY['running', 'succeeded', 'failed', 'cancelled', 'compensated', 'closed', 'succeeded'])[1 + i %% 7],
       '', '', '', %(per_run)s, 0,
       %(now)s - i * interval '7 seconds', %(now)s - i * interval '7 seconds'
  FROM generate_series(1, %(count)s) AS i
"""

INSERT_ACTIONS = """
INSERT INTO ledger_action (id, tenant_id, run_id, seq, tool, target_type, target_id, args,
    idempotency_key, owner, payload_hash, intent, risk, action_class, approval_mode,
    requires_approval, policy, compensation_strategy, compensation_tool, status, attempts, error,
    error_layer, warnings, created_at, updated_at)
SELECT 'act_' || lpad((i * 10 + s)::text, 26, '0'), run.tenant_id, run.id, s,
       'tool' || ((i + s) %% 40) || '.call_' || s, 'thing', 'target-' || i || '-' || s, '{}',
       'key-' || i || '-' || s, '', '', '{}', 'low', 'internal_update', 'auto', false, '{}',
       'none', '', 'succeeded', 1, '', '', '[]', run.created_at, run.created_at
  FROM generate_series(1, %(count)s) AS i
  JOIN ledger_run AS run ON run.id = 'run_' || lpad(i::text, 26, '0')
 CROSS JOIN generate_series(1, %(per_run)s) AS s
"""


@pytest.fixture
def crowded() -> Any:
    """Three tenants' runs and actions, analysed; an operator in all three (the widest list)."""
    tenants = [Tenant.objects.create(slug=slug, name=slug) for slug in ("acme", "globex", "initech")]
    now = timezone.now()
    params: dict[str, Any] = {
        "t1": tenants[0].pk,
        "t2": tenants[1].pk,
        "t3": tenants[2].pk,
        "count": RUN_COUNT,
        "per_run": ACTIONS_PER_RUN,
        "now": now,
    }
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUNS, params)
        cursor.execute(INSERT_ACTIONS, params)
        # Rows inserted after a GIN index was built wait in its pending list, which the planner
        # prices as a scan of every one of them; VACUUM (off on this machine) would merge them.
        cursor.execute(
            "SELECT gin_clean_pending_list(indexrelid::regclass) FROM pg_index JOIN pg_class "
            "ON pg_class.oid = indexrelid WHERE relname = 'run_search_trgm'"
        )
        cursor.execute("ANALYZE ledger_run")
        cursor.execute("ANALYZE ledger_action")
    user = member(tenants[0], "olga", "operator")
    for tenant in tenants[1:]:
        member(tenant, "olga", "operator")
    return {"user": user, "now": now}


def _scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    if "Scan" in plan.get("Node Type", ""):
        found.append((plan["Node Type"], plan.get("Relation Name", "")))
    for child in plan.get("Plans", []) or []:
        found += _scans(child)
    return found


def _plans(client: Any, params: dict[str, str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each SELECT the page ran that reads the ledger, with the scans of its plan."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(RUNS, params)
    assert response.status_code in (200, 303), response.status_code
    out = []
    for captured in ctx.captured_queries:
        sql = captured["sql"]
        if not sql.lstrip().upper().startswith("SELECT") or not any(t in sql for t in BIG_TABLES):
            continue
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
            raw = cursor.fetchone()[0]
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
        out.append((sql, _scans(plan)))
    return out


def test_every_filter_of_the_runs_page_reads_through_indexes(client, crowded) -> None:
    client.force_login(crowded["user"])
    first = client.get(RUNS)
    assert len(first.context["rows"]) == 50
    cursor = first.context["page"].next_cursor
    middle = (crowded["now"] - timedelta(hours=10)).strftime("%Y-%m-%dT%H:%M")
    later = (crowded["now"] - timedelta(hours=9)).strftime("%Y-%m-%dT%H:%M")
    cases: dict[str, dict[str, str]] = {
        "first page": {},
        "after a cursor": {"cursor": cursor},
        "tenant": {"tenant": "globex"},
        "agent": {"agent": "agent-7"},
        "agent (the key's name)": {"agent": "key-3"},
        "status": {"status": "failed"},
        "tool": {"tool": "tool7.call_2"},
        "tool glob": {"tool": "tool1*.call_*"},
        "started after and before": {"after": middle, "before": later},
        "text": {"q": "person 1234 "},
        "run id": {"q": "run_" + "1234".rjust(26, "0")},
        "external id": {"q": "ext-2345"},
        "action id": {"q": "act_" + "34562".rjust(26, "0")},
        "target id": {"q": "target-4567-1"},
        "everything": {"agent": "agent-7", "status": "succeeded", "tool": "tool*", "after": middle},
    }
    for name, params in cases.items():
        plans = _plans(client, params)
        assert plans, name
        on_runs = [scan for _sql, scans in plans for scan in scans if scan[1] == "ledger_run"]
        assert on_runs, f"{name}: no scan of ledger_run"
        for sql, scans in plans:
            sequential = [table for node, table in scans if node == "Seq Scan" and table in BIG_TABLES]
            assert not sequential, f"{name}: a sequential scan of {sequential}:\n{sql}\n{scans}"
