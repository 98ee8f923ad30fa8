"""The compensation rule: what undoes a newly recorded action. The agent's compensation is a
request; the tool's policy decides (the compensating tool it names, the strategy, the templates
its args are filled from when an unwind is planned), and an agent-named tool must be a registered
compensator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra import errors
from ledger.models import ActionClass, CompensationStrategy
from ledger.policies.compensation_args import TemplateUnfillable, compensation_args_fill
from ledger.policies.resolve import ResolvedPolicy, mandated_compensation_tool

# "Is this tool a registered compensator for the tenant?": the registry has rows here (the policy
# file's compensators) and Python compensators registered in code in the recovery layer, which
# hands the whole question down as this predicate.
# Called with the tool and the policy stamp the record relies on: a registry the caller keeps per
# process may answer from its copy read under that stamp (the database checks the stamp).
CompensatorCheck = Callable[[str, int | None], bool]


@dataclass(frozen=True)
class Compensation:
    """What undoes a newly recorded action (``compensation_for``)."""

    strategy: str
    tool: str
    args: Any  # literal args, or the template they are filled from
    template: Any  # the template the step's args are filled from at plan time; None: literal
    warnings: list[dict[str, Any]]


def _agent_strategy(policy: ResolvedPolicy) -> str:
    """A compensation the agent chose: a correction for an irreversible tool, else a custom undo."""
    if policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE:
        return CompensationStrategy.CORRECTION
    return CompensationStrategy.CUSTOM


def compensation_for(
    policy: ResolvedPolicy,
    *,
    tool: str,
    target_type: str,
    target_id: str,
    args: Any,
    compensation: dict[str, Any] | None,
    is_compensator: CompensatorCheck | None,
    stamp: int | None = None,
) -> Compensation:
    """What undoes a newly recorded action. The agent's compensation is a request: where the
    policy names the compensating tool, any other is refused (``CompensationNotAllowed``); a tool
    it names on its own must be a registered compensator (``UnknownCompensator``, when the caller
    can tell). The policy's templates, not the agent's args, build a policy-named tool's args."""
    mandated = mandated_compensation_tool(policy, tool=tool)
    named = str(compensation["tool"]) if compensation else ""
    if named and mandated and named != mandated:
        raise errors.CompensationNotAllowed(
            f"The policy for {tool} ({policy.pattern}) names {mandated} as its compensation; "
            f"{named} is not allowed.",
            details={"tool": named, "allowed": mandated, "policy": policy.pattern},
        )
    if named and not mandated and is_compensator is not None and not is_compensator(named, stamp):
        raise errors.UnknownCompensator(
            f"{named} is not a registered compensator; an action can only be undone by a tool "
            "registered in the policy file (or in code).",
            details={"tool": named},
        )
    if policy.action_class == ActionClass.READ_ONLY:
        return Compensation(CompensationStrategy.NONE, "", None, None, [])
    if policy.compensation == CompensationStrategy.SNAPSHOT:
        return Compensation(CompensationStrategy.SNAPSHOT, mandated, None, None, [])
    warnings: list[dict[str, Any]] = []
    if named and not (mandated and policy.compensation_args is not None):
        # The agent's own args: for a tool it chose (a registered compensator, which its own
        # policy governs when the step runs), or for the policy's tool when the policy does not
        # say how to build them.
        return Compensation(
            policy.compensation if mandated else _agent_strategy(policy),
            named,
            (compensation or {}).get("args", {}),
            None,
            [],
        )
    if not mandated:
        return Compensation(CompensationStrategy.NONE, "", None, None, [])
    # The policy's compensation: its templates, or the forward args as they are ("$args"), filled
    # when the unwind is planned, from the args as they are then (an approver's edit included).
    template = policy.compensation_args if policy.compensation_args is not None else "$args"
    filled: Any = None
    try:
        filled = compensation_args_fill(template, args=args, target_id=target_id, target_type=target_type)
    except TemplateUnfillable as exc:
        warnings.append(
            {
                "code": "compensation_args_unfillable",
                "message": f"The compensation args of {mandated} cannot be filled from this action "
                f"({exc}); undoing it will fail unless an approver's edit supplies it.",
                "path": exc.path,
            }
        )
    sent = (compensation or {}).get("args")
    if named and sent and sent != filled:
        warnings.append(
            {
                "code": "compensation_args_from_policy",
                "message": f"The policy builds {mandated}'s args from this action; the args sent with "
                "the compensation are not used.",
            }
        )
    return Compensation(policy.compensation, mandated, template, template, warnings)
