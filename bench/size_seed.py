"""A year of ledger history, fast: millions of runs, actions and audit events by ``COPY``.

What ``make bench``'s "At size" phase (``bench/size.py``) measures against. ``seed_bench`` fills
the dashboard's tables for the pages; this fills everything that grows with traffic, the audit
log included, at the issue's size (10 million actions, ~30 million events) in minutes:

- runs are generated in time order (a year, evenly spread: steady traffic), so ids, chains and
  ``created_at`` grow the way a live system's do and most indexes take their rows at their right
  edge; the few indexes on random keys (an event's hash, an action's target) are dropped before
  the load and built once after it, which is what makes the difference between minutes and
  hours (``RANDOM_KEY_INDEXES``);
- ``workers`` processes each write one slice of the year over their own connection (``COPY``
  text, built as strings: the row formatting is the cost), committing every ``BATCH_RUNS`` runs;
- each session runs with ``session_replication_role = replica`` (triggers and foreign-key checks
  off: the rows are consistent by construction, and checked after: ``check``) and
  ``synchronous_commit = off``.

Every run's audit chain is what the services write for it (``run.created``; per action
``action.recorded``, ``action.started``, then ``succeeded``/``failed``; the run's end, its
recovery item's events), hashed exactly as ``ledger.audit`` hashes (``_event_digest`` of
``_hashed_fields``, spelled here as text: ``check`` verifies a sample with ``audit_verify``), and
the run's ``audit_head`` is its chain's last hash. Runs end in every status; the ones of the last
days are running, waiting for approval or failed with an open recovery item; a year's worth are
closed. Actions per run vary (1 to ~60); two failed runs in the queue have ``big_runs`` actions
(200 and 5,000 by default: the run page's two sizes).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from infra.hashing import sha256_hex
from infra.ids import new_id
from ledger.services.actions.payload import action_payload_hash
from recovery.items import search_text_for
from recovery.management.commands.seed_bench import TOOL_WEIGHTS, TOOLS

GENESIS = "0" * 64
BATCH_RUNS = 2000
DAY = 86400.0

# The tools and their weights are seed_bench's catalogue: the two seeds describe the same agents' work.
AGENTS = ["onboarding", "offboarding", "crm-sync", "support-triage", "billing-ops", "release-bot"]
AGENT_WEIGHTS = [20, 8, 25, 15, 6, 5]
TENANT_WEIGHTS = [0.6, 0.3, 0.1]
REASONS = [("failed", 60), ("verification_failed", 10), ("agent_lost", 10), ("compensation_failed", 10)]
SUGGESTIONS = {"failed": "compensate", "verification_failed": "review", "agent_lost": "resume"}
RISK_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}
ERRORS = [
    "timeout after 30s calling {tool}",
    "rate limited by upstream (429) calling {tool}",
    "connection reset by peer while calling {tool}",
    "upstream returned 503 Service Unavailable",
]

# Indexes whose keys arrive in random order (a hash, a random target id): each insert touches a
# random leaf, so a 30-million-row load keeps rewriting the whole index. Dropped before the load
# and built once after it. The rest take their keys in time order and stay.
RANDOM_KEY_INDEXES = {
    "ledger_event": ["ledger_event_hash_key", "ledger_event_hash_79a381be_like"],
    "ledger_action": ["action_tenant_target"],
}

# With ``drop_all_indexes``: every index of these tables but the primary key, built after the load.
DROPPED_TABLES = ("ledger_event", "ledger_action")

RUN_COLUMNS = (
    "id, tenant_id, agent, request, external_id, user_id, goal, trace_url, resume_url, metadata, status, "
    "summary, error, failure_reason, failed_action_id, created_by_key_id, action_count, completion_count, "
    "created_at, updated_at, finished_at, last_heartbeat_at, audit_head"
)
ACTION_COLUMNS = (
    "id, tenant_id, run_id, seq, tool, target_type, target_id, args, idempotency_key, payload_hash, intent, "
    "before_snapshot, after_snapshot, result, risk, action_class, approval_mode, requires_approval, policy, "
    "compensation_strategy, compensation_tool, compensation_args, status, attempts, error, error_layer, "
    "retryable, warnings, completion_seq, created_at, updated_at, started_at, completed_at"
)
EVENT_COLUMNS = (
    "tenant_id, run_id, chain, kind, subject_type, subject_id, from_state, to_state, actor_type, actor_id, "
    "actor_label, reason, data, created_at, prev_hash, hash"
)
ITEM_COLUMNS = (
    "id, tenant_id, run_id, status, reason, failed_action_id, risk, suggested_resolution, error, signature, "
    "details, claimed_at, resolution, resolution_note, resolved_at, reopened_count, opened_at, updated_at, "
    "search_text"
)
APPROVAL_COLUMNS = (
    "id, tenant_id, run_id, kind, action_id, status, risk, tool, args, args_hash, approved_args_hash, reason, "
    "expires_at, created_at"
)

# ``canonical_json`` of ``ledger.audit._hashed_fields`` (keys sorted, no spaces), as a template:
# every value seeded is plain ASCII without quotes or backslashes, so %s is its JSON string body.
_EVENT_TEXT = (
    '{"actor_id":"%s","actor_label":"%s","actor_type":"agent_key","chain":"%s","created_at":"%s",'
    '"data":%s,"from_state":"%s","kind":"%s","reason":"%s","run":"%s","subject_id":"%s",'
    '"subject_type":"%s","tenant":%d,"to_state":"%s"}'
)
N = "\\N"


@dataclass
class Spec:
    """What to seed: ``actions`` in total over ``days``, about ``mean_actions`` per run."""

    actions: int
    days: int = 365
    mean_actions: int = 15
    open_items: int = 2000
    pending_approvals: int = 500
    running: int = 500
    big_runs: tuple[int, ...] = (200, 5000)
    workers: int = 2
    drop_all_indexes: bool = True
    seed: int = 30
    # (tenant id, [(key id, agent name)]) per tenant, made by the caller through the services.
    tenants: list[tuple[int, list[tuple[str, str]]]] = field(default_factory=list)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _ts(when: datetime) -> str:
    return when.isoformat()


class _Writer:
    """One worker's rows, flushed as one COPY per table every ``BATCH_RUNS`` runs."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.rows: dict[str, list[str]] = {"run": [], "action": [], "event": [], "item": [], "approval": []}
        self.counts = {"runs": 0, "actions": 0, "events": 0, "items": 0, "approvals": 0}

    def flush(self) -> None:
        tables = (
            ("run", "ledger_run", RUN_COLUMNS),
            ("action", "ledger_action", ACTION_COLUMNS),
            ("event", "ledger_event", EVENT_COLUMNS),
            ("item", "recovery_recoveryitem", ITEM_COLUMNS),
            ("approval", "recovery_approval", APPROVAL_COLUMNS),
        )
        with self.conn.transaction(), self.conn.cursor() as cursor:
            for key, table, columns in tables:
                rows = self.rows[key]
                if not rows:
                    continue
                with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    copy.write("".join(rows))
                rows.clear()


class _Run:
    """Builds one run's rows: the run, its actions, its chain of events, its item or approval."""

    def __init__(self, writer: _Writer, rng: random.Random, spec: Spec) -> None:
        self.w = writer
        self.rng = rng
        self.spec = spec
        self.policy_json: dict[tuple[str, bool], str] = {}
        # The run being built (``build``).
        self.tenant_id = 0
        self.key_id = self.agent = self.run_id = self.chain = ""
        self.head = GENESIS
        self.last_at = spec.now
        self.completion = 0
        self.failed_id = self.failed_tool = self.error = ""
        self.live_risks: list[str] = []
        self.succeeded_ids: list[tuple[str, datetime]] = []

    def event(
        self,
        kind: str,
        subject_type: str,
        subject_id: str,
        at: datetime,
        data: str = "{}",
        from_state: str = "",
        to_state: str = "",
        reason: str = "",
    ) -> None:
        created = _ts(at)
        text = _EVENT_TEXT % (
            self.key_id,
            self.agent,
            self.chain,
            created,
            data,
            from_state,
            kind,
            reason,
            self.run_id,
            subject_id,
            subject_type,
            self.tenant_id,
            to_state,
        )
        digest = hashlib.sha256(f"{self.head}.{text}".encode()).hexdigest()
        self.w.rows["event"].append(
            f"{self.tenant_id}\t{self.run_id}\t{self.chain}\t{kind}\t{subject_type}\t{subject_id}\t{from_state}\t"
            f"{to_state}\tagent_key\t{self.key_id}\t{self.agent}\t{reason}\t{data}\t{created}\t{self.head}\t{digest}\n"
        )
        self.head = digest
        self.w.counts["events"] += 1

    def _policy(self, tool: str, risk: str, action_class: str, manual: bool) -> str:
        key = (tool, manual)
        if key not in self.policy_json:
            self.policy_json[key] = json.dumps(
                {
                    "tool": tool,
                    "pattern": tool,
                    "risk": risk,
                    "approval": "manual" if manual else "auto",
                    "action_class": action_class,
                    "requires_approval": manual,
                    "scope": "global",
                    "source": "bench.size_seed",
                },
                separators=(",", ":"),
            )
        return self.policy_json[key]

    def build(self, *, tenant_id: int, key_id: str, agent: str, created: datetime, fate: str, n: int) -> None:
        rng = self.rng
        self.tenant_id, self.key_id, self.agent = tenant_id, key_id, agent
        self.run_id = new_id("run", at=created)
        self.chain = f"run:{self.run_id}"
        self.head = GENESIS
        user = f"user{rng.randrange(50_000)}@example.com"
        request = f"{agent}: handle request for {user}"
        external = f"ext-{rng.randrange(10**9)}"
        step = timedelta(seconds=rng.uniform(0.5, 8))
        self.event(
            "run.created",
            "run",
            self.run_id,
            created,
            f'{{"agent":"{agent}","external_id":"{external}"}}',
            to_state="running",
        )
        last = {
            "succeeded": "succeeded",
            "cancelled": "succeeded",
            "running": "running",
            "awaiting": "awaiting_approval",
        }.get(fate, "failed")
        self.completion = 0
        self.failed_id = self.failed_tool = self.error = ""
        self.live_risks = []
        self.succeeded_ids = []
        for seq in range(1, n + 1):
            self._action(
                seq,
                status=last if seq == n else "succeeded",
                fate=fate,
                at=created + step * seq,
                step=step,
                user=user,
            )
        finished = created + step * (n + 1)
        run_status = self._finish(
            fate,
            finished,
            self.failed_id,
            self.failed_tool,
            self.error,
            request,
            self.live_risks,
            self.succeeded_ids,
        )
        ended = run_status not in ("running",)
        self.w.rows["run"].append(
            "\t".join(
                (
                    self.run_id,
                    str(tenant_id),
                    agent,
                    request,
                    external,
                    user,
                    f"Help {user}",
                    "",
                    "",
                    "{}",
                    run_status,
                    "done" if run_status == "succeeded" else "",
                    self.error,
                    "failed" if self.error else "",
                    self.failed_id or N,
                    key_id,
                    str(n),
                    str(self.completion),
                    _ts(created),
                    _ts(self.last_at),
                    _ts(finished) if ended else N,
                    _ts(self.spec.now if not ended else finished),
                    self.head,
                )
            )
            + "\n"
        )
        self.w.counts["runs"] += 1

    def _action(self, seq: int, *, status: str, fate: str, at: datetime, step: timedelta, user: str) -> None:
        """One action's row and its events (and its approval when it waits for one)."""
        rng = self.rng
        tenant_id, agent = self.tenant_id, self.agent
        tool, target_type, action_class, risk, comp_tool, strategy = rng.choices(TOOLS, TOOL_WEIGHTS)[0]
        if status == "awaiting_approval":
            tool, target_type, action_class, risk, comp_tool, strategy = TOOLS[-1]
        done_at = at + step / 2
        action_id = new_id("act", at=at)
        target_id = f"{target_type}-{rng.randrange(100_000)}"
        args = {"note": f"step {seq} for {user}", "target": target_id}
        compensation = (
            {"tool": comp_tool, "args": {"id": target_id}} if strategy in ("custom", "correction") else None
        )
        idem = f"{self.run_id}:{seq}"
        manual = status == "awaiting_approval"
        err = ""
        if status == "succeeded":
            self.completion += 1
        if status in ("succeeded", "running", "failed"):
            self.live_risks.append(risk)
        if status == "failed":
            err = rng.choice(ERRORS).format(tool=tool)
            self.error, self.failed_id, self.failed_tool = err, action_id, tool
        completed = status in ("succeeded", "failed")
        args_text = f'{{"note":"step {seq} for {user}","target":"{target_id}"}}'
        row_status = "compensated" if fate == "compensated" and status == "succeeded" else status
        self.w.rows["action"].append(
            "\t".join(
                (
                    action_id,
                    str(tenant_id),
                    self.run_id,
                    str(seq),
                    tool,
                    target_type,
                    target_id,
                    args_text,
                    idem,
                    action_payload_hash(
                        tool=tool,
                        target_type=target_type,
                        target_id=target_id,
                        args=args,
                        compensation=compensation,
                    ),
                    f'{{"confidence":{rng.uniform(0.5, 0.99):.2f},"reasoning":"{agent} needs {tool}"}}',
                    '{"state":"before"}' if strategy == "snapshot" else N,
                    '{"state":"after"}' if strategy == "snapshot" and completed else N,
                    '{"ok":true}' if status == "succeeded" else N,
                    risk,
                    action_class,
                    "manual" if manual else "auto",
                    "t" if manual else "f",
                    self._policy(tool, risk, action_class, manual),
                    strategy,
                    comp_tool,
                    f'{{"id":"{target_id}"}}' if compensation else N,
                    row_status,
                    "0" if manual else "1",
                    err,
                    "tool" if err else "",
                    "f" if err else N,
                    "[]",
                    str(self.completion) if status == "succeeded" else N,
                    _ts(at),
                    _ts(done_at if completed else at),
                    N if manual else _ts(at),
                    _ts(done_at) if completed else N,
                )
            )
            + "\n"
        )
        self.w.counts["actions"] += 1
        self.event(
            "action.recorded",
            "action",
            action_id,
            at,
            f'{{"idempotency_key":"{idem}","risk":"{risk}","target_id":"{target_id}","tool":"{tool}"}}',
            to_state="planned",
        )
        if manual:
            self.event(
                "action.awaiting_approval", "action", action_id, at, from_state="planned", to_state=status
            )
            self._approval(action_id, risk, tool, args, at)
            return
        self.event("action.started", "action", action_id, at, '{"attempt":1}', "planned", "running")
        if status == "succeeded":
            self.event(
                "action.succeeded",
                "action",
                action_id,
                done_at,
                f'{{"completion_seq":{self.completion}}}',
                "running",
                "succeeded",
            )
            self.succeeded_ids.append((action_id, done_at))
        elif status == "failed":
            self.event(
                "action.failed",
                "action",
                action_id,
                done_at,
                '{"layer":"tool","retryable":false}',
                "running",
                "failed",
                err,
            )

    def _finish(
        self,
        fate: str,
        at: datetime,
        failed_id: str,
        failed_tool: str,
        error: str,
        request: str,
        live_risks: list[str],
        succeeded_ids: list[tuple[str, datetime]],
    ) -> str:
        self.last_at = at
        if fate in ("running", "awaiting"):
            return "running"
        if fate == "succeeded":
            self.event("run.completed", "run", self.run_id, at, "{}", "running", "succeeded")
            return "succeeded"
        if fate == "cancelled":
            self.event(
                "run.cancelled", "run", self.run_id, at, "{}", "running", "cancelled", "cancelled by operator"
            )
            return "cancelled"
        # failed: open (in the queue), or closed / compensated (the item resolved)
        self.event(
            "run.failed",
            "run",
            self.run_id,
            at,
            f'{{"failed_action":"{failed_id}","reason":"failed"}}',
            "running",
            "failed",
            error,
        )
        rng = self.rng
        reason = rng.choices([r for r, _ in REASONS], [w for _, w in REASONS])[0]
        risk = max(live_risks or ["low"], key=RISK_ORDER.__getitem__)
        item_id = new_id("rec", at=at)
        self.event(
            "recovery.opened",
            "recoveryitem",
            item_id,
            at,
            f'{{"reason":"{reason}","risk":"{risk}"}}',
            "",
            "open",
            error,
        )
        resolved_at = None
        status = "open" if fate.startswith("open") else "resolved"
        if status == "open" and rng.random() < 0.1:
            status = "claimed"
        if fate in ("closed", "compensated"):
            resolved_at = at + timedelta(minutes=rng.uniform(1, 120))
            self.last_at = resolved_at
            if fate == "compensated":
                self.event(
                    "run.compensating",
                    "run",
                    self.run_id,
                    resolved_at,
                    "{}",
                    "failed",
                    "compensating",
                    "compensate",
                )
                for action_id, _ in succeeded_ids:
                    self.event(
                        "action.compensated",
                        "action",
                        action_id,
                        resolved_at,
                        "{}",
                        "succeeded",
                        "compensated",
                    )
                self.event(
                    "run.compensated", "run", self.run_id, resolved_at, "{}", "compensating", "compensated"
                )
            else:
                self.event(
                    "run.closed", "run", self.run_id, resolved_at, "{}", "failed", "closed", "handled by hand"
                )
            self.event(
                "recovery.resolved",
                "recoveryitem",
                item_id,
                resolved_at,
                f'{{"resolution":"{fate}"}}',
                "open",
                "resolved",
            )
        signature = sha256_hex(f"{reason}|{error[:12]}")[:16]
        self.w.rows["item"].append(
            "\t".join(
                (
                    item_id,
                    str(self.tenant_id),
                    self.run_id,
                    status,
                    reason,
                    failed_id or N,
                    risk,
                    SUGGESTIONS.get(reason, "review"),
                    error,
                    signature,
                    "{}",
                    _ts(at) if status == "claimed" else N,
                    fate if resolved_at else "",
                    "bench.size_seed" if resolved_at else "",
                    _ts(resolved_at) if resolved_at else N,
                    "0",
                    _ts(at),
                    _ts(resolved_at or at),
                    _escape(search_text_for(tool=failed_tool, request=request)),
                )
            )
            + "\n"
        )
        self.w.counts["items"] += 1
        if fate == "compensated":
            return "compensated"
        return "closed" if fate == "closed" else "failed"

    def _approval(self, action_id: str, risk: str, tool: str, args: dict[str, Any], at: datetime) -> None:
        self.w.rows["approval"].append(
            "\t".join(
                (
                    new_id("apr", at=at),
                    str(self.tenant_id),
                    self.run_id,
                    "action",
                    action_id,
                    "pending",
                    risk,
                    tool,
                    json.dumps(args, separators=(",", ":"), sort_keys=True),
                    sha256_hex(args),
                    "",
                    "",
                    _ts(self.spec.now + timedelta(days=7)),
                    _ts(at),
                )
            )
            + "\n"
        )
        self.w.counts["approvals"] += 1


def _fate(rng: random.Random, age_s: float, spec: Spec, recent_runs: float) -> str:
    """A run's end by its age: the last three days hold the live work (running, waiting, open
    items), everything older has ended."""
    if age_s < 3 * DAY:
        r = rng.random() * recent_runs
        if r < spec.open_items:
            return "open"
        if r < spec.open_items + spec.pending_approvals:
            return "awaiting"
        if r < spec.open_items + spec.pending_approvals + spec.running:
            return "running"
    r = rng.random()
    if r < 0.90:
        return "succeeded"
    if r < 0.92:
        return "cancelled"
    return "closed" if r < 0.96 else "compensated"


def _worker(dsn: str, spec: Spec, index: int, first: int, last: int, total: int, queue: Any) -> None:
    import psycopg

    rng = random.Random(spec.seed * 1000 + index)
    span = spec.days * DAY
    start = spec.now - timedelta(seconds=span)
    recent_runs = max(1.0, total * 3 * DAY / span)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("SET synchronous_commit = off")
        writer = _Writer(conn)
        builder = _Run(writer, rng, spec)
        # Actions per run: 1 + a geometric number with the wanted mean (most runs short, a tail).
        p = 1 / spec.mean_actions
        for i in range(first, last):
            created = start + timedelta(seconds=span * (i + rng.random()) / total)
            age_s = (spec.now - created).total_seconds()
            fate = _fate(rng, age_s, spec, recent_runs)
            n = min(60, 1 + int(rng.expovariate(p)))
            tenant_id, keys = rng.choices(spec.tenants, TENANT_WEIGHTS[: len(spec.tenants)])[0]
            key_id, agent = rng.choices(keys, AGENT_WEIGHTS[: len(keys)])[0]
            builder.build(tenant_id=tenant_id, key_id=key_id, agent=agent, created=created, fate=fate, n=n)
            if (i - first + 1) % BATCH_RUNS == 0:
                writer.flush()
        if index == 0:
            # The run page's sizes: failed runs in the first tenant's queue, an hour old.
            tenant_id, keys = spec.tenants[0]
            for size in spec.big_runs:
                created = spec.now - timedelta(hours=1, seconds=rng.uniform(0, 600))
                builder.build(
                    tenant_id=tenant_id,
                    key_id=keys[0][0],
                    agent=keys[0][1],
                    created=created,
                    fate="open",
                    n=size,
                )
        writer.flush()
    queue.put(writer.counts)


def _indexes(conn: Any, tables: tuple[str, ...]) -> list[tuple[str, str, str, str | None]]:
    """(table, index, CREATE INDEX …, constraint type or None) of ``tables``' indexes but their
    primary keys."""
    rows = conn.execute(
        "SELECT t.relname, ix.relname, pg_get_indexdef(i.indexrelid), c.contype FROM pg_index i "
        "JOIN pg_class ix ON ix.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid "
        "WHERE t.relname = ANY(%s) AND NOT i.indisprimary ORDER BY t.relname, ix.relname",
        [list(tables)],
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _drop_indexes(dsn: str, spec: Spec) -> list[tuple[str, str, str, str | None]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        dropped = _indexes(conn, DROPPED_TABLES if spec.drop_all_indexes else ())
        dropped += [
            d
            for d in _indexes(conn, tuple(RANDOM_KEY_INDEXES))
            if d[1] in RANDOM_KEY_INDEXES[d[0]] and d not in dropped
        ]
        for table, name, _, contype in dropped:
            if contype:
                conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            else:
                conn.execute(f'DROP INDEX "{name}"')
    return dropped


def _build_indexes(dsn: str, dropped: list[tuple[str, str, str, str | None]]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        for table, name, definition, contype in dropped:
            conn.execute(definition)
            if contype == "u":
                conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" UNIQUE USING INDEX "{name}"')


def _copy_in_parallel(dsn: str, spec: Spec, total_runs: int) -> dict[str, int]:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    workers = max(1, spec.workers)
    bounds = [total_runs * k // workers for k in range(workers + 1)]
    procs = [
        ctx.Process(target=_worker, args=(dsn, spec, k, bounds[k], bounds[k + 1], total_runs, queue))
        for k in range(workers)
    ]
    for proc in procs:
        proc.start()
    counts: dict[str, int] = {}
    for _ in procs:
        for key, value in queue.get().items():
            counts[key] = counts.get(key, 0) + value
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a seeding worker failed (exit {proc.exitcode})")
    return counts


def seed(dsn: str, spec: Spec, *, log: Any = print) -> dict[str, Any]:
    """Seed ``spec`` into the database at ``dsn`` (migrated, with its tenants and keys made);
    return the counts and where the time went."""
    import psycopg

    timings: dict[str, float] = {}
    total_runs = max(1, spec.actions // spec.mean_actions)
    t0 = time.perf_counter()
    dropped = _drop_indexes(dsn, spec)
    timings["drop_indexes_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    counts = _copy_in_parallel(dsn, spec, total_runs)
    timings["copy_s"] = time.perf_counter() - t1
    log(f"size seed: COPY done in {timings['copy_s']:.0f}s: {counts}")
    t2 = time.perf_counter()
    _build_indexes(dsn, dropped)
    timings["build_indexes_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in (
            "ledger_run",
            "ledger_action",
            "ledger_event",
            "recovery_recoveryitem",
            "recovery_approval",
        ):
            conn.execute(f"VACUUM (ANALYZE) {table}")
    timings["vacuum_analyze_s"] = time.perf_counter() - t3
    timings["total_s"] = time.perf_counter() - t0
    return {
        "counts": counts,
        "timings": timings,
        "workers": max(1, spec.workers),
        "runs_planned": total_runs,
        "indexes_built_after": [name for _, name, _, _ in dropped],
    }


def check(*, sample: int = 200, seed: int = 1) -> dict[str, Any]:
    """The seeded data is what the product would have written: ``audit_verify`` and
    ``audit_heads_verify`` pass on a sample of runs (the big ones included), and no action or
    event points at a run that is not there."""
    from django.db import connection

    from ledger.audit import audit_heads_verify, audit_verify
    from ledger.models import Run

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", [1 / (seed + 1)])
        cursor.execute("SELECT id FROM ledger_run ORDER BY random() LIMIT %s", [sample])
        ids = [r[0] for r in cursor.fetchall()]
    ids += list(Run.objects.filter(action_count__gte=200).values_list("pk", flat=True))
    checked = 0
    problems = []
    for run_id in ids:
        n, broken = audit_verify(chain=f"run:{run_id}")
        checked += n
        if broken is not None:
            problems.append(f"{broken.chain} event {broken.event_id}: {broken.problem}")
        problems += [f"{gap.chain}: truncated" for gap in audit_heads_verify(chain=f"run:{run_id}")]
    return {
        "runs": len(ids),
        "events": checked,
        "problems": problems[:10],
        "ok": not problems and checked > 0,
        "seconds": time.perf_counter() - started,
    }
