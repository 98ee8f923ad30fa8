"""Fill the ledger fast with realistic benchmark data: ``manage.py seed_bench``.

Default: 100k runs x 10 actions (1M actions) across three tenants of unequal size, 10k open
recovery items, some pending approvals and a few 200-action runs for the run-detail page.
Rows go in with PostgreSQL ``COPY`` (psycopg 3 ``cursor.copy()``), which is what makes a million
rows a matter of a minute or two instead of hours of ORM saves. The rows are
``recovery.management.seeding``'s, as the benchmark's year of history builds them: consistent
with every constraint and state machine, so the dashboard sees data shaped like a real
incident's. No audit events are written: bench data is not a history anyone will verify, and a
half-made hash chain would be worse than none.

Seeding is additive (new ids every time), so it can run twice to grow a database; the benchmark
harness uses that to compare query counts at two data sizes. ``--tenant``, ``--reason`` and
``--claimed-share 0`` make the incident a bulk decision is for: every open item in one tenant, of
one reason, none claimed (``bench/bulk.py``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from ledger.models import Tenant
from recovery.management.seeding import AGENT_WEIGHTS, AGENTS, REASONS, TENANTS, CopyRows, RunBuilder

# Runs built between two COPYs: the rows waiting in memory stay a few megabytes.
BATCH_RUNS = 2000


@dataclass
class Plan:
    """How many runs of each fate to write; everything else is derived per run."""

    runs: int
    actions_per_run: int
    open_items: int
    pending_approvals: int
    big_runs: int
    big_run_actions: int
    resolved_items: int
    counts: dict[str, int] = field(default_factory=dict)

    def fates(self, rng: random.Random) -> list[str]:
        open_ = min(self.open_items, self.runs)
        approvals = min(self.pending_approvals, self.runs - open_)
        resolved = min(self.resolved_items, self.runs - open_ - approvals)
        rest = self.runs - open_ - approvals - resolved
        running = rest // 50
        cancelled = rest // 100
        succeeded = rest - running - cancelled
        fates = (
            ["open"] * open_
            + ["awaiting"] * approvals
            + ["running"] * running
            + ["cancelled"] * cancelled
            + ["succeeded"] * succeeded
        )
        fates += [rng.choice(["compensated", "closed"]) for _ in range(resolved)]
        rng.shuffle(fates)
        # The 200-action runs are failed runs in the queue: the detail page an operator opens.
        for i in range(min(self.big_runs, len(fates))):
            fates[i] = "open_big"
        return fates


class Command(BaseCommand):
    help = "Fill the database with benchmark data (COPY): runs, actions, recovery items, approvals."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--runs", type=int, default=100_000)
        parser.add_argument("--actions-per-run", type=int, default=10)
        parser.add_argument("--open-items", type=int, default=10_000)
        parser.add_argument("--pending-approvals", type=int, default=1_000)
        parser.add_argument(
            "--resolved-items",
            type=int,
            default=5_000,
            help="Runs already compensated or closed (their items resolved).",
        )
        parser.add_argument(
            "--big-runs", type=int, default=3, help="Failed runs with --big-run-actions actions."
        )
        parser.add_argument("--big-run-actions", type=int, default=200)
        parser.add_argument("--days", type=int, default=90, help="Spread created_at over this many days.")
        parser.add_argument(
            "--seed", type=int, default=None, help="Random seed (reproducible shapes, new ids)."
        )
        parser.add_argument(
            "--tenant",
            default="",
            help="Put every row in this one tenant (slug; created if missing) instead of three.",
        )
        parser.add_argument(
            "--reason",
            default="",
            choices=["", *(r for r, _ in REASONS)],
            help="Every item of this reason instead of an incident week's mix.",
        )
        parser.add_argument(
            "--claimed-share",
            type=float,
            default=0.1,
            help="The share of open items someone has claimed (0: every one open and decidable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        rng = random.Random(options["seed"])
        plan = Plan(
            runs=options["runs"],
            actions_per_run=max(1, options["actions_per_run"]),
            open_items=options["open_items"],
            pending_approvals=options["pending_approvals"],
            big_runs=options["big_runs"],
            big_run_actions=options["big_run_actions"],
            resolved_items=options["resolved_items"],
        )
        tenants = self._tenants(options["tenant"])
        rows = CopyRows()
        builder = RunBuilder(
            rows,
            rng,
            now=timezone.now(),
            audit=False,
            source="seed_bench",
            reason=options["reason"],
            claimed_share=options["claimed_share"],
        )
        with transaction.atomic():
            raw = connection.connection  # the psycopg 3 connection under Django's wrapper
            with raw.cursor() as cursor:
                _seed(builder, rows, cursor, plan=plan, tenants=tenants, days=options["days"])
        # What autovacuum does on a production server after a bulk load, done now (some servers,
        # this benchmark machine's included, run with autovacuum off, and it would lag anyway):
        # fresh statistics, so the planner sees a million rows rather than the empty tables it
        # analysed at migrate time, and a visibility map, so covering indexes give index-only
        # scans. Without them the EXPLAIN checks that follow would judge plans nobody runs.
        # VACUUM cannot run inside a transaction: after the COPY's has committed.
        with connection.cursor() as cursor:
            for table in ("ledger_run", "ledger_action", "recovery_recoveryitem", "recovery_approval"):
                cursor.execute(f"VACUUM (ANALYZE) {table}")  # noqa: S608 - fixed table names
        elapsed = time.monotonic() - started
        c = rows.counts
        self.stdout.write(
            f"seeded {c['runs']} runs, {c['actions']} actions, {c['open_items']} open items "
            f"({c['resolved_items']} resolved), {c['approvals']} pending approvals in {elapsed:.1f}s"
        )

    def _tenants(self, only: str) -> list[tuple[int, float]]:
        out = []
        for slug, name, share in [(only, only, 1.0)] if only else TENANTS:
            tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
            out.append((tenant.pk, share))
        return out


def _seed(
    builder: RunBuilder,
    rows: CopyRows,
    cursor: Any,
    *,
    plan: Plan,
    tenants: list[tuple[int, float]],
    days: int,
) -> None:
    """``plan``'s runs, ``BATCH_RUNS`` at a time into their COPYs (in the caller's transaction:
    the foreign keys are DEFERRABLE INITIALLY DEFERRED, checked at its commit)."""
    rng = builder.rng
    tenant_ids = [t for t, _ in tenants]
    tenant_weights = [w for _, w in tenants]
    span_s = days * 86400
    for i, fate in enumerate(plan.fates(rng), start=1):
        tenant_id = rng.choices(tenant_ids, tenant_weights)[0]
        # Recent runs are denser (exponential age), and queue items skew recent too.
        age_s = min(span_s, rng.expovariate(1 / (span_s / 4)))
        if fate in ("open", "open_big", "awaiting", "running"):
            age_s = min(age_s, rng.uniform(0, 3 * 86400))
        builder.build(
            tenant_id=tenant_id,
            key_id=None,
            agent=rng.choices(AGENTS, AGENT_WEIGHTS)[0],
            created=builder.now - timedelta(seconds=age_s),
            fate="open" if fate == "open_big" else fate,
            n=plan.big_run_actions if fate == "open_big" else plan.actions_per_run,
        )
        if i % BATCH_RUNS == 0:
            rows.copy_into(cursor)
    rows.copy_into(cursor)
