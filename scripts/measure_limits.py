"""What a policy's rules and limits cost on the hot path: statements and milliseconds per recorded
action, without rules, with two rules, and with two limits (a count and a sum) over a window that
already holds many actions. Not a test: it writes to the database DATABASE_URL names (create it
with ``DEBUG=1 manage.py migrate`` first) and prints one line per case.

    DEBUG=1 DATABASE_URL=postgres://…/saga_measure .venv/bin/python scripts/measure_limits.py [N]
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from ledger.audit import Actor  # noqa: E402
from ledger.models import Tenant  # noqa: E402
from ledger.policies.load import policy_file_load, policy_file_parse  # noqa: E402
from ledger.services import runs  # noqa: E402
from ledger.services.keys import agent_key_create  # noqa: E402
from recovery.actions.approvals import action_record_gated  # noqa: E402

BASE = {"tool": "bench.charge", "risk": "low", "approval": "auto", "action_class": "internal_update"}
CASES = {
    "no rules, no limits": {},
    "2 rules": {
        "rules": [
            {"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}},
            {"if": {"arg": "amount", "gt": 10**9}, "then": {"risk": "critical", "approval": "manual"}},
        ]
    },
    "2 limits (count per agent, sum per tenant)": {
        "limits": [
            {"window": "1h", "per": "agent", "max_count": 1_000_000},
            {"window": "24h", "per": "tenant", "sum_arg": "amount", "max_sum": 10**12},
        ]
    },
}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    slug = f"measure-{uuid.uuid4().hex[:8]}"
    tenant = Tenant.objects.create(slug=slug, name=slug)
    key = agent_key_create(
        tenant=tenant, name="bench-agent", scopes=["agent"], actor=Actor.system("measure")
    ).key
    actor = Actor.for_key(key)
    for name, extra in CASES.items():
        document = policy_file_parse({"policies": [{**BASE, **extra}]}, source="measure")
        policy_file_load(document=document, source="measure", tenant=tenant, actor=Actor.system("measure"))
        run = runs.run_create(tenant=tenant, actor=actor, agent="bench", request="measure")
        # Warm the process's policy cache and connection.
        action_record_gated(
            run=run,
            actor=actor,
            tool="bench.charge",
            idempotency_key=f"{name}-warm",
            args={"amount": 1, "currency": "usd"},
        )
        statements = 0
        started = time.perf_counter()
        for i in range(n):
            connection.queries_log.clear()  # the log is bounded: keep each capture's count exact
            with CaptureQueriesContext(connection) as queries:
                action_record_gated(
                    run=run,
                    actor=actor,
                    tool="bench.charge",
                    idempotency_key=f"{name}-{i}",
                    args={"amount": 100 + i, "currency": "usd"},
                )
            statements += len(queries)
        elapsed = time.perf_counter() - started
        print(
            f"{name:45s} {statements / n:5.1f} statements/record  {1000 * elapsed / n:6.2f} ms/record "
            f"(n={n}, window holding up to {n * (list(CASES).index(name) + 1)} actions)"
        )


if __name__ == "__main__":
    main()
