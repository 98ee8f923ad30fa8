"""Loading a policy file (``manage.py load_policies``): parse, validate, then replace one scope.

Two layouts are accepted. The native one (API.md, "Policies and compensators") is validated
strictly: exact lower-case enum values, no unknown keys. The ``agentSafety`` layout seen in the
wild is translated into the native shape first (camelCase keys, upper-case enum values, durations
such as ``"30s"``) and then goes through the same validation, so both layouts mean the same thing
once loaded.

A load is one transaction: a file with any error changes nothing, and every error names the
entry it is about (``policies[2] (tool "payments.charge"): risk: must be one of …``). Loading the
same file twice changes nothing: rows whose content is already what the file says are not
written at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from django.db import connection, transaction
from pydantic import ValidationError

from infra.hashing import canonical_json, sha256_hex
from ledger.audit import Actor, audit_record
from ledger.models import Compensator, PolicySet, StateReader, Tenant, ToolPolicy
from ledger.policies.agent_safety import AGENT_SAFETY, agent_safety_translate
from ledger.policies.before_checks import before_warnings
from ledger.policies.compensation_risks import unattended_destructive_compensations
from ledger.policies.deadlines import escalation_problems
from ledger.policies.errors import PolicyFileError, Problems, entry_of, validation_problems
from ledger.policies.resolve import policy_pick
from ledger.policies.retention import retention_problems
from ledger.policies.rule_checks import limits_problems, rules_problems
from ledger.policies.schema import DefaultPolicyIn, PolicyFileIn, PolicyIn
from ledger.policies.upstream_reach import policy_upstream_mismatches

logger = structlog.get_logger(__name__)

NATIVE = "native"

# --- Parsing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyDocument:
    """A validated policy file, in the native vocabulary."""

    layout: str
    default_policy: dict[str, Any]
    policies: list[dict[str, Any]]
    compensators: dict[str, dict[str, Any]]
    unwind: dict[str, Any]
    auto_compensate: dict[str, Any]
    audit: dict[str, Any]
    # The ``before`` reads' readers for the worker (tool → ``StateReader`` fields).
    readers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        return sha256_hex(
            {
                "default_policy": self.default_policy,
                "policies": self.policies,
                "compensators": self.compensators,
                "unwind": self.unwind,
                "auto_compensate": self.auto_compensate,
                "audit": self.audit,
                # Only when the file has readers: a file without them hashes as it always did.
                **({"readers": self.readers} if self.readers else {}),
            }
        )


def _rules_and_limits_problems(native: Any, prefix: str) -> list[str]:
    """Every problem of the policies' ``rules`` and ``limits``, each naming its policy, the rule or
    limit index and the field: ``policies[2] (tool "payments.charge"): rules[1].if.gt: expected a
    number, got '10000'``."""
    policies = native.get("policies") if isinstance(native, dict) else None
    if not isinstance(policies, list):
        return []
    problems: list[str] = []
    for index, policy in enumerate(policies):
        if not isinstance(policy, dict):
            continue
        entry, _ = entry_of(("policies", index), native, prefix)
        if policy.get("rules") is not None:
            problems.extend(f"{entry}: {p}" for p in rules_problems(policy["rules"]))
        if policy.get("limits") is not None:
            problems.extend(f"{entry}: {p}" for p in limits_problems(policy["limits"]))
    return problems


def _before_reads_problems(parsed: PolicyFileIn, native: Any, prefix: str) -> list[str]:
    """Each ``before`` whose read is not a read: the policy this file gives ``before.tool`` must be
    ``read_only`` (a read that changed something would change it on every call it guards)."""
    problems: list[str] = []
    rows = [ToolPolicy(tool=p.tool, action_class=p.action_class) for p in parsed.policies]
    for index, policy in enumerate(parsed.policies):
        if policy.before is None:
            continue
        entry, _ = entry_of(("policies", index), native, prefix)
        read = policy_pick(rows, policy.before.tool)
        if read is None:
            problems.append(
                f'{entry}: before.tool: no policy in this file names "{policy.before.tool}"; the read '
                "needs a policy of its own with action_class read_only"
            )
        elif read.action_class != "read_only":
            problems.append(
                f'{entry}: before.tool: "{policy.before.tool}" is governed by the policy for '
                f'"{read.tool}", whose action_class is {read.action_class}; a read must be read_only'
            )
    return problems


def policy_file_parse(data: Any, *, source: str = "policy file") -> PolicyDocument:
    """Validate a decoded policy file in either layout; raise ``PolicyFileError`` listing every
    problem."""
    if not isinstance(data, dict):
        raise PolicyFileError(source, ["file: must be a JSON object"])
    layout = NATIVE
    prefix = ""
    problems = Problems()
    native: Any = data
    if AGENT_SAFETY in data:
        layout, prefix = AGENT_SAFETY, "agentSafety."
        for key in data:
            if key != AGENT_SAFETY:
                problems.add(
                    key, 'unknown key next to "agentSafety" (mixing the two layouts is not supported)'
                )
        native = agent_safety_translate(data[AGENT_SAFETY], problems)
    try:
        parsed = PolicyFileIn.model_validate(native)
    except ValidationError as exc:
        problems.items.extend(validation_problems(exc, native, prefix))
        parsed = None
    problems.items.extend(_rules_and_limits_problems(native, prefix))
    if parsed is not None:
        problems.items.extend(_before_reads_problems(parsed, native, prefix))
    if isinstance(native, dict):
        problems.items.extend(retention_problems(native.get("audit"), prefix))
    if problems.items or parsed is None:
        raise PolicyFileError(source, problems.items)

    policies = [
        {
            "tool": p.tool,
            "risk": p.risk,
            "approval": p.approval,
            "action_class": p.action_class,
            "compensation": p.effective_compensation(),
            "compensation_tool": p.compensation_tool or "",
            "compensation_args": p.compensation_args,
            # Only when the file sets them (the content hash of a file without them is unchanged);
            # the loader stores the defaults for the others (POLICY_DEFAULTS).
            **({"approvers": p.approvers} if p.approvers is not None else {}),
            **_deadline_fields(p),
            **({"rules": p.rules} if p.rules else {}),
            **({"limits": p.limits} if p.limits else {}),
            **({"before": p.before.model_dump(exclude_none=True)} if p.before is not None else {}),
        }
        for p in parsed.policies
    ]
    readers = {
        tool: {
            "kind": spec.kind,
            "url": spec.webhook or spec.mcp or "",
            "secret": spec.secret or "",
            "secret_env": spec.secret_env or "",
            "python_path": spec.python or "",
            "mcp_tool": spec.tool or "",
            "headers_env": dict(spec.headers_env or {}),
        }
        for tool, spec in parsed.readers.items()
    }
    compensators = {
        tool: {
            "kind": spec.kind,
            "url": spec.webhook or spec.mcp or "",
            "secret": spec.secret or "",
            "secret_env": spec.secret_env or "",
            "python_path": spec.python or "",
            "mcp_tool": spec.tool or "",
            "headers_env": dict(spec.headers_env or {}),
            "reader_path": spec.reader or "",
        }
        for tool, spec in parsed.compensators.items()
    }
    # Only what the file says is stored; the resolver layers it over the global set and the
    # built-in defaults, so an omitted section means "inherit", not "reset".
    return PolicyDocument(
        layout=layout,
        default_policy=_default_policy(parsed.default_policy),
        policies=policies,
        compensators=compensators,
        unwind=parsed.unwind.model_dump(exclude_none=True) if parsed.unwind else {},
        auto_compensate=parsed.auto_compensate.model_dump(exclude_unset=True)
        if parsed.auto_compensate
        else {},
        audit=json.loads(canonical_json(parsed.audit or {})),
        readers=readers,
    )


def _deadline_fields(policy: PolicyIn | DefaultPolicyIn) -> dict[str, Any]:
    """The approval deadline a policy sets, as stored (``approval_timeout`` in whole seconds, as
    ``approval_timeout_s``); only what it sets, so a file without deadlines hashes as before."""
    fields: dict[str, Any] = {}
    if policy.approval_timeout is not None:
        fields["approval_timeout_s"] = policy.approval_timeout
    if policy.on_timeout is not None:
        fields["on_timeout"] = policy.on_timeout
    if policy.escalate_to is not None:
        fields["escalate_to"] = policy.escalate_to
    return fields


def _default_policy(default: DefaultPolicyIn | None) -> dict[str, Any]:
    if default is None:
        return {}
    dumped = default.model_dump(exclude_none=True, exclude={"approval_timeout", "on_timeout", "escalate_to"})
    return {**dumped, **_deadline_fields(default)}


def policy_file_read(path: str | Path) -> Any:
    """Decode a policy file, turning I/O and JSON errors into a ``PolicyFileError``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyFileError(source, ["file: does not exist"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyFileError(source, [f"file: cannot be read ({exc})"]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyFileError(
            source, [f"file: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"]
        ) from None


# --- Loading ---------------------------------------------------------------------------------


@dataclass
class LoadReport:
    source: str
    layout: str
    scope: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # What the file's author should know about the scope as it is after the load, whether or not
    # this load changed it (``policy_load_warnings``), one sentence each.
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.removed)

    def summary(self) -> str:
        return f"{len(self.created)} created, {len(self.updated)} updated, {len(self.unchanged)} unchanged"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "layout": self.layout,
            "scope": self.scope,
            "created": self.created,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
        }


# What a tool policy row holds for what its entry in the file does not set.
POLICY_DEFAULTS: dict[str, Any] = {
    "approvers": 1,
    "rules": [],
    "limits": [],
    "approval_timeout_s": None,
    "on_timeout": "reject",
    "escalate_to": "",
    "before": None,
}


def _upsert(
    model: type[Any],
    *,
    lookup: dict[str, Any],
    values: dict[str, Any],
    provenance: dict[str, Any] | None = None,
) -> str:
    """Create or update one row; return "created", "updated" or "unchanged", judged by ``values``
    (what the row is). An unchanged row is not saved, so its ``loaded_at`` stays put and a repeat
    load changes nothing; the report counts only what the file changed (the same policies from
    another path change no row). ``provenance`` (where the row came from: the file) is written
    with a change of the row only: a row keeps the file that last changed it."""
    obj = model.objects.select_for_update().filter(**lookup).first()
    provenance = provenance or {}
    if obj is None:
        model.objects.create(**lookup, **values, **provenance)
        return "created"
    if all(getattr(obj, name) == value for name, value in values.items()):
        return "unchanged"
    values = {**values, **provenance}
    for name, value in values.items():
        setattr(obj, name, value)
    obj.save()
    return "updated"


@transaction.atomic
def policy_file_load(
    *, document: PolicyDocument, source: str, tenant: Tenant | None, actor: Actor
) -> LoadReport:
    """Replace the policy set of one scope (a tenant, or global) with ``document``.

    Tool policies and compensators of that scope that the file no longer lists are removed: the
    file is the whole truth for its scope.
    """
    scope = tenant.slug if tenant else "global"
    # A person named to escalate to must be able to decide in this scope: checked against the
    # database, before anything is written.
    if problems := escalation_problems(
        default_policy=document.default_policy,
        policies=document.policies,
        tenant=tenant,
        agent_safety=document.layout == AGENT_SAFETY,
    ):
        raise PolicyFileError(source, problems)
    # Two loads of one scope at once would interleave their upserts and deletions.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"policies:{scope}"])
    report = LoadReport(source=source, layout=document.layout, scope=scope)

    outcome = _upsert(
        PolicySet,
        lookup={"tenant": tenant},
        values={
            "default_policy": document.default_policy,
            "unwind": document.unwind,
            "auto_compensate": document.auto_compensate,
            "audit": document.audit,
        },
        provenance={"source": source, "content_hash": document.content_hash},
    )
    getattr(report, outcome).append("policy set")
    # The policy set names the file in force, whatever of it changed (a policy, or nothing). Only
    # when it names another: an UPDATE, even of no row, moves the policy stamp (its trigger).
    stale_provenance = PolicySet.objects.filter(tenant=tenant).exclude(
        source=source, content_hash=document.content_hash
    )
    if stale_provenance.exists():
        stale_provenance.update(source=source, content_hash=document.content_hash)

    for policy in document.policies:
        # A policy the file lists without rules has none, whatever it had before.
        values = {**POLICY_DEFAULTS, **{k: v for k, v in policy.items() if k != "tool"}}
        outcome = _upsert(
            ToolPolicy,
            lookup={"tenant": tenant, "tool": policy["tool"]},
            values=values,
            provenance={"source": source},
        )
        getattr(report, outcome).append(f"policy {policy['tool']}")
    # Deleting only when there is something to delete: an empty DELETE still fires the statement-
    # level trigger that moves the policy stamp, and every process would drop its cached policies.
    stale = ToolPolicy.objects.filter(tenant=tenant).exclude(tool__in=[p["tool"] for p in document.policies])
    stale_tools = list(stale.order_by("tool").values_list("tool", flat=True))
    report.removed.extend(f"policy {tool}" for tool in stale_tools)
    if stale_tools:
        stale.delete()

    _replace_rows(
        Compensator, "compensator", document.compensators, tenant=tenant, source=source, report=report
    )
    _replace_rows(StateReader, "reader", document.readers, tenant=tenant, source=source, report=report)

    # A repeat load writes nothing, not even an audit event: the log records changes.
    if report.changed:
        policy_set = PolicySet.objects.get(tenant=tenant)
        if tenant is not None:
            audit_record(
                tenant=tenant,
                actor=actor,
                kind="policies.loaded",
                subject=policy_set,
                reason=f"loaded {source}",
                data={**report.as_dict(), "content_hash": document.content_hash},
            )
        else:
            # Audit events belong to a tenant's chain; a global load has none, so it is logged.
            logger.info(
                "policies.loaded", actor=actor.label, content_hash=document.content_hash, **report.as_dict()
            )
    report.warnings = policy_load_warnings(tenant=tenant)
    return report


def _replace_rows(
    model: type[Compensator] | type[StateReader],
    label: str,
    rows: dict[str, dict[str, Any]],
    *,
    tenant: Tenant | None,
    source: str,
    report: LoadReport,
) -> None:
    """Make the scope's rows of ``model`` (compensators, readers: one per tool) exactly ``rows``."""
    for tool, spec in rows.items():
        outcome = _upsert(
            model, lookup={"tenant": tenant, "tool": tool}, values=spec, provenance={"source": source}
        )
        getattr(report, outcome).append(f"{label} {tool}")
    stale = model.objects.filter(tenant=tenant).exclude(tool__in=list(rows))
    stale_tools = list(stale.order_by("tool").values_list("tool", flat=True))
    report.removed.extend(f"{label} {tool}" for tool in stale_tools)
    if stale_tools:
        # Only when there is something to delete: an empty DELETE moves the policy stamp too.
        stale.delete()


def policy_load_warnings(*, tenant: Tenant | None) -> list[str]:
    """Every warning about a scope's policies, in one list: compensations whose compensator does
    not reach the upstream that performed their tool, so undoing them waits for a person every time
    (``ledger.upstreams``; each tenant of the global scope); then compensating tools that delete or
    move money and run unattended (``ledger.policies.compensation_risks``); then the before-images:
    image templates no read fills, reads without a reader, templates whose path the tool's recent
    results lack (``ledger.policies.before_checks``)."""
    checked = [tenant] if tenant is not None else list(Tenant.objects.order_by("slug"))
    warnings = [
        f"tenant {each.slug}: {mismatch['message']}"
        for each in checked
        for mismatch in policy_upstream_mismatches(tenant=each)
    ]
    warnings.extend(w.message for w in unattended_destructive_compensations(tenant=tenant))
    warnings.extend(w.message for w in before_warnings(tenant=tenant))
    return warnings


def policies_load_file(*, path: str | Path, tenant: Tenant | None, actor: Actor) -> LoadReport:
    """Read, validate and load a policy file. Raises ``PolicyFileError`` before touching the
    database when the file has any problem."""
    source = str(path)
    document = policy_file_parse(policy_file_read(path), source=source)
    return policy_file_load(document=document, source=source, tenant=tenant, actor=actor)
