"""The "At size" phase's world: its own database (the Django connection switched to it), the tables
that grow with traffic and their sizes, the seeded year's tenants with an agent key per seeded
agent, the operator's key, the append load's own tenant and the retention the year is given."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

# The tables that grow with traffic, and the small ones beside them.
GROWING = (
    "ledger_event",
    "ledger_action",
    "ledger_run",
    "ledger_idempotencyrecord",
    "recovery_notification",
    "recovery_recoveryitem",
    "recovery_approval",
    "ledger_archivedrun",
)
CLIENTS = 16
TENANT = "acme"  # the seeded tenants are acme, globex, initech (bench.dashboard.TENANTS)
# The retention the seeded year is given (closed runs after it are archived).
RETENTION = "90d"
# The tenant of the append load's agents (its runs are not the seeded year's).
LOAD_TENANT = "bench-size"


def switch_database(url: str) -> None:
    """Point this process's Django connection at ``url``'s database."""
    from django.db import connections

    conn = connections["default"]
    conn.close()
    conn.settings_dict["NAME"] = urlsplit(url).path.lstrip("/")


def table_sizes() -> dict[str, Any]:
    from django.db import connection

    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for table in GROWING:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is None:
                continue
            cursor.execute(
                "SELECT pg_total_relation_size(%s), pg_relation_size(%s), pg_indexes_size(%s), "
                "(SELECT reltuples::bigint FROM pg_class WHERE relname = %s)",
                [table, table, table, table],
            )
            total, heap, indexes, rows = cursor.fetchone()
            cursor.execute(
                "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE x.indrelid = %s::regclass ORDER BY 2 DESC",
                [table],
            )
            out[table] = {
                "total": total,
                "heap": heap,
                "indexes": indexes,
                "rows": max(0, rows),
                "each_index": dict(cursor.fetchall()),
            }
        cursor.execute("SELECT pg_database_size(current_database())")
        out["database"] = cursor.fetchone()[0]
    return out


def tenants_and_keys() -> list[tuple[int, list[tuple[str, str]]]]:
    from bench import size_seed
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    out = []
    for slug in ("acme", "globex", "initech"):
        tenant = tenant_get_or_create(slug=slug)
        keys = []
        for agent in size_seed.AGENTS:
            issued = agent_key_create(
                tenant=tenant, name=f"size-{agent}", scopes=["agent"], actor=Actor.system("bench")
            )
            keys.append((issued.key.pk, agent))
        out.append((tenant.pk, keys))
    return out


def operator_key() -> str:
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=TENANT)
    return agent_key_create(
        tenant=tenant, name="size-operator", scopes=["operator"], actor=Actor.system("bench")
    ).secret
