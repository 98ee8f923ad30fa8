"""Raising a notification: ``notify`` writes one ``Notification`` row per channel that takes the
event (the tenant's channels, by their choice of events and minimum risk, and the environment's)
in the same transaction as the event, and hands each row to a worker after commit
(``recovery.notifications.delivery`` sends it). The ``notify_*`` functions say what each event
tells people: its summary, its link and its lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import orjson
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from infra.conf import saga
from infra.hashing import canonical_json_bytes
from ledger.models import Risk, Run, Tenant
from recovery import queueing
from recovery.deadline_words import clock, deadline_line, escalation_who_words
from recovery.models import (
    CHANNEL_EVENTS,
    AgentCommand,
    Approval,
    Notification,
    NotificationChannel,
    NotificationEvent,
    RecoveryItem,
    Unwind,
    UnwindStep,
)
from recovery.notifications import pagerduty

Event = NotificationEvent
Kind = NotificationChannel.Kind


@dataclass(frozen=True)
class EnvironmentChannel:
    """One of the installation's own channels, as its outbox rows name it (``channel_name``, with
    ``channel`` None): ``SAGA_NOTIFY_EMAILS`` (all its addresses, one row) and each URL of
    ``SAGA_NOTIFY_WEBHOOKS``."""

    name: str
    kind: str
    env_target: str


def environment_channels() -> list[EnvironmentChannel]:
    config = saga()
    found = [EnvironmentChannel("SAGA_NOTIFY_EMAILS", Kind.EMAIL, "email")] if config.notify_emails else []
    for url in config.notify_webhooks:
        found.append(EnvironmentChannel(f"SAGA_NOTIFY_WEBHOOKS {httpx.URL(url).host}", Kind.WEBHOOK, url))
    return found


def public_url(path: str) -> str:
    """The link to a dashboard page in a notification: SAGA_PUBLIC_URL + the page's path."""
    return f"{saga().public_url}{path}"


def notify(
    *,
    tenant: Tenant,
    event: str,
    subject_id: str,
    run_id: str,
    summary: str,
    path: str,
    risk: str,
    lines: list[str] | None = None,
    approval_id: str = "",
    args_hash: str = "",
    facts: list[tuple[str, str]] | None = None,
    channels: list[NotificationChannel] | None = None,
    people: tuple[str, list[str]] | None = None,
) -> list[Notification]:
    """Write one outbox row per channel that takes ``event`` at ``risk`` — the tenant's enabled
    channels (their choice of events and minimum risk) and the environment's (every event) — in
    the caller's transaction, and enqueue their delivery after it commits. ``channels``: exactly
    these channels and no environment ones (a test notification).

    The webhook body is fixed here, once for all its channels: ``{event, tenant, id, run_id,
    summary, url, created_at}`` with ``id`` the subject's (approval, item, step, unwind, command).
    ``people``: (who, addresses) — one e-mail more, to these people themselves, whatever the
    channels want (an escalation's new approvers). ``facts``: (label, value) pairs a card shows
    apart from ``lines`` (a Teams card's fact set: the tool, who asked, the deadline).
    """
    now = timezone.now()
    body = {
        "event": event,
        "tenant": tenant.slug,
        "id": subject_id,
        "run_id": run_id,
        "summary": summary,
        "url": public_url(path),
        "created_at": now.isoformat(),
    }
    # ``args_hash``: the hash of the arguments ``lines`` show, which a Slack Approve button carries.
    context: dict[str, Any] = {
        "lines": lines or [],
        "approval_id": approval_id,
        "args_hash": args_hash,
        "facts": list(map(list, facts or [])),
    }
    common = {
        "tenant": tenant,
        "event": event,
        "subject_id": subject_id,
        "run_id": run_id,
        "risk": risk or Risk.LOW,
        "body": body,
        "context": context,
        "next_attempt_at": now,
        "max_attempts": saga().notify_max_attempts,
    }
    rows: list[Notification] = []
    chosen = (
        channels
        if channels is not None
        else list(NotificationChannel.objects.filter(tenant=tenant, enabled=True).order_by("name"))
    )
    for channel in chosen:
        if channel.kind == Kind.PAGERDUTY:
            rows += _pagerduty_rows(channel, common)
        elif channels is not None or channel.wants(event, risk) or _follows_card(channel, event, risk):
            rows.append(Notification(channel=channel, channel_name=channel.name, kind=channel.kind, **common))
    # What became of an announced subject goes only to the channels that announced it (PagerDuty's
    # incident, Teams' card), never to the environment's.
    if channels is None and event in CHANNEL_EVENTS:
        rows += _environment_rows(common)
    if people is not None and people[1]:
        who, addresses = people
        rows.append(
            Notification(
                channel_name=f"to {who}"[:200],
                kind=Kind.EMAIL,
                env_target=Notification.PEOPLE,
                **{**common, "context": {**context, "recipients": addresses}},
            )
        )
    if not rows:
        return rows
    Notification.objects.bulk_create(rows)
    ids = [row.pk for row in rows]

    def hand_over() -> None:
        for pk in ids:
            enqueue_delivery(notification_id=pk)

    transaction.on_commit(hand_over)
    return rows


def _follows_card(channel: NotificationChannel, event: str, risk: str) -> bool:
    """A Teams channel that took an approval's request card takes its decision's card too: a
    webhook cannot update a card it posted, so the decision follows it."""
    return (
        channel.kind == Kind.TEAMS
        and event == Event.APPROVAL_DECIDED
        and channel.wants(Event.APPROVAL_REQUESTED, risk)
    )


def _environment_rows(common: dict[str, Any]) -> list[Notification]:
    """The installation's own channels: SAGA_NOTIFY_EMAILS (one row) and each SAGA_NOTIFY_WEBHOOKS."""
    return [
        Notification(channel_name=env.name, kind=env.kind, env_target=env.env_target, **common)
        for env in environment_channels()
    ]


def _pagerduty_rows(channel: NotificationChannel, common: dict[str, Any]) -> list[Notification]:
    """One row per Events API event: what pages opens an incident, what became of its subject
    acknowledges or resolves it (``recovery.notifications.pagerduty``)."""
    tenant: Tenant = common["tenant"]
    rows = []
    for action, incident in pagerduty.actions(
        channel,
        event=common["event"],
        subject_id=common["subject_id"],
        run_id=common["run_id"],
        risk=common["risk"],
    ):
        paged = {"action": action, "dedup_key": pagerduty.dedup_key(tenant.slug, incident)}
        context = {**common["context"], "pagerduty": paged}
        rows.append(
            Notification(
                channel=channel,
                channel_name=channel.name,
                kind=channel.kind,
                **{**common, "context": context},
            )
        )
    return rows


def enqueue_delivery(*, notification_id: str, delay_s: float | None = None) -> None:
    """Hand one row to a worker (after commit). Redis down: logged, and the sweeper hands it again
    (``recovery.sweeper.notifications_sweep``); a second job for a row finds nothing to claim."""
    job_id = queueing.enqueue(
        "recovery.jobs.notification_deliver",
        queue="notifications",
        delay_s=delay_s,
        notification_id=notification_id,
    )
    if job_id:
        # Not a state change: remembers which job carries the row, for the sweeper.
        Notification.objects.filter(
            pk=notification_id, status__in=(Notification.Status.PENDING, Notification.Status.SENDING)
        ).update(job_id=job_id)


def notify_item_opened(item: RecoveryItem) -> list[Notification]:
    run = item.run
    tool = item.failed_action.tool if item.failed_action else ""
    lines = [
        f"Agent: {run.agent}",
        f"Request: {run.request}",
        f"Reason: {item.get_reason_display()}",
        f"Failed action: {tool or '(none)'}",
        f"Error: {item.error or '(none)'}",
        f"Suggested: {item.get_suggested_resolution_display()}",
    ]
    return notify(
        tenant=item.tenant,
        event=Event.RECOVERY_OPENED,
        subject_id=item.pk,
        run_id=run.pk,
        summary=f"{item.get_risk_display()} risk: run {run.pk} needs a decision ({item.get_reason_display()})",
        path=reverse("dashboard:run-detail", args=[run.pk]),
        risk=item.risk,
        lines=lines,
    )


def notify_item_claimed(item: RecoveryItem) -> list[Notification]:
    """An unwind started on the item (it claimed it): acknowledges its PagerDuty incidents."""
    run = item.run
    return notify(
        tenant=run.tenant,
        event=Event.RECOVERY_CLAIMED,
        subject_id=item.pk,
        run_id=run.pk,
        summary=f"Run {run.pk} is being compensated",
        path=f"{reverse('dashboard:run-detail', args=[run.pk])}#unwind",
        risk=item.risk,
    )


def notify_item_resolved(item: RecoveryItem) -> list[Notification]:
    """The item was resolved (resumed, closed, compensated): resolves its PagerDuty incidents,
    its run's stuck-undo one included."""
    run = item.run
    return notify(
        tenant=run.tenant,
        event=Event.RECOVERY_RESOLVED,
        subject_id=item.pk,
        run_id=run.pk,
        summary=f"Run {run.pk}: recovery item {item.get_resolution_display().lower()}",
        path=reverse("dashboard:run-detail", args=[run.pk]),
        risk=item.risk,
        lines=[f"Note: {item.resolution_note or '(none)'}"],
    )


# The most of an approval's args a notification spells out. Past it the text is cut (and says so):
# a message cannot show an approver a megabyte, a Slack message whose args were cut carries no
# Approve button (``recovery.slack``), and the inbox shows them whole. Well above Slack's own limit,
# so whatever is cut here is cut there too.
ARGS_SHOWN_MAX = 20_000


def args_shown(args: Any) -> str:
    """The args as a notification spells them: indented, keys sorted, cut past ``ARGS_SHOWN_MAX``
    characters. Their size is read from their canonical bytes first (orjson, a few milliseconds
    for a megabyte), so a near-limit body is never indented by the standard library."""
    if len(canonical_json_bytes(args)) <= ARGS_SHOWN_MAX:
        return json.dumps(args, indent=2, sort_keys=True, default=str)
    text = orjson.dumps(args, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str).decode()
    return f"{text[:ARGS_SHOWN_MAX]}\n… cut here ({len(text) - ARGS_SHOWN_MAX} more characters): the inbox shows them whole"


def approval_lines(approval: Approval) -> list[str]:
    """What a notification says of an approval: the args (a Slack Approve button is bound to their
    hash, ``approval.args_hash``, and offered only when they were not cut)."""
    return [
        f"{approval.get_kind_display()}: {approval.tool}",
        *([delegated_line(approval)] if approval.delegated_from else []),
        deadline_line(approval),
        f"Args: {args_shown(approval.args)}",
    ]


def delegated_line(approval: Approval) -> str:
    """``Delegated from ann to bob at 14:05 UTC: ann is away.`` (the hand-over's words)."""
    when = clock(approval.delegated_at, timezone.now()) if approval.delegated_at else "?"
    return (
        f"Delegated from {approval.delegated_from} to {approval.escalate_to} at {when}: "
        f"{approval.delegated_from} is away."
    )


def asked_by_words(approval: Approval) -> str:
    """Who asked for an approval: the key that recorded it, the person, or else (an automatic
    compensation) Saga Admin."""
    if approval.requested_by_key_id is not None and approval.requested_by_key is not None:
        return f"agent key {approval.requested_by_key.name}"
    if approval.requested_by_id is not None and approval.requested_by is not None:
        return approval.requested_by.get_username()
    return "Saga Admin (an automatic compensation)"


def approval_facts(approval: Approval, *, deadline: bool = True) -> list[tuple[str, str]]:
    """What a card says of an approval besides its lines: the tool, what it gates, who asked and
    (while it waits) the deadline in words."""
    facts = [
        ("Tool", approval.tool),
        ("Kind", approval.get_kind_display()),
        ("Asked by", asked_by_words(approval)),
    ]
    if approval.approvers_required > 1:
        facts.append(("Approvers needed", str(approval.approvers_required)))
    if deadline:
        facts.append(("Deadline", deadline_line(approval)))
    return facts


def _notify_approval_waiting(
    approval: Approval,
    event: str,
    summary: str,
    *,
    lines: list[str] | None = None,
    people: tuple[str, list[str]] | None = None,
) -> list[Notification]:
    """A notification about an approval still waiting: it links to its inbox card and carries its
    args (and their hash, which a Slack Approve button is bound to)."""
    return notify(
        tenant=approval.tenant,
        event=event,
        subject_id=approval.pk,
        run_id=approval.run_id,
        summary=summary,
        path=f"{reverse('dashboard:approvals')}#approval-{approval.pk}",
        risk=approval.risk,
        lines=[*(lines or []), *approval_lines(approval)],
        approval_id=approval.pk,
        args_hash=approval.args_hash,
        facts=approval_facts(approval),
        people=people,
    )


def notify_approval_requested(approval: Approval) -> list[Notification]:
    return _notify_approval_waiting(
        approval,
        Event.APPROVAL_REQUESTED,
        f"Approval needed: {approval.tool} ({approval.risk} risk) on run {approval.run_id}",
    )


def notify_approval_reminder(approval: Approval) -> list[Notification]:
    return _notify_approval_waiting(
        approval,
        Event.APPROVAL_REMINDER,
        f"Reminder: approval of {approval.tool} ({approval.risk} risk) on run {approval.run_id} "
        f"expires at {approval.expires_at:%Y-%m-%d %H:%M} UTC"
        + (f" (escalated to {approval.escalate_to})" if approval.escalated_at else ""),
    )


def notify_approval_escalated(
    approval: Approval,
    *,
    missed: datetime,
    emails: list[str] | None = None,
    away_until: datetime | None = None,
) -> list[Notification]:
    """Nobody decided before the deadline: the approval now waits for ``escalate_to``, told once
    (the escalation's compare-and-set, ``recovery.approval_deadlines.approval_escalate``): the
    tenant's channels, and by e-mail the people it now waits for (``emails``). ``away_until``: it
    was escalated to a person away until then and handed over to ``escalate_to``, their delegate."""
    delegated = (
        f" (delegate of {approval.delegated_from}, away until {clock(away_until, timezone.now())})"
        if away_until is not None and approval.delegated_from
        else ""
    )
    return _notify_approval_waiting(
        approval,
        Event.APPROVAL_ESCALATED,
        f"Escalated to {approval.escalate_to}{delegated}: approval of {approval.tool} ({approval.risk} risk) "
        f"on run {approval.run_id}, nobody decided by {clock(missed, timezone.now())}",
        lines=[f"Now decided by {escalation_who_words(approval.escalate_to)} only."],
        people=(escalation_who_words(approval.escalate_to), emails or []),
    )


def notify_approval_delegated(
    approval: Approval, *, named: str, until: datetime, emails: list[str]
) -> list[Notification]:
    """An escalated approval went from ``named``, who is away until ``until``, to their delegate
    (``recovery.transitions.delegation``): the channels that take ``approval.escalated`` hear, and
    the delegate is written to (``emails``)."""
    return _notify_approval_waiting(
        approval,
        Event.APPROVAL_ESCALATED,
        f"Delegated to {approval.escalate_to}: {named} is away until {clock(until, timezone.now())}; "
        f"approval of {approval.tool} ({approval.risk} risk) on run {approval.run_id}",
        lines=[f"Now decided by {approval.escalate_to} (or {named})."],
        people=(approval.escalate_to, emails),
    )


def notify_approval_expired(approval: Approval) -> list[Notification]:
    """Nobody decided before the (last) deadline: the approval expired and what it gated was
    refused (the agent sees a rejection with reason ``timed_out``)."""
    gated = "the compensation step fails without running" if approval.step_id else "the action is rejected"
    escalated = f" (escalated to {approval.escalate_to} first)" if approval.escalated_at else ""
    return notify(
        tenant=approval.tenant,
        event=Event.APPROVAL_EXPIRED,
        subject_id=approval.pk,
        run_id=approval.run_id,
        summary=(
            f"Timed out: nobody decided the approval of {approval.tool} ({approval.risk} risk) on run "
            f"{approval.run_id} in time{escalated}"
        ),
        path=reverse("dashboard:run-detail", args=[approval.run_id]),
        risk=approval.risk,
        lines=[
            f"{approval.get_kind_display()}: {approval.tool}",
            f"Deadline: {clock(approval.expires_at, timezone.now())}; {gated} (reason timed_out).",
        ],
        approval_id=approval.pk,
        facts=approval_facts(approval, deadline=False),
    )


def decided_by_words(approval: Approval) -> str:
    """Who decided an approval: the person, or the approver key and its owner."""
    key = approval.decided_by_key if approval.decided_by_key_id is not None else None
    if key is not None:
        owner = key.owner.get_username() if key.owner is not None else ""
        return f"{owner} (approver key {key.name})" if owner else f"approver key {key.name}"
    return approval.decided_by.get_username() if approval.decided_by is not None else "Saga Admin"


def notify_approval_decided(approval: Approval) -> list[Notification]:
    """The approval was decided (approved, rejected) or withdrawn, in that transaction: resolves
    its PagerDuty incident, and posts the card that follows a Teams channel's request card
    (``_follows_card``); no other channel hears of it."""
    withdrawn = approval.status == Approval.Status.EXPIRED
    outcome = "Withdrawn" if withdrawn else approval.get_status_display()
    by = "" if withdrawn else f" by {decided_by_words(approval)}"
    edited = bool(approval.approved_args_hash) and approval.approved_args_hash != approval.args_hash
    lines = [
        f"{approval.get_kind_display()}: {approval.tool}",
        f"Decision: {outcome}{by} at {clock(approval.decided_at or timezone.now(), timezone.now())}",
        f"Reason: {approval.reason or '(none)'}",
    ]
    if edited:
        lines += [
            "The approver edited the arguments before approving them; these were approved:",
            f"Args: {args_shown(approval.approved_args)}",
        ]
    return notify(
        tenant=approval.tenant,
        event=Event.APPROVAL_DECIDED,
        subject_id=approval.pk,
        run_id=approval.run_id,
        summary=f"{outcome}{by}: {approval.tool} ({approval.risk} risk) on run {approval.run_id}",
        path=reverse("dashboard:run-detail", args=[approval.run_id]),
        risk=approval.risk,
        lines=lines,
        approval_id=approval.pk,
        facts=[*approval_facts(approval, deadline=False), ("Decision", f"{outcome}{by}")],
    )


def notify_approval_granted(approval: Approval, *, grants: int) -> list[Notification]:
    """One of the people an approval needs granted it and it still waits for the others:
    acknowledges its PagerDuty incident (someone is on it)."""
    return notify(
        tenant=approval.tenant,
        event=Event.APPROVAL_GRANTED,
        subject_id=approval.pk,
        run_id=approval.run_id,
        summary=(
            f"Approval of {approval.tool} on run {approval.run_id}: granted by {grants} of "
            f"{approval.approvers_required} people"
        ),
        path=f"{reverse('dashboard:approvals')}#approval-{approval.pk}",
        risk=approval.risk,
    )


def notify_step_failed(step: UnwindStep, *, run: Run, risk: str) -> list[Notification]:
    return notify(
        tenant=run.tenant,
        event=Event.STEP_FAILED,
        subject_id=step.pk,
        run_id=run.pk,
        summary=f"Compensation step {step.tool or step.action.tool} {step.status} on run {run.pk}",
        path=f"{reverse('dashboard:run-detail', args=[run.pk])}#unwind",
        risk=risk,
        lines=[
            f"Undoing: {step.action.tool} (action {step.action_id})",
            f"Attempts: {step.attempts}",
            f"Error: {step.error or '(none)'}",
        ],
    )


def notify_unwind_finished(unwind: Unwind, *, run: Run, summary: str, risk: str) -> list[Notification]:
    outcome = "compensated" if unwind.status == Unwind.Status.COMPLETED else "finished with steps left"
    return notify(
        tenant=run.tenant,
        event=Event.UNWIND_FINISHED,
        subject_id=unwind.pk,
        run_id=run.pk,
        summary=f"Run {run.pk} {outcome}",
        path=f"{reverse('dashboard:run-detail', args=[run.pk])}#unwind",
        risk=risk,
        lines=[f"Agent: {run.agent}", f"Request: {run.request}", f"Unwind: {summary}"],
    )


def notify_command_overdue(command: AgentCommand) -> list[Notification]:
    run = command.run
    now = timezone.now()
    waited_min = max(1, round((now - command.created_at).total_seconds() / 60))
    heard_at = run.last_heartbeat_at or run.created_at
    alive = (
        f"The agent is alive (last heartbeat {heard_at:%H:%M:%S} UTC) and was handed the command."
        if heard_at > command.created_at
        else f"The agent has not been heard from since {heard_at:%Y-%m-%d %H:%M:%S} UTC."
    )
    return notify(
        tenant=run.tenant,
        event=Event.COMMAND_OVERDUE,
        subject_id=command.pk,
        run_id=run.pk,
        summary=f"Resume of run {run.pk} not picked up after {waited_min} min",
        path=reverse("dashboard:run-detail", args=[run.pk]),
        risk=Risk.LOW,
        lines=[
            f"Run {run.pk} of agent {run.agent} was resumed by {command.issued_by()} at "
            f"{command.created_at:%Y-%m-%d %H:%M} UTC and its agent has not acknowledged the command.",
            f"Request: {run.request}",
            alive,
            f"If it stays silent for {saga().heartbeat_timeout_s} s the run comes back to the recovery "
            "queue as agent lost and waits for a person (it is not compensated automatically).",
        ],
    )
