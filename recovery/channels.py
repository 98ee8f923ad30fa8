"""A tenant's notification settings, as its admins manage them in the dashboard: channels (e-mail,
signed webhook, Slack incoming webhook) with their choice of events and minimum risk, a test
notification, the tenant's Slack app (its signing secret) and which Slack users are which
dashboard users. Each change is audited on the tenant's chain; no secret is ever written to the
audit log.

The rules for a channel's destination live on the model (``NotificationChannel.clean``: e-mail
addresses, or a URL ``ledger.outbound.check_url`` accepts), which the Django admin's forms call
too; these services call ``full_clean`` before saving.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from ledger import errors
from ledger.audit import Actor, audit_record
from ledger.models import Membership, Tenant
from recovery import notifications
from recovery.models import (
    Notification,
    NotificationChannel,
    NotificationEvent,
    SlackApp,
    SlackUserLink,
)

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# Fields of a channel a person may set (the rest are the system's).
EDITABLE = ("name", "kind", "target", "secret", "events", "min_risk", "enabled")


def new_webhook_secret() -> str:
    return secrets.token_urlsafe(32)


def _validated(channel: NotificationChannel) -> None:
    try:
        channel.full_clean(exclude=["tenant", "created_by"])
    except ValidationError as exc:
        fields = exc.message_dict
        message = " ".join(f"{'; '.join(msgs)}" for msgs in fields.values())
        raise errors.ValidationFailed(message, details={"fields": fields}) from None


def _channel_data(channel: NotificationChannel) -> dict[str, Any]:
    # What the audit log keeps of a channel: never its secret (nor a Slack hook URL, which is one).
    shown_target = channel.target if channel.kind == NotificationChannel.Kind.EMAIL else "(URL)"
    return {
        "channel_id": channel.pk,
        "name": channel.name,
        "kind": channel.kind,
        "target": shown_target,
        "events": channel.events,
        "min_risk": channel.min_risk,
        "enabled": channel.enabled,
    }


@dataclass(frozen=True)
class SavedChannel:
    channel: NotificationChannel
    # A webhook secret generated for it: shown once, to whoever saved it.
    generated_secret: str = ""


@transaction.atomic
def channel_create(
    *,
    tenant: Tenant,
    actor: Actor,
    name: str,
    kind: str,
    target: str,
    secret: str = "",
    events: list[str] | None = None,
    min_risk: str = "low",
    enabled: bool = True,
) -> SavedChannel:
    """A new channel. A webhook without a secret gets a generated one (returned, shown once)."""
    generated = ""
    if kind == NotificationChannel.Kind.WEBHOOK and not secret:
        secret = generated = new_webhook_secret()
    channel = NotificationChannel(
        tenant=tenant,
        name=name.strip(),
        kind=kind,
        target=target.strip(),
        secret=secret if kind == NotificationChannel.Kind.WEBHOOK else "",
        events=list(events or []),
        min_risk=min_risk,
        enabled=enabled,
        created_by=actor.user,
    )
    _validated(channel)
    try:
        with transaction.atomic():
            channel.save()
    except IntegrityError:
        raise errors.Conflict(
            f"This tenant already has a channel named {channel.name!r}.",
            details={"name": channel.name},
            code="channel_name_taken",
        ) from None
    audit_record(
        tenant=tenant, actor=actor, kind="channel.created", subject=channel, data=_channel_data(channel)
    )
    return SavedChannel(channel, generated)


@transaction.atomic
def channel_update(*, channel: NotificationChannel, actor: Actor, **fields: Any) -> SavedChannel:
    """Change a channel's settings (``EDITABLE``). A blank ``secret`` keeps the current one;
    ``secret="generate"`` makes a new one (returned, shown once)."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise errors.ValidationFailed(
            f"Not a channel setting: {sorted(unknown)}.", details={"fields": sorted(unknown)}
        )
    current = NotificationChannel.objects.select_for_update().get(pk=channel.pk)
    generated = ""
    secret = fields.pop("secret", "")
    if secret == "generate":
        secret = generated = new_webhook_secret()
    for name, value in fields.items():
        setattr(current, name, value.strip() if isinstance(value, str) else value)
    if current.kind == NotificationChannel.Kind.WEBHOOK:
        if secret:
            current.secret = secret
        elif not current.secret:
            current.secret = generated = new_webhook_secret()
    else:
        current.secret = ""
    _validated(current)
    try:
        with transaction.atomic():
            current.save()
    except IntegrityError:
        raise errors.Conflict(
            f"This tenant already has a channel named {current.name!r}.",
            details={"name": current.name},
            code="channel_name_taken",
        ) from None
    data = {**_channel_data(current), "secret_changed": bool(secret)}
    audit_record(tenant=current.tenant, actor=actor, kind="channel.updated", subject=current, data=data)
    return SavedChannel(current, generated)


@transaction.atomic
def channel_delete(*, channel: NotificationChannel, actor: Actor) -> None:
    """Delete a channel; its notifications stay (the outbox keeps the channel's name), and one
    not sent yet fails saying the channel was deleted."""
    audit_record(
        tenant=channel.tenant,
        actor=actor,
        kind="channel.deleted",
        subject=channel,
        data=_channel_data(channel),
    )
    channel.delete()


@transaction.atomic
def channel_send_test(*, channel: NotificationChannel, actor: Actor) -> Notification:
    """A test notification to this channel alone, through the outbox like any other."""
    [row] = notifications.notify(
        tenant=channel.tenant,
        event=NotificationEvent.TEST,
        subject_id=channel.pk,
        run_id="",
        summary=f"Test notification for channel {channel.name}, sent by {actor.label}",
        path="/notifications/",
        risk="low",
        lines=["If you read this, Saga Admin can reach this channel."],
        channels=[channel],
    )
    audit_record(
        tenant=channel.tenant,
        actor=actor,
        kind="channel.tested",
        subject=channel,
        data={"channel_id": channel.pk, "notification_id": row.pk},
    )
    return row


# --- The Slack app -----------------------------------------------------------------------------


@transaction.atomic
def slack_app_set(*, tenant: Tenant, actor: Actor, signing_secret: str) -> SlackApp:
    """Connect (or re-key) the tenant's Slack app: its signing secret verifies button presses."""
    signing_secret = signing_secret.strip()
    if len(signing_secret) < 16 or len(signing_secret) > 200 or not signing_secret.isprintable():
        raise errors.ValidationFailed(
            "The signing secret is the Slack app's “Signing Secret” (Basic Information → App "
            "Credentials): 16 to 200 printable characters.",
            details={"field": "signing_secret"},
        )
    app, created = SlackApp.objects.update_or_create(
        tenant=tenant, defaults={"signing_secret": signing_secret, "updated_by": actor.user}
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="slack_app.connected" if created else "slack_app.rekeyed",
        subject=app,
        data={"tenant": tenant.slug},
    )
    return app


@transaction.atomic
def slack_app_remove(*, tenant: Tenant, actor: Actor) -> bool:
    deleted, _ = SlackApp.objects.filter(tenant=tenant).delete()
    if deleted:
        audit_record(
            tenant=tenant,
            actor=actor,
            kind="slack_app.disconnected",
            subject=f"slack_app:{tenant.slug}",
            data={"tenant": tenant.slug},
        )
    return bool(deleted)


def _slack_id(value: str, *, field: str, what: str) -> str:
    value = value.strip().upper()
    if not (1 <= len(value) <= 32 and value.isalnum() and value.isascii()):
        raise errors.ValidationFailed(
            f"{what} is letters and digits, like T0123ABC or U0456DEF.", details={"field": field}
        )
    return value


@transaction.atomic
def slack_user_link_add(
    *, tenant: Tenant, actor: Actor, team_id: str, slack_user_id: str, user: User
) -> SlackUserLink:
    """Map a Slack user (workspace team id + user id) to a dashboard user of this tenant: their
    button presses are that user's decisions, under that user's role."""
    team_id = _slack_id(team_id, field="team_id", what="The Slack team (workspace) id")
    slack_user_id = _slack_id(slack_user_id, field="slack_user_id", what="The Slack user id")
    if not Membership.objects.filter(user=user, tenant=tenant).exists():
        raise errors.ValidationFailed("That user is not a member of this tenant.", details={"field": "user"})
    try:
        with transaction.atomic():
            link = SlackUserLink.objects.create(
                tenant=tenant, team_id=team_id, slack_user_id=slack_user_id, user=user
            )
    except IntegrityError:
        raise errors.Conflict(
            f"Slack user {team_id}/{slack_user_id} is already mapped in this tenant; remove that mapping first.",
            details={"team_id": team_id, "slack_user_id": slack_user_id},
            code="slack_user_mapped",
        ) from None
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="slack_user.linked",
        subject=link,
        data={"team_id": team_id, "slack_user_id": slack_user_id, "user": user.get_username()},
    )
    return link


@transaction.atomic
def slack_user_link_remove(*, link: SlackUserLink, actor: Actor) -> None:
    audit_record(
        tenant=link.tenant,
        actor=actor,
        kind="slack_user.unlinked",
        subject=link,
        data={"team_id": link.team_id, "slack_user_id": link.slack_user_id, "user": link.user.get_username()},
    )
    link.delete()


# --- Reads -------------------------------------------------------------------------------------


def channels_of(*, tenant_ids: list[int]) -> QuerySet[NotificationChannel]:
    return (
        NotificationChannel.objects.filter(tenant_id__in=tenant_ids)
        .select_related("tenant")
        .order_by("tenant__slug", "name")
    )


def notifications_of(*, tenant_ids: list[int], status: str = "", limit: int = 100) -> list[Notification]:
    rows = Notification.objects.filter(tenant_id__in=tenant_ids).select_related("tenant")
    if status in Notification.Status.values:
        rows = rows.filter(status=status)
    return list(rows.order_by("-created_at", "-id")[:limit])


def slack_user_for(*, tenant: Tenant, team_id: str, slack_user_id: str) -> User | None:
    link = (
        SlackUserLink.objects.select_related("user")
        .filter(tenant=tenant, team_id=team_id, slack_user_id=slack_user_id, user__is_active=True)
        .first()
    )
    return link.user if link is not None else None
