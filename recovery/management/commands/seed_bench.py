"""Fill the ledger fast with realistic benchmark data: ``manage.py seed_bench``.

Default: 100k runs x 10 actions (1M actions) across three tenants of unequal size, 10k open
recovery items, some pending approvals and a few 200-action runs for the run-detail page.
Rows go in with PostgreSQL ``COPY`` (psycopg 3 ``cursor.copy()``), which is what makes a million
rows a matter of a minute or two instead of hours of ORM saves.

The rows respect every constraint the models declare and are consistent with the state machines
(a failed run's failing action is ``failed`` and earlier ones ``succeeded`` with a completion
order; an open item's run is ``failed``; a pending approval's action is ``awaiting_approval``),
so the dashboard sees data shaped like a real incident's. No audit events are written: bench data
is not a history anyone will verify, and a half-made hash chain would be worse than none.

Seeding is additive (new ids every time), so it can run twice to grow a database; the benchmark
harness uses that to compare query counts at two data sizes. ``--tenant``, ``--reason`` and
``--claimed-share 0`` make the incident a bulk decision is for: every open item in one tenant, of
one reason, none claimed (``bench/bulk.py``).

It lives in ``recovery`` because it writes recovery items and approvals beside the ledger's rows
(and so uses recovery's rule for an item's search text); the ledger never knows about recovery.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction
from django.utils import timezone

from infra.hashing import sha256_hex
from infra.ids import new_id
from ledger.models import Tenant
from ledger.services.actions.payload import action_payload_hash
from recovery.items import search_text_for

if TYPE_CHECKING:
    import psycopg

# Tenants of unequal size: one big customer dominates, as in most multi-tenant installs.
TENANTS = [("acme", "Acme Corp", 0.6), ("globex", "Globex", 0.3), ("initech", "Initech", 0.1)]

# (tool, target_type, action_class, risk, compensation tool or "" for snapshot/none, strategy)
TOOLS = [
    ("hr.create_user", "user", "internal_update", "medium", "hr.delete_user", "custom"),
    (
        "workspace.provision_license",
        "user",
        "external_reversible",
        "medium",
        "workspace.cancel_license",
        "custom",
    ),
    ("crm.update_contact", "contact", "internal_update", "low", "crm.update_contact.restore", "snapshot"),
    ("crm.update_deal", "deal", "internal_update", "low", "crm.update_deal.restore", "snapshot"),
    ("calendar.create_event", "event", "external_reversible", "low", "calendar.delete_event", "custom"),
    ("email.create_draft", "draft", "draft_only", "low", "email.delete_draft", "custom"),
    ("tickets.set_priority", "ticket", "internal_update", "low", "tickets.set_priority.restore", "snapshot"),
    ("docs.search", "query", "read_only", "low", "", "none"),
    ("github.open_pr", "repo", "external_reversible", "medium", "github.close_pr", "custom"),
    ("billing.apply_credit", "account", "internal_update", "high", "billing.revoke_credit", "custom"),
    ("email.send", "message", "external_irreversible", "high", "email.send_correction", "correction"),
    ("payments.charge", "order", "external_irreversible", "critical", "payments.refund", "correction"),
]
# Read-mostly agents touch cheap tools far more often than the irreversible ones.
TOOL_WEIGHTS = [8, 6, 10, 6, 5, 7, 5, 12, 3, 2, 2, 1]

AGENTS = [
    "onboarding",
    "offboarding",
    "crm-sync",
    "support-triage",
    "billing-ops",
    "release-bot",
    "calendar-assistant",
    "sales-followup",
    "it-helpdesk",
    "finance-close",
]
AGENT_WEIGHTS = [20, 8, 25, 15, 6, 5, 9, 6, 4, 2]

ERRORS = [
    "timeout after {n}s calling {tool}",
    "rate limited by upstream (429), retry-after {n}",
    "validation error: field 'email' is invalid for user {n}",
    "connection reset by peer while calling {tool}",
    "upstream returned 503 Service Unavailable",
    "model produced malformed JSON arguments for {tool}",
]

# Why runs land in the queue, weighted as an incident-heavy week would look.
REASONS = [
    ("failed", 60),
    ("verification_failed", 10),
    ("agent_lost", 10),
    ("outcome_unknown", 5),
    ("compensation_failed", 10),
    ("state_drift", 5),
]
SUGGESTIONS = {
    "failed": "compensate",
    "verification_failed": "review",
    "agent_lost": "resume",
    "outcome_unknown": "reconcile",
    "compensation_failed": "review",
    "state_drift": "review",
}
RISK_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}

RUN_COLUMNS = [
    "id",
    "tenant_id",
    "agent",
    "request",
    "external_id",
    "user_id",
    "goal",
    "trace_url",
    "resume_url",
    "metadata",
    "status",
    "summary",
    "error",
    "failure_reason",
    "failed_action_id",
    "created_by_key_id",
    "action_count",
    "completion_count",
    "created_at",
    "updated_at",
    "finished_at",
    "last_heartbeat_at",
]
ACTION_COLUMNS = [
    "id",
    "tenant_id",
    "run_id",
    "seq",
    "tool",
    "target_type",
    "target_id",
    "args",
    "idempotency_key",
    "payload_hash",
    "intent",
    "before_snapshot",
    "after_snapshot",
    "result",
    "risk",
    "action_class",
    "approval_mode",
    "requires_approval",
    "policy",
    "compensation_strategy",
    "compensation_tool",
    "compensation_args",
    "status",
    "attempts",
    "error",
    "error_layer",
    "retryable",
    "verified",
    "verification",
    "warnings",
    "completion_seq",
    "created_at",
    "updated_at",
    "started_at",
    "completed_at",
]
ITEM_COLUMNS = [
    "id",
    "tenant_id",
    "run_id",
    "status",
    "reason",
    "failed_action_id",
    "risk",
    "suggested_resolution",
    "error",
    "signature",
    "details",
    "assignee_id",
    "claimed_by_id",
    "claimed_at",
    "resolution",
    "resolution_note",
    "resolved_by_id",
    "resolved_at",
    "reopened_count",
    "opened_at",
    "updated_at",
    "search_text",
]
APPROVAL_COLUMNS = [
    "id",
    "tenant_id",
    "run_id",
    "kind",
    "action_id",
    "step_id",
    "status",
    "risk",
    "tool",
    "args",
    "args_hash",
    "approved_args",
    "approved_args_hash",
    "requested_by_id",
    "requested_by_key_id",
    "decided_by_id",
    "decided_by_key_id",
    "decided_at",
    "reason",
    "expires_at",
    "created_at",
]


def ulid_at(prefix: str, when: datetime) -> str:
    """An id in ``infra.ids``' format whose time part is ``when``: seeded ids sort like real ones."""
    return new_id(prefix, at=when)


def dumps(value: Any) -> str | None:
    return None if value is None else _json(value)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


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
        tenant_ids = self._tenants(options["tenant"])
        seeder = _Seeder(
            rng=rng,
            plan=plan,
            tenant_ids=tenant_ids,
            days=options["days"],
            reason=options["reason"],
            claimed_share=options["claimed_share"],
        )
        with transaction.atomic():
            raw = connection.connection  # the psycopg 3 connection under Django's wrapper
            with raw.cursor() as cursor:
                seeder.copy_all(cursor)
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
        c = seeder.counts
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


class _Seeder:
    def __init__(
        self,
        *,
        rng: random.Random,
        plan: Plan,
        tenant_ids: list[tuple[int, float]],
        days: int,
        reason: str = "",
        claimed_share: float = 0.1,
    ) -> None:
        self.rng = rng
        self.reason = reason
        self.claimed_share = claimed_share
        self.plan = plan
        self.tenant_ids = [t for t, _ in tenant_ids]
        self.tenant_weights = [w for _, w in tenant_ids]
        self.now = timezone.now()
        self.span_s = days * 86400
        self.counts = {"runs": 0, "actions": 0, "open_items": 0, "resolved_items": 0, "approvals": 0}
        # Rows of the small dependent tables are collected while actions stream out.
        self.items: list[tuple[Any, ...]] = []
        self.approvals: list[tuple[Any, ...]] = []
        self.action_copy: Any = None
        self._policy_json: dict[tuple[str, bool], str] = {}

    def copy_all(self, cursor: psycopg.Cursor[Any]) -> None:
        from psycopg.copy import QueuedLibpqWriter

        fates = self.plan.fates(self.rng)
        # Actions stream straight into their COPY while runs are generated; the queued writer
        # sends from a thread, so Python builds rows while PostgreSQL maintains the indexes on
        # its own core. Runs, items and approvals are small and go after (FKs are DEFERRABLE
        # INITIALLY DEFERRED, so the order is checked at commit only).
        sql = f"COPY ledger_action ({', '.join(ACTION_COLUMNS)}) FROM STDIN"  # noqa: S608 - fixed identifiers
        with cursor.copy(sql, writer=QueuedLibpqWriter(cursor)) as copy:
            self.action_copy = copy
            runs = list(self._runs(fates))
        self._copy(cursor, "ledger_run", RUN_COLUMNS, runs)
        self.counts["runs"] = len(runs)
        self._copy(cursor, "recovery_recoveryitem", ITEM_COLUMNS, self.items)
        self._copy(cursor, "recovery_approval", APPROVAL_COLUMNS, self.approvals)

    @staticmethod
    def _copy(
        cursor: psycopg.Cursor[Any], table: str, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> None:
        if not rows:
            return
        sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"  # noqa: S608 - fixed identifiers
        with cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)

    def _runs(self, fates: list[str]) -> Iterator[tuple[Any, ...]]:
        rng = self.rng
        for fate in fates:
            tenant_id = rng.choices(self.tenant_ids, self.tenant_weights)[0]
            # Recent runs are denser (exponential age), and queue items skew recent too.
            age_s = min(self.span_s, rng.expovariate(1 / (self.span_s / 4)))
            if fate in ("open", "open_big", "awaiting", "running"):
                age_s = min(age_s, rng.uniform(0, 3 * 86400))
            created = self.now - timedelta(seconds=age_s)
            run_id = ulid_at("run", created)
            agent = rng.choices(AGENTS, AGENT_WEIGHTS)[0]
            n_actions = self.plan.big_run_actions if fate == "open_big" else self.plan.actions_per_run
            yield self._run_with_actions(run_id, tenant_id, agent, fate, created, n_actions)

    def _run_with_actions(
        self, run_id: str, tenant_id: int, agent: str, fate: str, created: datetime, n_actions: int
    ) -> tuple[Any, ...]:
        rng = self.rng
        step = timedelta(seconds=rng.uniform(0.5, 8))
        user = f"user{rng.randrange(50_000)}@example.com"
        error = ""
        failed_action_id = None
        failed_tool = ""
        request = f"{agent}: handle request for {user}"
        completion = 0
        last_status = {
            "succeeded": "succeeded",
            "cancelled": "succeeded",
            "running": "running",
            "awaiting": "awaiting_approval",
            "open": "failed",
            "open_big": "failed",
            "compensated": "failed",
            "closed": "failed",
        }[fate]
        live_risks = []
        for seq in range(1, n_actions + 1):
            tool, target_type, action_class, risk, comp_tool, strategy = rng.choices(TOOLS, TOOL_WEIGHTS)[0]
            at = created + step * seq
            is_last = seq == n_actions
            status = last_status if is_last else "succeeded"
            if fate == "compensated" and status == "succeeded":
                status = "compensated"
            if status == "awaiting_approval":
                # The gated call: its policy is manual approval, like payments.charge.
                tool, target_type, action_class, risk, comp_tool, strategy = TOOLS[-1]
            action_id = ulid_at("act", at)
            target_id = f"{target_type}-{rng.randrange(100_000)}"
            args = {"target": target_id, "note": f"step {seq} for {user}"}
            compensation = (
                {"tool": comp_tool, "args": {"id": target_id}}
                if strategy in ("custom", "correction")
                else None
            )
            idem = f"{run_id}:{seq}"
            completed = status in ("succeeded", "compensated", "failed")
            if status in ("succeeded", "compensated"):
                completion += 1
            if status in ("succeeded", "running", "failed"):
                live_risks.append(risk)
            err = ""
            if status == "failed":
                err = rng.choice(ERRORS).format(n=rng.randrange(5, 120), tool=tool)
                error = err
                failed_action_id = action_id
                failed_tool = tool
            manual = status == "awaiting_approval"
            self.counts["actions"] += 1
            self.action_copy.write_row(
                (
                    action_id,
                    tenant_id,
                    run_id,
                    seq,
                    tool,
                    target_type,
                    target_id,
                    dumps(args),
                    idem,
                    action_payload_hash(
                        tool=tool,
                        target_type=target_type,
                        target_id=target_id,
                        args=args,
                        compensation=compensation,
                    ),
                    f'{{"reasoning":"{agent} needs {tool}","confidence":{rng.uniform(0.5, 0.99):.2f}}}',
                    dumps({"state": "before"}) if strategy == "snapshot" else None,
                    dumps({"state": "after"}) if strategy == "snapshot" and completed else None,
                    dumps({"ok": True}) if status in ("succeeded", "compensated") else None,
                    risk,
                    action_class,
                    "manual" if manual else "auto",
                    manual,
                    self._policy(tool, risk, action_class, manual),
                    strategy,
                    comp_tool,
                    dumps(compensation["args"]) if compensation else None,
                    status,
                    1 if status not in ("planned", "awaiting_approval") else 0,
                    err,
                    "tool" if err else "",
                    (True if err else None),
                    None,
                    None,
                    "[]",
                    completion if status in ("succeeded", "compensated") else None,
                    at,
                    at + step / 2,
                    at if status not in ("awaiting_approval",) else None,
                    at + step / 2 if completed else None,
                )
            )
            if manual:
                self._approval(tenant_id, run_id, action_id, risk, tool, args, at)

        run_status = {
            "succeeded": "succeeded",
            "cancelled": "cancelled",
            "running": "running",
            "awaiting": "running",
            "open": "failed",
            "open_big": "failed",
            "compensated": "compensated",
            "closed": "closed",
        }[fate]
        finished = created + step * (n_actions + 1)
        if fate in ("open", "open_big", "compensated", "closed"):
            search_text = search_text_for(tool=failed_tool, request=request)
            self._item(tenant_id, run_id, fate, failed_action_id, error, live_risks, finished, search_text)
        return (
            run_id,
            tenant_id,
            agent,
            request,
            f"ext-{rng.randrange(10**9)}",
            user,
            f"Help {user}",
            "",
            "",
            "{}",
            run_status,
            "done" if run_status == "succeeded" else "",
            error,
            "failed" if error else "",
            failed_action_id,
            None,
            n_actions,
            completion,
            created,
            finished,
            None if run_status in ("running",) else finished,
            # Heartbeats are fresh so a running sweeper does not turn the seeded running runs
            # into agent_lost items while the benchmark measures something else.
            self.now if run_status == "running" else finished,
        )

    def _policy(self, tool: str, risk: str, action_class: str, manual: bool) -> str:
        key = (tool, manual)
        if key not in self._policy_json:
            self._policy_json[key] = _json(
                {
                    "tool": tool,
                    "pattern": tool,
                    "risk": risk,
                    "approval": "manual" if manual else "auto",
                    "action_class": action_class,
                    "requires_approval": manual,
                    "scope": "global",
                    "source": "seed_bench",
                }
            )
        return self._policy_json[key]

    def _item(
        self,
        tenant_id: int,
        run_id: str,
        fate: str,
        failed_action_id: str | None,
        error: str,
        live_risks: list[str],
        opened: datetime,
        search_text: str,
    ) -> None:
        rng = self.rng
        reason = self.reason or rng.choices([r for r, _ in REASONS], [w for _, w in REASONS])[0]
        risk = max(live_risks or ["low"], key=RISK_ORDER.__getitem__)
        resolved = fate in ("compensated", "closed")
        status = "resolved" if resolved else ("claimed" if rng.random() < self.claimed_share else "open")
        signature = sha256_hex(f"{reason}|{error[:12]}")[:16]
        resolved_at = opened + timedelta(minutes=rng.uniform(1, 120)) if resolved else None
        self.items.append(
            (
                ulid_at("rec", opened),
                tenant_id,
                run_id,
                status,
                reason,
                failed_action_id,
                risk,
                SUGGESTIONS[reason],
                error,
                signature,
                "{}",
                None,
                None,
                opened if status == "claimed" else None,
                fate if resolved else "",
                "seed_bench" if resolved else "",
                None,
                resolved_at,
                0,
                opened,
                resolved_at or opened,
                search_text,
            )
        )
        self.counts["resolved_items" if resolved else "open_items"] += 1

    def _approval(
        self,
        tenant_id: int,
        run_id: str,
        action_id: str,
        risk: str,
        tool: str,
        args: dict[str, Any],
        at: datetime,
    ) -> None:
        self.approvals.append(
            (
                ulid_at("apr", at),
                tenant_id,
                run_id,
                "action",
                action_id,
                None,
                "pending",
                risk,
                tool,
                dumps(args),
                sha256_hex(args),
                None,
                "",
                None,
                None,
                None,
                None,
                None,
                "",
                self.now + timedelta(days=7),
                at,
            )
        )
        self.counts["approvals"] += 1
