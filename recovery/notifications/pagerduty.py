"""PagerDuty channels: what pages, and the PagerDuty Events API v2 events that say so.

A PagerDuty channel opens one incident per subject, named by a dedup key that stays the same for
the subject's whole life: ``saga:<tenant slug>:approval:<id>`` for an approval that nears its
deadline (its reminder, at half the window) or escalates, ``saga:<tenant slug>:item:<id>`` for a
recovery item, ``saga:<tenant slug>:run:<run id>:undo`` for undo that got stuck (a compensation
step that failed or drifted; its own incident, so that it pages even when the item's incident was
acknowledged). What pages is the channel's choice of ``PAGEABLE_EVENTS`` and its minimum risk
(``NotificationChannel.wants``). What became of the subject then acknowledges or resolves the
incident, on the channels that paged about it only:

- ``acknowledge``: the first grants of an approval that needs several people
  (``approval.granted``); an unwind started on the item (``recovery.claimed``).
- ``resolve``: the approval decided, withdrawn (``approval.decided``) or expired
  (``approval.expired``); the item resolved in any way — resumed, closed, compensated
  (``recovery.resolved``), which resolves its run's stuck-undo incident too.

Each event is one outbox row (``context["pagerduty"]``: its action and dedup key), delivered like
every notification (``recovery.notifications.delivery``); a trigger or an acknowledge that is
still waiting to go out when its incident was resolved is dropped, so retries never reopen an
incident out of order.
"""

from __future__ import annotations

from typing import Any

import httpx

from infra.conf import saga
from ledger.models import Risk
from recovery.models import PAGEABLE_EVENTS, Notification, NotificationChannel, NotificationEvent

Event = NotificationEvent

TRIGGER = "trigger"
ACKNOWLEDGE = "acknowledge"
RESOLVE = "resolve"

# A recovery risk as a PagerDuty severity (critical, error, warning, info).
SEVERITY = {Risk.LOW: "info", Risk.MEDIUM: "warning", Risk.HIGH: "error", Risk.CRITICAL: "critical"}

# The most PagerDuty takes of a summary (longer is refused with 400).
SUMMARY_MAX = 1024

_APPROVAL_TRIGGERS = (Event.APPROVAL_REMINDER, Event.APPROVAL_ESCALATED)
# A row that did not reach PagerDuty opened no incident.
_NOT_SENT = (Notification.Status.DROPPED, Notification.Status.FAILED)


def dedup_key(tenant_slug: str, incident: str) -> str:
    return f"saga:{tenant_slug}:{incident}"


def _incident_of_trigger(event: str, *, subject_id: str, run_id: str) -> str:
    if event in _APPROVAL_TRIGGERS:
        return f"approval:{subject_id}"
    if event == Event.RECOVERY_OPENED:
        return f"item:{subject_id}"
    return f"run:{run_id}:undo"  # step.failed


def _paged(channel: NotificationChannel, events: tuple[str, ...], **subject: str) -> bool:
    """Whether ``channel`` has an incident open about the subject: a trigger row that was (or
    may still be) sent."""
    return (
        Notification.objects.filter(channel=channel, event__in=events, **subject)
        .exclude(status__in=_NOT_SENT)
        .exists()
    )


def actions(
    channel: NotificationChannel, *, event: str, subject_id: str, run_id: str, risk: str
) -> list[tuple[str, str]]:
    """The Events API events ``channel`` sends for ``event``: (action, incident) pairs, the
    incident being the dedup key's part after the tenant (``dedup_key``). None for an event it
    neither pages about nor follows up."""
    if event == Event.TEST:
        # Folds into one alert however often it is sent (the admin resolves it in PagerDuty).
        return [(TRIGGER, f"test:{subject_id}")]
    if event in PAGEABLE_EVENTS:
        if not channel.wants(event, risk):
            return []
        return [(TRIGGER, _incident_of_trigger(event, subject_id=subject_id, run_id=run_id))]
    approval = f"approval:{subject_id}"
    if event == Event.APPROVAL_GRANTED:
        return [(ACKNOWLEDGE, approval)] if _paged(channel, _APPROVAL_TRIGGERS, subject_id=subject_id) else []
    if event in (Event.APPROVAL_DECIDED, Event.APPROVAL_EXPIRED):
        return [(RESOLVE, approval)] if _paged(channel, _APPROVAL_TRIGGERS, subject_id=subject_id) else []
    item = f"item:{subject_id}"
    if event == Event.RECOVERY_CLAIMED:
        return (
            [(ACKNOWLEDGE, item)] if _paged(channel, (Event.RECOVERY_OPENED,), subject_id=subject_id) else []
        )
    if event == Event.RECOVERY_RESOLVED:
        found = []
        if _paged(channel, (Event.RECOVERY_OPENED,), subject_id=subject_id):
            found.append((RESOLVE, item))
        if run_id and _paged(channel, (Event.STEP_FAILED,), run_id=run_id):
            found.append((RESOLVE, f"run:{run_id}:undo"))
        return found
    return []


def resolved_since(row: Notification) -> bool:
    """Whether the incident a trigger or acknowledge row is about was resolved after the row was
    written (its resolve row, on the same channel, is younger): then it must not go out."""
    mine = row.context.get("pagerduty") or {}
    if mine.get("action") == RESOLVE or row.channel_id is None:
        return False
    later = Notification.objects.filter(
        channel_id=row.channel_id,
        kind=NotificationChannel.Kind.PAGERDUTY,
        event__in=(Event.APPROVAL_DECIDED, Event.APPROVAL_EXPIRED, Event.RECOVERY_RESOLVED),
        created_at__gte=row.created_at,
    ).exclude(pk=row.pk)
    return any(
        (other.context.get("pagerduty") or {}).get("dedup_key") == mine.get("dedup_key")
        for other in later.only("context")
    )


def event_body(row: Notification, *, routing_key: str) -> dict[str, Any]:
    """The Events API v2 event for one outbox row: ``routing_key``, ``event_action`` and
    ``dedup_key``; a trigger also carries ``payload`` (summary, source, severity, timestamp,
    component, group, class, custom_details), ``links``, ``client`` and ``client_url``."""
    pd = row.context["pagerduty"]
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": pd["action"],
        "dedup_key": pd["dedup_key"],
    }
    if pd["action"] != TRIGGER:
        return event
    body = row.body
    url = str(body.get("url", ""))
    summary = " ".join(str(body.get("summary", "")).split()) or row.event
    event["payload"] = {
        "summary": summary[:SUMMARY_MAX],
        # The installation the alert comes from; its run (or channel, for a test) is the component.
        "source": httpx.URL(saga().public_url).host or "saga-admin",
        "severity": SEVERITY.get(Risk(row.risk or Risk.LOW), "info"),
        "timestamp": str(body.get("created_at", "")),
        "component": f"run {row.run_id}" if row.run_id else "saga-admin",
        "group": row.tenant.slug,
        "class": row.event,
        "custom_details": {
            "event": row.event,
            "tenant": row.tenant.slug,
            "id": row.subject_id,
            "run_id": row.run_id,
            "risk": row.risk,
            "details": [str(line) for line in row.context.get("lines") or []],
        },
    }
    event["links"] = [{"href": url, "text": "Open in Saga Admin"}]
    event["client"] = "Saga Admin"
    event["client_url"] = url
    return event


def endpoint(channel: NotificationChannel) -> str:
    """Where ``channel``'s events go: its own endpoint, or the installation's."""
    return channel.target or saga().pagerduty_events_url


def refusal_detail(response: httpx.Response) -> str:
    """What PagerDuty said was wrong with an event it refused (400: ``{"status": "invalid event",
    "message", "errors": [...]}``), as one line."""
    try:
        answer = response.json()
    except ValueError:
        return response.text[:300].strip()
    if not isinstance(answer, dict):
        return response.text[:300].strip()
    errors = answer.get("errors")
    listed = "; ".join(str(e) for e in errors) if isinstance(errors, list) else ""
    message = str(answer.get("message") or answer.get("status") or "")
    return f"{message}: {listed}" if message and listed else (message or listed)
