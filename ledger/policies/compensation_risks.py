"""The residual risk of compensations, as a warning a policy file's author sees.

The ledger is what agents report. A compensation built from an agent's ``$args`` can be aimed: an
agent records ``hr.create_user(email=victim)``, reports success, fails, and hopes the unwind runs
``hr.delete_user(victim)`` with no one looking. Each compensation step is governed by the
*compensating* tool's policy, so the lever is there: a compensating tool that deletes or moves money
should not be ``approval: auto``. This module names the ones that are; ``manage.py load_policies``
prints them and the dashboard's policies page shows them (docs/SECURITY.md, Residual risk).

The compensating tool's own policy is read first, and a name only where the policy leaves it open:

- **by class**: its policy says ``external_irreversible`` (what it does cannot be undone in
  turn): flagged. Its policy says it can be undone (``external_reversible``, ``draft_only``,
  ``read_only``): the author judged it, and it is not flagged whatever its name (a licence
  cancelled is provisioned again: ``workspace.cancel_license``).
- **by name**, otherwise (``internal_update``, or the default policy): a word of a name it goes by
  (split at ``.``, ``_``, ``-``, ``/``, ``:`` and camelCase) is one of ``DESTRUCTIVE_VERBS``
  (``hr.delete_user``, ``payments.refund``, ``billing.createTransfer``); a whole word, so
  ``payments.restore`` is not a payment. The names it goes by are its own and, for a registered
  compensator, what it calls: the MCP tool, the Python callable, the webhook's last path segment
  (``inventory.undo_add`` calling the MCP tool ``remove_item``).

The compensating tools of a scope are every tool a policy in force names as its
``compensation_tool`` and every compensator registered in the database (which an agent may name
for its own actions). Python compensators registered in code are not seen here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.db.models import Q

from ledger.models import ActionClass, ApprovalMode, Compensator, Tenant, ToolPolicy
from ledger.policies.resolve import policy_pick, policy_settings_for

DESTRUCTIVE_VERBS = frozenset(
    {
        "delete",
        "remove",
        "destroy",
        "purge",
        "erase",
        "wipe",
        "drop",
        "terminate",
        "cancel",
        "void",
        "refund",
        "transfer",
        "pay",
        "payout",
        "charge",
        "withdraw",
        "disburse",
    }
)

_WORD_BREAK = re.compile(r"[._\-/:\s]+|(?<=[a-z0-9])(?=[A-Z])")


def destructive_words(tool: str) -> list[str]:
    """The words of ``tool``'s name that say it deletes or moves money (empty: none)."""
    words = [word.lower() for word in _WORD_BREAK.split(tool) if word]
    return [word for word in dict.fromkeys(words) if word in DESTRUCTIVE_VERBS]


# The classes whose policy says what the tool does can itself be undone.
UNDOABLE_CLASSES = frozenset({ActionClass.READ_ONLY, ActionClass.DRAFT_ONLY, ActionClass.EXTERNAL_REVERSIBLE})


def callee_name(row: Compensator) -> str:
    """What a registered compensator calls, by name: the MCP tool, the Python callable, the
    webhook's last path segment ("" when there is none)."""
    if row.kind == Compensator.Kind.MCP:
        return row.mcp_tool
    if row.kind == Compensator.Kind.PYTHON:
        return row.python_path.rsplit(".", 1)[-1]
    return urlsplit(row.url).path.rstrip("/").rsplit("/", 1)[-1]


def _by_name(tool: str, callees: list[str]) -> str:
    """Why a name says it deletes or moves money ("" when none does)."""
    if words := destructive_words(tool):
        return f"deletes or moves money (its name says {', '.join(words)})"
    for callee in callees:
        if words := destructive_words(callee):
            return f"deletes or moves money (it calls {callee}, whose name says {', '.join(words)})"
    return ""


@dataclass(frozen=True)
class CompensationWarning:
    """A compensating tool that deletes or moves money and runs without an approval of its own."""

    tool: str
    policy: str  # the pattern of the policy that governs it, or "*default*"
    why: str  # what says it deletes or moves money
    named_by: tuple[str, ...]  # the forward policies naming it; "a registered compensator"

    @property
    def message(self) -> str:
        by = ", ".join(self.named_by)
        return (
            f"compensating tool {self.tool} ({by}) {self.why}, and its policy ({self.policy}) "
            "says approval: auto, so an unwind runs it without anyone approving the step. Its args "
            "come from what an agent reported: an agent could aim it (record a create for someone "
            "else's account, report success, fail). Set approval: manual on its policy."
        )


def unattended_destructive_compensations(*, tenant: Tenant | None) -> list[CompensationWarning]:
    """The compensating tools of a scope (a tenant, with the global policies it inherits; or the
    global scope alone) that delete or move money and are governed by an ``approval: auto``
    policy, sorted by tool."""
    scope = Q(tenant__isnull=True) if tenant is None else Q(tenant__isnull=True) | Q(tenant=tenant)
    policies = list(ToolPolicy.objects.filter(scope))
    named_by: dict[str, list[str]] = {}
    for policy in policies:
        if policy.compensation_tool:
            named_by.setdefault(policy.compensation_tool, []).append(f"named by {policy.tool}")
    callees: dict[str, list[str]] = {}
    for row in Compensator.objects.filter(scope):
        named_by.setdefault(row.tool, []).append("a registered compensator")
        if callee := callee_name(row):
            callees.setdefault(row.tool, []).append(callee)
    default = policy_settings_for(tenant).default_policy
    warnings = []
    for tool, by in sorted(named_by.items()):
        governing = policy_pick(policies, tool)
        if governing is not None:
            pattern, approval, action_class = governing.tool, governing.approval, governing.action_class
        else:
            pattern = "*default*"
            approval = str(default.get("approval", ApprovalMode.MANUAL))
            action_class = str(default.get("action_class", ActionClass.EXTERNAL_IRREVERSIBLE))
        if approval != ApprovalMode.AUTO or action_class in UNDOABLE_CLASSES:
            continue
        why = _by_name(tool, callees.get(tool, []))
        if not why and action_class == ActionClass.EXTERNAL_IRREVERSIBLE:
            why = "cannot be undone in turn (its policy classes it external_irreversible)"
        if not why:
            continue
        warnings.append(
            CompensationWarning(tool=tool, policy=pattern, why=why, named_by=tuple(dict.fromkeys(by)))
        )
    return warnings
