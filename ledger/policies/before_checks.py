"""What a policy file's author should know about its before-images (API.md "Before-images and
verified undo"), as warnings ``load_policies`` prints and the dashboard's policies page shows.

- ``before_missing``: a policy's ``compensation_args`` use ``$before``/``$after`` but it has no
  ``before``, so no read takes the images: only an agent that sends ``before_snapshot`` /
  ``after_snapshot`` itself fills them (a call through ``saga-mcp`` never does). A warning, not an
  error: such an agent exists, so the template is not unfillable for sure.
- ``reader_missing``: a ``before`` whose read tool has no reader in the scope (the file's
  ``readers``): the worker can neither check for drift before undoing nor verify the undo.
- ``template_unseen``: where it is knowable, a ``$result.<path>`` / ``$before.<path>`` /
  ``$after.<path>`` template whose path is absent from what the tool actually returned: the
  ledger's newest ``RECENT_RESULTS`` succeeded actions of that tool, one bounded query per policy
  that has such templates (the paths are tested in SQL; no result is read into Python). Only for
  policies that name one exact tool (the ledger is indexed by tool; a glob's tools are not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q
from django.db.models.expressions import RawSQL

from ledger.models import Action, ActionClass, StateReader, Tenant, ToolPolicy
from ledger.policies.compensation_args import template_uses
from ledger.policies.resolve import policies_in_force, policy_settings_for
from ledger.tool_names import is_glob

# How many of a tool's newest succeeded actions the template check reads (their paths only).
RECENT_RESULTS = 20

# Every status of an action that succeeded (its result and images are recorded).
_SUCCEEDED = (
    Action.Status.SUCCEEDED,
    Action.Status.COMPENSATING,
    Action.Status.COMPENSATED,
    Action.Status.COMPENSATION_FAILED,
)
# The image roots and the column each is recorded in.
_COLUMNS = {"result": "result", "before": "before_snapshot", "after": "after_snapshot"}
_WHAT = {"result": "results", "before": "before-images", "after": "after-images"}


@dataclass(frozen=True)
class BeforeWarning:
    code: str  # "before_missing" | "reader_missing" | "template_unseen"
    policy: str  # the policy's tool pattern ("*default*": the default policy)
    message: str


def readers_in_force(*, tenant: Tenant | None) -> list[StateReader]:
    """The readers that serve a scope, one per read tool: the tenant's own rows, and the global
    ones for tools it has none of (the global scope: its own rows)."""
    scope = Q(tenant__isnull=True) if tenant is None else Q(tenant__isnull=True) | Q(tenant=tenant)
    in_force: dict[str, StateReader] = {}
    for row in StateReader.objects.filter(scope).order_by("tool"):
        if row.tool not in in_force or row.tenant_id:
            in_force[row.tool] = row
    return list(in_force.values())


def before_warnings(*, tenant: Tenant | None) -> list[BeforeWarning]:
    """Every before-image warning of a scope (a tenant with the global policies it inherits, or the
    global scope alone), policy by policy."""
    policies = (
        policies_in_force(tenant=tenant)
        if tenant is not None
        else list(ToolPolicy.objects.filter(tenant__isnull=True).order_by("tool"))
    )
    readers = {row.tool for row in readers_in_force(tenant=tenant)}
    warnings: list[BeforeWarning] = []
    default = policy_settings_for(tenant).default_policy
    if default.get("compensation_args") is not None:
        warnings.extend(_images_without_before("*default*", default["compensation_args"], "default_policy"))
    for policy in policies:
        if policy.action_class == ActionClass.READ_ONLY:
            continue
        if policy.before is None:
            warnings.extend(_images_without_before(policy.tool, policy.compensation_args))
        elif (read := str(policy.before.get("tool", ""))) not in readers:
            warnings.append(
                BeforeWarning(
                    "reader_missing",
                    policy.tool,
                    f"policy {policy.tool}: its before read {read} has no reader in this scope's "
                    f'"readers": the worker cannot check {read} for drift before undoing a call, nor '
                    "read it back to verify the undo (its steps say verified: false). Register a "
                    f'reader for {read} (mcp, webhook or python) under "readers".',
                )
            )
        warnings.extend(_templates_unseen(policy, tenant=tenant))
    return warnings


def _images_without_before(pattern: str, template: Any, where: str = "") -> list[BeforeWarning]:
    uses = sorted(
        (key, f"${root}" + (f".{path}" if path else ""))
        for key, root, path in template_uses(template)
        if root in ("before", "after")
    )
    if not uses:
        return []
    named = ", ".join(f"{key} ({written})" for key, written in uses)
    subject = where or f"policy {pattern}"
    return [
        BeforeWarning(
            "before_missing",
            pattern,
            f"{subject}: {named} use a before- or after-image, but the policy has no "
            '"before" read: no image is taken for its calls (a call through saga-mcp never has '
            "one), so undoing one fails unless the agent sent before_snapshot/after_snapshot "
            'itself. Add a "before" read to the policy.',
        )
    ]


def _templates_unseen(policy: ToolPolicy, *, tenant: Tenant | None) -> list[BeforeWarning]:
    """The policy's image templates whose path the tool's newest succeeded actions lack."""
    if is_glob(policy.tool) or policy.compensation_args is None:
        return []
    checks: dict[tuple[str, str], list[str]] = {}
    for key, root, path in sorted(template_uses(policy.compensation_args)):
        if root in _COLUMNS and path:
            checks.setdefault((root, path), []).append(key)
    if not checks:
        return []
    rows = _recent_paths(policy.tool, list(checks), tenant=tenant)
    warnings = []
    for index, ((root, path), keys) in enumerate(checks.items()):
        # A result: every succeeded action has one to fill from (none counts as lacking the path);
        # an image: only those recorded with one (a missing image is warned about on its record).
        seen = [row for row in rows if root == "result" or row[f"has_{root}"]]
        lacking = sum(1 for row in seen if not row[f"at_{index}"])
        if seen and lacking:
            warnings.append(_unseen_warning(policy.tool, keys, root, path, seen=len(seen), lacking=lacking))
    return warnings


def _recent_paths(
    tool: str, checks: list[tuple[str, str]], *, tenant: Tenant | None
) -> list[dict[str, bool]]:
    """For the tool's newest ``RECENT_RESULTS`` succeeded actions: whether each has each image
    (``has_<root>``) and each checked path (``at_<index>``), tested in SQL: one query."""
    table = connection.ops.quote_name(Action._meta.db_table)
    annotations: dict[str, RawSQL] = {}
    for root in sorted({root for root, _path in checks}):
        column = connection.ops.quote_name(_COLUMNS[root])
        # Quoted identifiers of this model only; the paths are parameters.
        annotations[f"has_{root}"] = RawSQL(f"{table}.{column} IS NOT NULL", [])  # noqa: S611
    for index, (root, path) in enumerate(checks):
        column = connection.ops.quote_name(_COLUMNS[root])
        annotations[f"at_{index}"] = RawSQL(  # noqa: S611
            f"({table}.{column} #> %s::text[]) IS NOT NULL", [path.split(".")]
        )
    names = list(annotations)

    def newest(tenant_id: int) -> Any:
        # One tenant's newest: the (tenant, tool, -created_at) index answers it with a short scan.
        return (
            Action.objects.filter(tenant_id=tenant_id, tool=tool, status__in=_SUCCEEDED)
            .order_by("-created_at")
            .annotate(**annotations)
            .values_list(*names, "created_at")[:RECENT_RESULTS]
        )

    if tenant is not None:
        found = list(newest(tenant.pk))
    else:
        # The global scope: each tenant's newest through the index, in one UNION, then the newest
        # of those (ordering the whole table by created_at for one tool would scan it).
        parts = [
            newest(tenant_id) for tenant_id in Tenant.objects.order_by("pk").values_list("pk", flat=True)
        ]
        if not parts:
            return []
        found = list(parts[0].union(*parts[1:], all=True)) if len(parts) > 1 else list(parts[0])
        found = sorted(found, key=lambda row: row[-1], reverse=True)[:RECENT_RESULTS]
    return [dict(zip(names, row[:-1], strict=True)) for row in found]


def _unseen_warning(
    tool: str, keys: list[str], root: str, path: str, *, seen: int, lacking: int
) -> BeforeWarning:
    what = _WHAT[root]
    if seen == 1:
        count, verb = f"the last {what[:-1]}", "has"
    elif lacking == seen:
        count, verb = f"the last {seen} {what}", "have"
    else:
        count, verb = f"{lacking} of the last {seen} {what}", "has" if lacking == 1 else "have"
    shape = (
        " (a result is the tool's structured content, or its one text block when that is a JSON object)"
        if root == "result"
        else ""
    )
    return BeforeWarning(
        "template_unseen",
        tool,
        f"policy {tool}: {', '.join(keys)} (${root}.{path}): {count} of {tool} {verb} no '{path}', so "
        f"undoing such a call fails naming it{shape}.",
    )
