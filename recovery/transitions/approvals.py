"""Approvals: a person's go-ahead for a risky action or compensation step, bound to a hash of the
exact arguments shown. Asked for by ``recovery.actions`` (an action whose policy needs a human)
and by the unwind engine (a compensation step); decided by an approver, or expired by the sweeper.

Whoever asked — the agent key that recorded the action, the operator who decided the compensation
— never grants it, whatever the risk (``is_requester``: 403 ``self_approval``). People, not
credentials, approve: a person's logins (every account with their verified e-mail address:
``same_person``) and every key those own (``AgentKey.owner``) are one approver, counted once
towards ``approvers: N`` and never granting what that person asked for, through whichever of
their credentials they asked. An approver key without an owner decides
nothing. What a decision then means for the action or the step is ``recovery.actions``'s
business: this module only asks, decides and expires.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from infra import errors
from infra.conf import saga
from infra.hashing import sha256_hex
from ledger.audit import Actor, audit_record
from ledger.away import away_q, cover_for
from ledger.models import Action, AgentKey, Membership, Run
from ledger.policies.deadlines import ApprovalDeadline, is_role
from ledger.rules import reason_required
from ledger.services.keys import APPROVER_ROLES
from ledger.transitions import compare_and_set
from recovery.deadline_words import escalation_who_words
from recovery.models import Approval, ApprovalGrant, UnwindStep
from recovery.notifications import outbox

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# An approval is decided once: granted or rejected by a person, or expired (its deadline passed,
# or the unwind that asked for it was stopped). Asking again opens a new approval linked to it
# (``approval_ask_again``); an escalation keeps it pending. Every move is under the row's lock.
APPROVAL_TRANSITIONS: dict[str, set[str]] = {
    Approval.Status.PENDING: {Approval.Status.APPROVED, Approval.Status.REJECTED, Approval.Status.EXPIRED},
    Approval.Status.APPROVED: set(),
    Approval.Status.REJECTED: set(),
    Approval.Status.EXPIRED: set(),
}


def approval_expiry_from(now: datetime | None = None) -> datetime:
    """The deadline of an approval whose policy sets none: SAGA_APPROVAL_EXPIRY_H from now."""
    return (now or timezone.now()) + timedelta(hours=saga().approval_expiry_h)


def deadline_window(*, now: datetime, timeout_s: int) -> dict[str, datetime]:
    """A window of ``timeout_s`` from ``now``: its deadline, and when its one reminder is due
    (half way through it)."""
    return {
        "expires_at": now + timedelta(seconds=timeout_s),
        "remind_at": now + timedelta(seconds=timeout_s / 2),
    }


def pending_q(*, now: datetime | None = None, prefix: str = "") -> Q:
    """The one rule for "waiting for a decision": pending and not past its expiry. An approval
    past its deadline is refused when decided (``ApprovalExpired``) and swept to ``expired`` within
    a sweep interval; nothing in between shows it as one a person can still grant. ``prefix``:
    the path to the approval from another model (``"approvals__"``)."""
    return Q(**{f"{prefix}status": Approval.Status.PENDING, f"{prefix}expires_at__gt": now or timezone.now()})


def approval_request(
    *,
    run: Run,
    action: Action,
    tool: str,
    args: Any,
    risk: str,
    actor: Actor,
    requested_by: User | None = None,
    requested_by_key: AgentKey | None = None,
    step: UnwindStep | None = None,
    previous: Approval | None = None,
    reason: str = "",
    approvers: int = 1,
    deadline: ApprovalDeadline | None = None,
) -> Approval:
    """Open an approval for ``action`` (or, with ``step``, for its compensation) bound to ``args``,
    audit it, and tell approvers after commit. ``previous``: the expired or rejected approval this
    one asks again (``approval_ask_again``). ``approvers``: how many distinct people must grant it.
    ``deadline``: the approval deadline of the policy that asks for it (``ApprovalDeadline.of``;
    None: SAGA_APPROVAL_EXPIRY_H, rejected on timeout). The caller holds the transaction."""
    deadline = deadline or ApprovalDeadline.of(None)
    approval = Approval.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        kind=Approval.Kind.COMPENSATION if step is not None else Approval.Kind.ACTION,
        action=action,
        step=step,
        risk=risk,
        tool=tool,
        args=args,
        args_hash=sha256_hex(args),
        requested_by=requested_by,
        requested_by_key=requested_by_key,
        **deadline_window(now=timezone.now(), timeout_s=deadline.timeout_s),
        timeout_s=deadline.timeout_s,
        on_timeout=deadline.on_timeout,
        escalate_to=deadline.escalate_to,
        previous=previous,
        approvers_required=max(1, approvers),
    )
    data: dict[str, Any] = {"tool": tool, "risk": risk}
    data["deadline"] = {
        "expires_at": approval.expires_at.isoformat(),
        "timeout_s": deadline.timeout_s,
        "on_timeout": deadline.on_timeout,
        **({"escalate_to": deadline.escalate_to} if deadline.escalate_to else {}),
    }
    if approval.approvers_required > 1:
        data["approvers_required"] = approval.approvers_required
    if step is not None:
        data["step_id"] = step.pk
    data["args_hash"] = approval.args_hash
    if previous is not None:
        data["previous_id"] = previous.pk
        data["previous_status"] = previous.status
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind="approval.requested" if previous is None else "approval.requested_again",
        subject=approval,
        to_state=approval.status,
        reason=reason,
        data=data,
    )
    approval.tenant = run.tenant
    outbox.notify_approval_requested(approval)
    return approval


# (tenant id, key name) of the keys one person owns: the agents and automations they stand behind.
OwnedKeys = frozenset[tuple[int, str]]


def person_of(actor: Actor) -> int | None:
    """The person behind ``actor`` (a user id): a dashboard user, or the owner of the key acting.
    None for a key without an owner, and for the system."""
    if actor.user is not None:
        return int(actor.user.pk)
    if actor.key is not None:
        return actor.key.owner_id
    return None


def same_person(person: int | None) -> frozenset[int]:
    """Every account that is ``person`` (user ids): the account itself and every account with the
    same e-mail address, case aside. One person with a local account and a
    single sign-on account is one approver: an address is on an SSO account only when the provider
    verified it (``dashboard.sso.backend``), and a local account's is the installation's word, so
    an admin links two accounts explicitly by giving the local one the other's address. Until then
    they are two people; never is an account whose address matches another's a second person.
    Deactivated accounts count too (a grant made before still stands for that person)."""
    if person is None:
        return frozenset()
    users = get_user_model().objects
    email = (users.filter(pk=person).values_list("email", flat=True).first() or "").strip()
    if not email:
        return frozenset({person})
    return frozenset({person, *users.filter(email__iexact=email).values_list("pk", flat=True)})


def keys_owned(person: int | None) -> OwnedKeys:
    """Every key ``person`` owns (through any of their accounts: ``same_person``), revoked ones
    included (a person who asked through a key they have since revoked still asked). Callers
    checking many approvals for one person pass it to ``requester_match``."""
    return _keys_of(same_person(person))


def _keys_of(people: frozenset[int]) -> OwnedKeys:
    if not people:
        return frozenset()
    return frozenset(AgentKey.objects.filter(owner_id__in=people).values_list("tenant_id", "name"))


def requester_match(
    approval: Approval,
    actor: Actor,
    *,
    owned: OwnedKeys | None = None,
    people: frozenset[int] | None = None,
) -> str:
    """How ``actor`` asked for ``approval`` (a sentence's subject), or "" when it did not. Whoever
    asked may never grant it, at any risk:

    - the person who asked: the operator who decided the compensation whose step this is;
    - the key that asked — the agent key that recorded the action, the operator key that decided
      the compensation — or any key with the same name: keys issued under one name are one agent
      or automation (that is how keys rotate), so another key of that name is the same requester;
    - a key named after the run's owner: the agent whose run it is asked for what is approved on
      it, its compensations included (an automatic compensation has no other requester);
    - the person behind any of those (``person_of``: the user, or the owner of the key acting):
      the login who asked, the owner of the key that asked, or the owner of any key of the agent
      or automation that asked — through their login or any key they own.

    An approval asked again (``previous``) has every requester of the approvals before it too:
    asking again never hands the first requester a grant of their own request.

    ``owned``: ``keys_owned(person_of(actor))``, and ``people``: ``same_person(person_of(actor))``,
    read here when not given (callers checking many approvals for one person pass them). Reads
    ``approval.requested_by_key`` and ``approval.run`` (select them with the approval to save the
    queries)."""
    person = person_of(actor)
    if people is None:
        people = same_person(person)
    if owned is None:
        owned = _keys_of(people)
    how = _requester_match_one(approval, actor, person, people, owned)
    seen = {approval.pk}
    earlier = approval
    while not how and earlier.previous_id is not None and earlier.previous_id not in seen:
        seen.add(earlier.previous_id)
        found = (
            Approval.objects.select_related("requested_by_key", "run").filter(pk=earlier.previous_id).first()
        )
        if found is None:
            break
        earlier = found
        if how := _requester_match_one(earlier, actor, person, people, owned):
            how = f"{how} (approval {earlier.pk}, which this one asks again)"
    return how


def _requester_match_one(
    approval: Approval, actor: Actor, person: int | None, people: frozenset[int], owned: OwnedKeys
) -> str:
    requester_key = approval.requested_by_key if approval.requested_by_key_id is not None else None
    if actor.key is not None:
        name = actor.key.name
        if approval.requested_by_key_id == actor.key.pk:
            return "this key asked for it"
        if requester_key is not None and requester_key.name == name:
            return f"a key of the same name ({name}) asked for it"
        if approval.run.owner == name:
            return f"the run belongs to agent {name}, whose keys this one shares a name with"
    if person is None:
        return ""
    # The person, whichever credential they use now and whichever they asked through.
    if actor.user is not None:
        who, owns = "you", "own"
    else:
        owner = actor.key.owner if actor.key is not None else None
        who, owns = f"this key's owner ({owner.get_username() if owner else person})", "owns"
    # ``people``: every account of the person (``same_person``), whichever they asked through.
    if approval.requested_by_id in people:
        return (
            f"{who} asked for it"
            if approval.requested_by_id == person
            else f"{who} (another account of yours) asked for it"
        )
    if requester_key is not None and (
        requester_key.owner_id in people or (approval.tenant_id, requester_key.name) in owned
    ):
        return f"{who} {owns} a key of {requester_key.name}, which asked for it"
    # ``owned`` first: a person who owns no key costs no read of the run.
    if owned and approval.run.owner and (approval.tenant_id, approval.run.owner) in owned:
        return f"the run belongs to agent {approval.run.owner}, and {who} {owns} one of its keys"
    return ""


def is_requester(
    approval: Approval,
    actor: Actor,
    *,
    owned: OwnedKeys | None = None,
    people: frozenset[int] | None = None,
) -> bool:
    return bool(requester_match(approval, actor, owned=owned, people=people))


def approver_identity(actor: Actor) -> tuple[str, str]:
    """(identity, label) of a person deciding: the person (``person_of``) by user id, whether
    they decide through their login or a key they own, so the same person counts once; an
    approver key without an owner (never deciding: ``key_may_decide``) by its name."""
    person = person_of(actor)
    if actor.user is not None:
        return _person_identity(person), actor.user.get_username()
    if actor.key is not None:
        if person is not None and actor.key.owner is not None:
            return _person_identity(
                person
            ), f"{actor.key.owner.get_username()} (approver key {actor.key.name})"
        return f"key:{actor.key.name}", f"approver key {actor.key.name}"
    return f"system:{actor.label}", actor.label


def _person_identity(person: int | None) -> str:
    """``user:<id>`` of a person: the lowest id among their accounts (``same_person``), so each of
    their accounts and keys counts for the same one."""
    return f"user:{min(same_person(person))}" if person is not None else "user:"


def _grant_person(grant: ApprovalGrant) -> str:
    """The person a recorded grant counts for, as their accounts are linked now. A grant made
    through a key before keys had owners (``key:<name>``) counts for the person who owns that key
    now, if anyone does."""
    if grant.approver.startswith("key:") and grant.key is not None and grant.key.owner_id is not None:
        return _person_identity(grant.key.owner_id)
    user_id = grant.approver.removeprefix("user:")
    return (
        _person_identity(int(user_id))
        if grant.approver.startswith("user:") and user_id.isdigit()
        else grant.approver
    )


def key_may_decide(key: AgentKey) -> None:
    """Refuse an approver key that stands for no person who may approve: one without an owner (a
    key issued before owners existed: nobody can say whose grants it would make), or one whose
    owner is no longer an active approver or admin of its tenant (a person who lost the role loses
    it through their keys too). 403, with what to run."""
    if key.owner_id is None:
        raise errors.Forbidden(
            f"Approver key {key.prefix} ({key.name}) belongs to no person, so it decides nothing: "
            "people, not keys, approve. An installation admin gives it its owner with "
            f"`manage.py set_key_owner --prefix {key.prefix} --owner USERNAME` (a member of the tenant "
            "with the approver or admin role), or revokes it and issues a new key with "
            "`create_agent_key --scopes approver --owner USERNAME`.",
            details={"key": key.prefix},
            code="approver_key_unowned",
        )
    if not Membership.objects.filter(
        user_id=key.owner_id, tenant_id=key.tenant_id, role__in=APPROVER_ROLES, user__is_active=True
    ).exists():
        raise errors.Forbidden(
            f"Approver key {key.prefix} ({key.name}) belongs to a person who is no longer an active "
            "approver or admin of this tenant, so it decides nothing.",
            details={"key": key.prefix},
            code="owner_not_approver",
        )


def _grant(current: Approval, *, actor: Actor, reason: str, updates: dict[str, Any]) -> bool:
    """Record ``actor``'s grant of an approval that needs several people; True when it is the
    last one needed (the approval is then decided), False when it stays pending. The same person
    twice → ``AlreadyGranted``. Under the approval's row lock."""
    if updates.get("approved_args_hash", current.args_hash) != current.args_hash:
        # Each person grants exactly what was asked; an edit would leave the others' grants
        # approving args they never saw.
        raise errors.ValidationFailed(
            f"Approval {current.pk} needs {current.approvers_required} people, so its args cannot "
            "be edited: approve them as asked, or reject it and let the agent ask again.",
            details={"approval_id": current.pk, "args": "edit_not_allowed"},
        )
    identity, label = approver_identity(actor)
    granted = {_grant_person(grant) for grant in current.grants.select_related("key")}
    if identity in granted:
        raise errors.AlreadyGranted(
            f"You already granted approval {current.pk}; it needs {current.approvers_required} "
            f"different people ({len(granted)} so far). Another approver must grant it.",
            details={
                "approval_id": current.pk,
                "approvers_required": current.approvers_required,
                "grants": len(granted),
            },
        )
    ApprovalGrant.objects.create(
        approval=current, approver=identity, user=actor.user, key=actor.key, label=label, reason=reason
    )
    count = len(granted) + 1
    if count >= current.approvers_required:
        return True
    audit_record(
        tenant=current.run.tenant,
        run=current.run,
        actor=actor,
        kind="approval.granted",
        subject=current,
        from_state=Approval.Status.PENDING,
        to_state=Approval.Status.PENDING,
        reason=reason,
        data={"grants": count, "approvers_required": current.approvers_required, "approver": label},
    )
    outbox.notify_approval_granted(current, grants=count)
    return False


def approval_decide(
    approval: Approval, *, to: str, actor: Actor, reason: str, updates: dict[str, Any]
) -> Approval:
    """pending → approved | rejected under the approval's row lock, refusing a key without the
    approver scope, an expired approval and a grant by whoever asked for it (any risk; refusing
    one's own request stays allowed: it grants nothing). Returns the decided row; the caller holds
    the transaction and hands the decision on.

    An approval that needs several people (``approvers_required`` N > 1): each grant is an
    ``ApprovalGrant`` of a distinct person (``approver_identity``; the same person again →
    ``AlreadyGranted``, the requester never counts); the first N-1 are audited
    ``approval.granted`` and the row comes back still ``pending`` (check its status); the N-th
    approves. A rejection by any approver rejects it."""
    reason = reason_required(reason)
    if actor.key is not None and AgentKey.Scope.APPROVER not in actor.key.scopes:
        # The API refuses such a key before it gets here; this keeps every other caller honest.
        raise errors.Forbidden(
            "This API key lacks the 'approver' scope.", details={"scope": AgentKey.Scope.APPROVER.value}
        )
    if actor.key is not None:
        # A rejection too: every decision is some person's, on the record.
        key_may_decide(actor.key)
    current = (
        Approval.objects.select_for_update(of=("self",))
        .select_related("requested_by_key", "run")
        .get(pk=approval.pk)
    )
    if current.status != Approval.Status.PENDING:
        raise errors.InvalidTransition(current, to=to, current=current.status)
    if current.expires_at <= timezone.now():
        raise errors.ApprovalExpired(
            f"Approval {approval.pk} expired at {current.expires_at.isoformat()}.",
            details={"approval_id": approval.pk, "current": Approval.Status.EXPIRED},
        )
    if current.escalated_at is not None and not escalation_approver(current, actor):
        raise errors.Forbidden(
            f"Approval {approval.pk} was escalated to {current.escalate_to} when nobody decided it in "
            f"time; only {escalation_who_words(current.escalate_to)} decides it now.",
            details={"approval_id": approval.pk, "escalate_to": current.escalate_to},
            code="approval_escalated",
        )
    if to == Approval.Status.APPROVED and (how := requester_match(current, actor)):
        raise errors.SelfApproval(
            f"You cannot grant approval {approval.pk}: {how}. A second person (or another "
            "approver's key) must approve it; you may still reject it.",
            details={"approval_id": approval.pk, "risk": current.risk},
        )
    if (
        to == Approval.Status.APPROVED
        and current.approvers_required > 1
        and not _grant(current, actor=actor, reason=reason, updates=updates)
    ):
        return current
    fields = {
        "decided_at": timezone.now(),
        "reason": reason,
        "decided_by": actor.user,
        "decided_by_key": actor.key,
        **updates,
    }
    # Under the row lock above (which the N-approver grants need too), read pending there.
    compare_and_set(current, table=APPROVAL_TRANSITIONS, to=to, current=current.status, updates=fields)
    outbox.notify_approval_decided(current)
    return current


def approval_lock_for_asking_again(approval: Approval, *, actor: Actor) -> Approval:
    """The approval, locked and checked for ``approval_ask_again``: only an ``expired`` or
    ``rejected`` one that was not asked again already (409 otherwise), asked again by whom it
    concerns (403 otherwise): for a forward action, the agent that owns the run (a key with the
    ``agent`` scope and the run's owner's name) — it is the one waiting for it; for a compensation
    step, an operator (a person the caller checked, or a key with the ``operator`` scope).
    Approvers decide; they never ask. The caller holds the transaction."""
    current = (
        Approval.objects.select_for_update(of=("self",))
        .select_related("run__tenant", "action", "requested_by_key")
        .get(pk=approval.pk)
    )
    if current.kind == Approval.Kind.ACTION:
        key = actor.key
        if key is None or AgentKey.Scope.AGENT not in key.scopes or current.run.owner != key.name:
            raise errors.Forbidden(
                f"Only the agent that owns run {current.run_id} ({current.run.owner or 'unknown'}) asks "
                f"again for its action's approval, with its own key.",
                details={"approval_id": current.pk, "kind": current.kind},
            )
    elif actor.key is not None and AgentKey.Scope.OPERATOR not in actor.key.scopes:
        raise errors.Forbidden(
            "Only an operator asks again for a compensation step's approval (a key with the "
            "'operator' scope, or a person with the operator role).",
            details={"approval_id": current.pk, "kind": current.kind, "scope": AgentKey.Scope.OPERATOR.value},
        )
    if current.status not in (Approval.Status.EXPIRED, Approval.Status.REJECTED):
        state = (
            "is still pending: it can be decided, not asked again"
            if current.status == (Approval.Status.PENDING)
            else "was approved: there is nothing to ask again"
        )
        raise errors.InvalidTransition(
            current,
            to=Approval.Status.PENDING,
            current=current.status,
            message=f"Approval {current.pk} {state}.",
        )
    newer = Approval.objects.filter(previous=current).values_list("pk", flat=True).first()
    if newer is not None:
        raise errors.Conflict(
            f"Approval {current.pk} was already asked again as {newer}.",
            details={"approval_id": current.pk, "asked_again_id": newer, "current": current.status},
            code="already_asked_again",
        )
    return current


def approval_ask_again(
    *, previous: Approval, actor: Actor, reason: str, step: UnwindStep | None = None
) -> Approval:
    """A new pending approval for the same tool and args as ``previous`` (locked and checked by
    ``approval_lock_for_asking_again``), linked to it, with a fresh expiry; a compensation step's
    approval moves to the new one (a step has one approval at a time; the old one stays linked
    through ``previous``). The caller moves the action or step back to awaiting approval."""
    if step is not None:
        # Not a state change: the step's one-to-one approval link moves to the new approval.
        Approval.objects.filter(pk=previous.pk).update(step=None)
    return approval_request(
        run=previous.run,
        action=previous.action,
        step=step,
        tool=previous.tool,
        args=previous.args,
        risk=previous.risk,
        actor=actor,
        requested_by=actor.user,
        requested_by_key=actor.key,
        previous=previous,
        reason=reason,
        approvers=previous.approvers_required,
        # The same deadline as the first time (its policy's), from now; not escalated yet.
        deadline=ApprovalDeadline(
            timeout_s=previous.timeout_s or ApprovalDeadline.of(None).timeout_s,
            on_timeout=previous.on_timeout,
            escalate_to=previous.escalate_to,
        ),
    )


# The reason an approval nobody decided in time shows (API.md: ``{status: "expired", reason:
# "timed_out"}``), which the clients turn into their deadline-passed rejection.
TIMED_OUT = "timed_out"


def approval_expire(*, approval_id: str, now: datetime) -> Approval | None:
    """pending → expired (reason ``timed_out``) for one approval past its deadline that does not
    escalate now (None: decided meanwhile, escalating instead, or another sweeper has it). The
    caller holds the transaction and hands the expiry on."""
    approval = (
        Approval.objects.select_for_update(skip_locked=True)
        .filter(pk=approval_id, status=Approval.Status.PENDING, expires_at__lte=now)
        .exclude(escalates_now_q())
        .select_related("run__tenant", "action")
        .first()
    )
    if approval is None:
        return None
    # Locked above (skip_locked), and read pending there.
    compare_and_set(
        approval,
        table=APPROVAL_TRANSITIONS,
        to=Approval.Status.EXPIRED,
        current=Approval.Status.PENDING,
        updates={"decided_at": now, "reason": TIMED_OUT},
    )
    return approval


def approval_withdraw(*, approval: Approval, actor: Actor, reason: str) -> Approval | None:
    """pending → expired for an approval nobody needs any more (the unwind that asked for it was
    stopped): it leaves the inbox, and a late decision on it is refused. Audited as withdrawn, with
    who and why. None when it was decided meanwhile. The caller holds the transaction."""
    current = (
        Approval.objects.select_for_update(of=("self",)).select_related("run__tenant").get(pk=approval.pk)
    )
    if current.status != Approval.Status.PENDING:
        return None
    # Locked above, and read pending there.
    compare_and_set(
        current,
        table=APPROVAL_TRANSITIONS,
        to=Approval.Status.EXPIRED,
        current=Approval.Status.PENDING,
        updates={"decided_at": timezone.now(), "reason": f"withdrawn: {reason}"},
    )
    audit_record(
        tenant=current.run.tenant,
        run=current.run,
        actor=actor,
        kind="approval.withdrawn",
        subject=current,
        from_state=Approval.Status.PENDING,
        to_state=current.status,
        reason=reason,
        data={"step_id": current.step_id, "tool": current.tool},
    )
    outbox.notify_approval_decided(current)
    return current


def escalates_now_q() -> Q:
    """A pending approval whose timeout escalates it (once) rather than expiring it."""
    return Q(on_timeout="escalate", escalated_at__isnull=True) & ~Q(escalate_to="")


def _escalation_members_q(approval: Approval) -> Q:
    """The memberships of the people an approval was escalated to: active members of its tenant
    with the role it names (``approver``: approvers and admins), or the approver it names."""
    escalate_to = approval.escalate_to
    if is_role(escalate_to):
        roles = APPROVER_ROLES if escalate_to == Membership.Role.APPROVER else (escalate_to,)
        return Q(tenant_id=approval.tenant_id, role__in=roles, user__is_active=True)
    return Q(
        tenant_id=approval.tenant_id,
        role__in=APPROVER_ROLES,
        user__is_active=True,
        user__username=escalate_to,
    )


def escalation_approver(approval: Approval, actor: Actor) -> bool:
    """Whether ``actor`` (a person: a login, or an approver key's owner) is one the approval was
    escalated to."""
    person = person_of(actor)
    if person is None:
        return False
    members = _escalation_members_q(approval)
    if approval.delegated_from:
        # Handed over while they were away (``recovery.transitions.delegation``): the person it was
        # escalated to may still decide it, as well as their delegate.
        members |= Q(
            tenant_id=approval.tenant_id,
            role__in=APPROVER_ROLES,
            user__is_active=True,
            user__username=approval.delegated_from,
        )
    return Membership.objects.filter(members, user_id=person).exists()


# At most this many people are written to directly about one escalation (a role of a large
# tenant is better reached through its channels).
ESCALATION_EMAILS_MAX = 50


def escalation_emails(approval: Approval, *, now: datetime | None = None) -> list[str]:
    """The e-mail addresses of the people an approval was escalated to (those who have one). One
    who is away (``ledger.away``) is written to through whoever covers for them, when that person
    may decide it too (holds the role it went to, or was handed it); when nobody does, it is still
    theirs, and so is the e-mail."""
    now = now or timezone.now()
    members = Membership.objects.filter(_escalation_members_q(approval))
    addresses = set(
        members.exclude(away_q(now=now))
        .exclude(user__email="")
        .order_by("user__email")
        .values_list("user__email", flat=True)
        .distinct()[:ESCALATION_EMAILS_MAX]
    )
    away = members.filter(away_q(now=now)).select_related("user").order_by("user__username")
    for membership in away[:ESCALATION_EMAILS_MAX]:
        cover = cover_for(tenant_id=approval.tenant_id, username=membership.user.get_username(), now=now)
        if cover is not None and members.filter(user=cover.delegate).exists():
            addresses.add(cover.delegate.email)
        else:
            addresses.add(membership.user.email)
    return sorted(address for address in addresses if address)[:ESCALATION_EMAILS_MAX]
