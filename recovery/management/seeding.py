"""Benchmark data by ``COPY``: the rows of one run at a time, as ``COPY`` text.

Both benchmark seeders build their rows here: ``manage.py seed_bench`` (the dashboard's shapes,
no audit events: bench data is not a history anyone will verify, and a half-made hash chain would
be worse than none) and the benchmark's year of history (``bench/size_seed.py``: millions of runs
with their audit chains, over several ``COPY`` streams). ``RunBuilder.build`` writes one run: the
run, its actions (the last one's status from the run's fate, the earlier ones succeeded), its
recovery item when it failed (open, claimed, or resolved by compensating or closing it), the
pending approval of an action that waits for one, and with ``audit`` the chain of events the
services write for all of that (``run.created``; per action ``action.recorded``,
``action.started``, then ``succeeded``/``failed``; the run's end; its item's events), hashed as
``ledger.audit`` hashes them, the run's ``audit_head`` its chain's last hash.

The rows respect every constraint the models declare and are consistent with the state machines
(a failed run's failing action is ``failed`` and earlier ones ``succeeded`` with a completion
order; an open item's run is ``failed``; a pending approval's action is ``awaiting_approval``).
They are built as strings (``COPY`` text): at millions of rows the formatting is the cost.

It lives in ``recovery`` because it writes recovery items and approvals beside the ledger's rows
(and so uses recovery's rule for an item's search text); the ledger never knows about recovery.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import datetime, timedelta
from typing import Any

from infra.hashing import sha256_hex
from infra.ids import new_id
from ledger.services.actions.payload import action_payload_hash
from recovery.transitions.items import search_text_for

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

# Plain ASCII without double quotes or backslashes: an error is spelled into COPY text and into
# the audit events' JSON as it is.
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

# A run's fates: how it ends. ``awaiting`` is running, its last action waiting for a person.
FATES = ("succeeded", "cancelled", "running", "awaiting", "open", "compensated", "closed")

GENESIS = "0" * 64
N = "\\N"  # NULL in COPY text

# The tables in the order they are written, with the columns their rows fill (the others keep
# their defaults: NULL, or the column's own default).
TABLES = (
    (
        "run",
        "ledger_run",
        "id, tenant_id, agent, request, external_id, user_id, goal, trace_url, resume_url, metadata, status, "
        "summary, error, failure_reason, failed_action_id, created_by_key_id, action_count, completion_count, "
        "created_at, updated_at, finished_at, last_heartbeat_at, audit_head",
    ),
    (
        "action",
        "ledger_action",
        "id, tenant_id, run_id, seq, tool, target_type, target_id, args, idempotency_key, payload_hash, "
        "intent, before_snapshot, after_snapshot, result, risk, action_class, approval_mode, "
        "requires_approval, policy, compensation_strategy, compensation_tool, compensation_args, status, "
        "attempts, error, error_layer, retryable, warnings, completion_seq, created_at, updated_at, "
        "started_at, completed_at",
    ),
    (
        "event",
        "ledger_event",
        "tenant_id, run_id, chain, kind, subject_type, subject_id, from_state, to_state, actor_type, "
        "actor_id, actor_label, reason, data, created_at, prev_hash, hash",
    ),
    (
        "item",
        "recovery_recoveryitem",
        "id, tenant_id, run_id, status, reason, failed_action_id, risk, suggested_resolution, error, "
        "signature, details, claimed_at, resolution, resolution_note, resolved_at, reopened_count, "
        "opened_at, updated_at, search_text",
    ),
    (
        "approval",
        "recovery_approval",
        "id, tenant_id, run_id, kind, action_id, status, risk, tool, args, args_hash, approved_args_hash, "
        "reason, expires_at, created_at",
    ),
)

# ``canonical_json`` of ``ledger.audit._hashed_fields`` (keys sorted, no spaces), as a template:
# every value seeded is plain ASCII without double quotes or backslashes, so %s is its JSON string
# body.
_EVENT_TEXT = (
    '{"actor_id":"%s","actor_label":"%s","actor_type":"agent_key","chain":"%s","created_at":"%s",'
    '"data":%s,"from_state":"%s","kind":"%s","reason":"%s","run":"%s","subject_id":"%s",'
    '"subject_type":"%s","tenant":%d,"to_state":"%s"}'
)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _ts(when: datetime) -> str:
    return when.isoformat()


class CopyRows:
    """Rows waiting for their ``COPY``, by table, and how many of each were built."""

    def __init__(self) -> None:
        self.rows: dict[str, list[str]] = {key: [] for key, _, _ in TABLES}
        self.counts = {
            "runs": 0,
            "actions": 0,
            "events": 0,
            "items": 0,
            "open_items": 0,
            "resolved_items": 0,
            "approvals": 0,
        }

    def copy_into(self, cursor: Any) -> None:
        """One ``COPY`` per table of the rows built since the last one (a psycopg 3 cursor; the
        caller owns the transaction)."""
        for key, table, columns in TABLES:
            rows = self.rows[key]
            if not rows:
                continue
            with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                copy.write("".join(rows))
            rows.clear()


class RunBuilder:
    """Builds one run's rows into ``CopyRows`` (``build``); ``audit`` writes its chain of events
    too. ``source`` names the seeder in the rows' policy stamps and resolution notes; ``reason``,
    when set, is every item's reason instead of ``REASONS``' mix; ``claimed_share`` of the open
    items are claimed."""

    def __init__(
        self,
        rows: CopyRows,
        rng: random.Random,
        *,
        now: datetime,
        audit: bool,
        source: str,
        reason: str = "",
        claimed_share: float = 0.1,
    ) -> None:
        self.w, self.rng, self.now, self.audit = rows, rng, now, audit
        self.source, self.reason, self.claimed_share = source, reason, claimed_share
        self.policy_json: dict[tuple[str, bool], str] = {}
        # The run being built.
        self.tenant_id = 0
        self.key_id = self.agent = self.run_id = self.chain = ""
        self.head = GENESIS
        self.last_at = now
        self.completion = 0
        self.failed_id = self.failed_tool = self.error = ""
        self.live_risks: list[str] = []
        self.succeeded_ids: list[str] = []

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
        if not self.audit:
            return
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
                    "source": self.source,
                },
                separators=(",", ":"),
            )
        return self.policy_json[key]

    def build(
        self, *, tenant_id: int, key_id: str | None, agent: str, created: datetime, fate: str, n: int
    ) -> None:
        """One run of ``n`` actions by ``agent`` (through ``key_id``, or no key), created at
        ``created``, ending as ``fate`` says (one of ``FATES``)."""
        rng = self.rng
        self.tenant_id, self.key_id, self.agent = tenant_id, key_id or "", agent
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
        run_status = self._finish(fate, finished, request)
        ended = run_status != "running"
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
                    key_id or N,
                    str(n),
                    str(self.completion),
                    _ts(created),
                    _ts(self.last_at),
                    _ts(finished) if ended else N,
                    # A running run's heartbeat is fresh: a sweeper does not turn it into an
                    # agent_lost item while the benchmark measures something else.
                    _ts(self.now if not ended else finished),
                    self.head if self.audit else "",
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
            # The gated call: its policy is manual approval, like payments.charge.
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
            err = rng.choice(ERRORS).format(n=rng.randrange(5, 120), tool=tool)
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
            self.succeeded_ids.append(action_id)
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

    def _finish(self, fate: str, at: datetime, request: str) -> str:
        """The run's end (its events, and its recovery item when it failed): its status."""
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
            f'{{"failed_action":"{self.failed_id}","reason":"failed"}}',
            "running",
            "failed",
            self.error,
        )
        item_id = new_id("rec", at=at)
        resolved_at = None
        if fate in ("closed", "compensated"):
            resolved_at = at + timedelta(minutes=self.rng.uniform(1, 120))
            self.last_at = resolved_at
        self._item(item_id, fate, at, resolved_at, request)
        if resolved_at is None:
            return "failed"
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
            for action_id in self.succeeded_ids:
                self.event(
                    "action.compensated", "action", action_id, resolved_at, "{}", "succeeded", "compensated"
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
        return fate

    def _item(
        self, item_id: str, fate: str, at: datetime, resolved_at: datetime | None, request: str
    ) -> None:
        rng = self.rng
        reason = self.reason or rng.choices([r for r, _ in REASONS], [w for _, w in REASONS])[0]
        risk = max(self.live_risks or ["low"], key=RISK_ORDER.__getitem__)
        self.event(
            "recovery.opened",
            "recoveryitem",
            item_id,
            at,
            f'{{"reason":"{reason}","risk":"{risk}"}}',
            "",
            "open",
            self.error,
        )
        status = "open" if resolved_at is None else "resolved"
        if status == "open" and rng.random() < self.claimed_share:
            status = "claimed"
        signature = sha256_hex(f"{reason}|{self.error[:12]}")[:16]
        self.w.rows["item"].append(
            "\t".join(
                (
                    item_id,
                    str(self.tenant_id),
                    self.run_id,
                    status,
                    reason,
                    self.failed_id or N,
                    risk,
                    SUGGESTIONS[reason],
                    self.error,
                    signature,
                    "{}",
                    _ts(at) if status == "claimed" else N,
                    fate if resolved_at else "",
                    self.source if resolved_at else "",
                    _ts(resolved_at) if resolved_at else N,
                    "0",
                    _ts(at),
                    _ts(resolved_at or at),
                    _escape(search_text_for(tool=self.failed_tool, request=request)),
                )
            )
            + "\n"
        )
        self.w.counts["items"] += 1
        self.w.counts["resolved_items" if resolved_at else "open_items"] += 1

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
                    _ts(self.now + timedelta(days=7)),
                    _ts(at),
                )
            )
            + "\n"
        )
        self.w.counts["approvals"] += 1
