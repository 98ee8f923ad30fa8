"""What a recording writes: the payload hash that makes two recordings "the same action", the
new action row and its audit events (recorded, and started when asked), and the JSON
``saga_action_record`` takes (``ledger.services.writes``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from django.utils import timezone

from infra.hashing import canonical_json_bytes
from infra.ids import new_action_id
from ledger.audit import Actor, event_template
from ledger.models import Action, ActionClass, CompensationStrategy, Run
from ledger.policies.resolve import ResolvedPolicy
from ledger.policies.rules import RulesApplied
from ledger.services.actions.compensation import Compensation
from ledger.services.limits import LimitExceeded
from ledger.services.runs import run_closed_states


def action_payload_hash(
    *,
    tool: str,
    target_type: str,
    target_id: str,
    args: Any,
    compensation: dict[str, Any] | None,
    via: dict[str, str] | None = None,
) -> str:
    """What makes two recordings "the same action". Intent and snapshots are left out on purpose:
    an agent retrying after a timeout re-reads its target and rephrases its reasoning, and that
    must still count as the same call. The upstream that performs it (``via``) is in: the same
    call to another server is another action. Hashed only when sent, so the hash of an action
    recorded without it is what it always was."""
    return canonical_payload_hash(
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args_json=canonical_json_bytes(args),
        compensation=compensation,
        via=via,
    )


def canonical_payload_hash(
    *,
    tool: str,
    target_type: str,
    target_id: str,
    args_json: bytes,
    compensation: dict[str, Any] | None,
    via: dict[str, str] | None = None,
) -> str:
    """``sha256_hex`` of the payload's canonical JSON, the args given as their canonical bytes:
    the document is spelled around them (its keys in sorted order), so they are encoded once and
    the same bytes go to the database (``record_payload``)."""
    document = b"".join(
        (
            b'{"args":',
            args_json,
            b',"compensation":',
            canonical_json_bytes(compensation),
            b',"target_id":',
            canonical_json_bytes(target_id),
            b',"target_type":',
            canonical_json_bytes(target_type),
            b',"tool":',
            canonical_json_bytes(tool),
            # ``via`` sorts last; left out when not sent (the hash of an action without it is
            # what it always was).
            *((b',"via":', canonical_json_bytes(via)) if via is not None else ()),
            b"}",
        )
    )
    return hashlib.sha256(document).hexdigest()


@dataclass(frozen=True)
class ActionCall:
    """One recording request, as the agent sent it."""

    run: Run
    actor: Actor
    tool: str
    idempotency_key: str
    target_type: str
    target_id: str
    args: Any
    args_json: bytes  # ``args`` as canonical JSON (infra.hashing.canonical_json_bytes)
    intent: dict[str, Any]
    before_snapshot: Any
    compensation: dict[str, Any] | None
    via: dict[str, str] | None
    payload_hash: str
    start: bool
    lock_timeout_ms: int


def new_action_row(
    call: ActionCall,
    *,
    policy: ResolvedPolicy,
    rule: RulesApplied | None,
    exceeded: LimitExceeded | None,
    undo: Compensation,
    owner: str,
) -> tuple[Action, list[dict[str, Any]]]:
    """The action row to insert (its ``seq`` is the database's) and its audit events: recorded,
    and started when ``call.start`` and it needs no approval."""
    warnings = list(undo.warnings)
    if policy.scope == "default":
        # A mistyped tool name lands here too, and then waits for an approval nobody expected.
        warnings.append(
            {
                "code": "default_policy",
                "message": f"No policy names {call.tool}; the default applied (risk {policy.risk}, "
                f"approval {policy.approval}). Check the tool's name, or add a policy for it.",
            }
        )
    if (
        undo.strategy == CompensationStrategy.NONE
        and policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE
    ):
        warnings.append(
            {
                "code": "irreversible_without_correction",
                "message": f"{call.tool} is irreversible and has no correction registered.",
            }
        )
    if policy.before is not None and call.before_snapshot is None:
        # The gateway and the clients send the image with the record; a record without it (an agent
        # on the REST API that does not read, a reader that was not registered) is undone blind.
        read = str(policy.before.get("tool", ""))
        warnings.append(
            {
                "code": "before_image_missing",
                "read": read,
                "message": f"The policy for {call.tool} takes a before-image (read by {read}), but "
                "this record came without one (before_snapshot): its undo cannot restore the value "
                "exactly, nor verify that it did.",
            }
        )
    now = timezone.now()
    starts = call.start and not policy.requires_approval
    action = Action(
        id=new_action_id(),
        tenant_id=call.run.tenant_id,
        run=call.run,
        tool=call.tool,
        target_type=call.target_type,
        target_id=call.target_id,
        args=call.args,
        idempotency_key=call.idempotency_key,
        owner=owner,
        payload_hash=call.payload_hash,
        intent=call.intent,
        before_snapshot=call.before_snapshot,
        risk=policy.risk,
        action_class=policy.action_class,
        approval_mode=policy.approval,
        requires_approval=policy.requires_approval,
        # As it applied, frozen: ``compensation_args`` is the template this action's compensation
        # args are filled from when an unwind is planned (None: its compensation args are literal).
        # ``risk``/``approval``/``approvers`` as they applied to this call; ``rule``: the rule that
        # set them (null: none applied; ``also``: further rules that applied because a value's kind
        # left them undecided); ``limit``: the limit it would exceed (null: none).
        policy={
            **policy.as_dict(),
            "compensation_args": undo.template,
            "rule": rule.stamp() if rule is not None else None,
            "limit": exceeded.stamp() if exceeded is not None else None,
        },
        compensation_strategy=undo.strategy,
        compensation_tool=undo.tool,
        compensation_args=undo.args,
        via=call.via,
        warnings=warnings,
        status=Action.Status.RUNNING if starts else Action.Status.PLANNED,
        attempts=1 if starts else 0,
        started_at=now if starts else None,
        created_at=now,
        updated_at=now,
    )
    action._state.adding = False

    def event(**fields: Any) -> dict[str, Any]:
        return event_template(
            tenant_id=call.run.tenant_id,
            run_id=call.run.pk,
            actor=call.actor,
            subject_type="action",
            subject_id=action.pk,
            created_at=now,
            **fields,
        )

    events = [
        event(
            kind="action.recorded",
            to_state=Action.Status.PLANNED,
            data={
                "tool": call.tool,
                "target_id": call.target_id,
                "risk": policy.risk,
                "idempotency_key": call.idempotency_key,
                **({"via": call.via} if call.via is not None else {}),
                **({"rule": rule.stamp()} if rule is not None else {}),
                **({"limit": exceeded.stamp()} if exceeded is not None else {}),
            },
        )
    ]
    if starts:
        events.append(
            event(
                kind="action.started",
                from_state=Action.Status.PLANNED,
                to_state=Action.Status.RUNNING,
                data={"attempt": 1},
            )
        )
    return action, events


_ROW_FIELDS = [
    field for field in Action._meta.concrete_fields if field.attname not in ("seq", "run_id", "tenant_id")
]


def record_payload(call: ActionCall, action: Action, events: list[dict[str, Any]]) -> dict[str, Any]:
    row = {}
    for column in _ROW_FIELDS:
        value = getattr(action, column.attname)
        row[column.column] = value.isoformat() if isinstance(value, datetime) else value
    # The args as already encoded for the payload hash, written into the call's JSON verbatim.
    row[Action._meta.get_field("args").column] = orjson.Fragment(call.args_json)
    return {
        "tenant_id": call.run.tenant_id,
        "run_id": call.run.pk,
        "run_owner": call.run.owner or "",
        "lock_timeout_ms": int(call.lock_timeout_ms),
        "closed": list(run_closed_states()),
        "action": row,
        "events": events,
    }
