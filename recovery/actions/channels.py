"""A tenant's notification settings, as its admins manage them in the dashboard: channels (e-mail,
signed webhook, Slack incoming webhook, Teams Workflows webhook, PagerDuty) with their choice of
events and minimum risk, a test notification, the tenant's Slack app (its signing secret,
write-only: a tenant's own, with which a press only asks, or the installation's, with which a
press decides) and which Slack users are which dashboard users — a link each person makes for
themself with a one-time code, that an admin may only remove, and that no change of secret
survives. Each change is audited on the tenant's chain; no secret is ever written to the audit log.

The rules for a channel's destination live on the model (``NotificationChannel.clean``: e-mail
addresses, or a URL ``infra.outbound.check_url`` accepts), which the Django admin's forms call
too; these services call ``full_clean`` before saving.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from infra import errors
from infra.conf import saga
from ledger.audit import Actor, audit_record
from ledger.models import Membership, Tenant
from recovery.models import (
    Notification,
    NotificationChannel,
    NotificationEvent,
    SlackApp,
    SlackLinkCode,
    SlackUserLink,
)
from recovery.notifications import outbox

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# Fields of a channel a person may set (the rest are the system's).
EDITABLE = ("name", "kind", "target", "secret", "events", "min_risk", "enabled")
# The kinds that keep a secret: a webhook's signing secret, a PagerDuty channel's routing key.
_WITH_SECRET = (NotificationChannel.Kind.WEBHOOK, NotificationChannel.Kind.PAGERDUTY)


def new_webhook_secret() -> str:
    return secrets.token_urlsafe(32)


def _validated(channel: NotificationChannel) -> None:
    try:
        channel.full_clean(exclude=["tenant", "created_by"])
    except ValidationError as exc:
        fields = exc.message_dict
        message = " ".join(f"{'; '.join(msgs)}" for msgs in fields.values())
        raise errors.ValidationFailed(message, details={"fields": fields}) from None


def _save(channel: NotificationChannel) -> None:
    """Checked, then saved; a tenant's channel names are unique (its constraint), so a taken name
    is a refusal that says so, not a database error."""
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


def _channel_data(channel: NotificationChannel) -> dict[str, Any]:
    # What the audit log keeps of a channel: never its secret (nor a Slack hook URL, which is one).
    # A PagerDuty channel's routing key is its secret: never here either.
    shown_target = channel.target if channel.kind == NotificationChannel.Kind.EMAIL else "(URL)"
    if channel.kind == NotificationChannel.Kind.PAGERDUTY and not channel.target:
        shown_target = "(the installation's endpoint)"
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
    """A new channel. A webhook without a secret gets a generated one (returned, shown once); a
    PagerDuty channel's secret is its routing key (required)."""
    generated = ""
    if kind == NotificationChannel.Kind.WEBHOOK and not secret:
        secret = generated = new_webhook_secret()
    channel = NotificationChannel(
        tenant=tenant,
        name=name.strip(),
        kind=kind,
        target=target.strip(),
        secret=secret if kind in _WITH_SECRET else "",
        events=list(events or []),
        min_risk=min_risk,
        enabled=enabled,
        created_by=actor.user,
    )
    _save(channel)
    audit_record(
        tenant=tenant, actor=actor, kind="channel.created", subject=channel, data=_channel_data(channel)
    )
    return SavedChannel(channel, generated)


@transaction.atomic
def channel_update(*, channel: NotificationChannel, actor: Actor, **fields: Any) -> SavedChannel:
    """Change a channel's settings (``EDITABLE``). A blank ``secret`` keeps the current one (a
    webhook's, or a PagerDuty channel's routing key), unless the kind changes; for a webhook
    ``secret="generate"`` makes a new one (returned, shown once)."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise errors.ValidationFailed(
            f"Not a channel setting: {sorted(unknown)}.", details={"fields": sorted(unknown)}
        )
    current = NotificationChannel.objects.select_for_update().get(pk=channel.pk)
    kind_before = current.kind
    generated = ""
    secret = fields.pop("secret", "")
    if secret == "generate" and fields.get("kind", current.kind) == NotificationChannel.Kind.WEBHOOK:
        secret = generated = new_webhook_secret()
    for name, value in fields.items():
        setattr(current, name, value.strip() if isinstance(value, str) else value)
    if current.kind != kind_before:
        # A webhook's signing secret is no routing key, nor the other way round.
        current.secret = ""
    if current.kind in _WITH_SECRET:
        if secret:
            current.secret = secret
        elif not current.secret and current.kind == NotificationChannel.Kind.WEBHOOK:
            current.secret = generated = new_webhook_secret()
    else:
        current.secret = ""
    _save(current)
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
    [row] = outbox.notify(
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


def slack_signing_secret_checked(signing_secret: str) -> str:
    """The secret as it will be stored, or ``ValidationFailed`` (for the forms that check first)."""
    signing_secret = signing_secret.strip()
    if len(signing_secret) < 16 or len(signing_secret) > 200 or not signing_secret.isprintable():
        raise errors.ValidationFailed(
            "The signing secret is the Slack app's “Signing Secret” (Basic Information → App "
            "Credentials): 16 to 200 printable characters.",
            details={"field": "signing_secret"},
        )
    return signing_secret


def _unlink_everyone(*, tenant: Tenant, actor: Actor, why: str) -> list[str]:
    """Remove every Slack link of ``tenant`` (and every unused link code), audited as one event:
    a link was proved under the secret being replaced, so none survives a change of whose secret
    verifies presses. The usernames unlinked, for the caller's event."""
    links = list(SlackUserLink.objects.select_for_update().filter(tenant=tenant).select_related("user"))
    SlackLinkCode.objects.filter(tenant=tenant).delete()
    if not links:
        return []
    users = sorted({link.user.get_username() for link in links})
    SlackUserLink.objects.filter(pk__in=[link.pk for link in links]).delete()
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="slack_user.unlinked_all",
        subject=f"slack_app:{tenant.slug}",
        reason=why,
        data={"tenant": tenant.slug, "links": len(links), "users": users},
    )
    return users


@transaction.atomic
def slack_app_set(*, tenant: Tenant, actor: Actor, signing_secret: str) -> SlackApp:
    """Connect (or re-key) the tenant's Slack app with a secret of its own: its signing secret
    verifies button presses and link commands. Write-only: nothing ever shows it again (pages, the
    Django admin, the audit log, the logs). Whoever set it knows it and could sign a press as any
    linked Slack user, so with such a secret a press only asks (the linked person confirms it in
    the dashboard); and every link goes (``_unlink_everyone``): each person links again, under the
    new secret."""
    signing_secret = slack_signing_secret_checked(signing_secret)
    return _slack_app_save(tenant=tenant, actor=actor, signing_secret=signing_secret, operator_owned=False)


@transaction.atomic
def slack_app_use_installation(*, tenant: Tenant, actor: Actor) -> SlackApp:
    """Connect the tenant to the installation's own Slack app, whose signing secret only the
    operator holds (``SAGA_SLACK_SIGNING_SECRET``): a signed press then decides as the linked
    person. Only the operator does this (``manage.py slack_app --installation-app``); no dashboard
    form does. Every earlier link goes, as on any re-key."""
    if not saga().slack_signing_secret:
        raise errors.ValidationFailed(
            "SAGA_SLACK_SIGNING_SECRET is not set: the installation has no Slack app of its own.",
            details={"setting": "SAGA_SLACK_SIGNING_SECRET"},
        )
    return _slack_app_save(tenant=tenant, actor=actor, signing_secret="", operator_owned=True)


def _slack_app_save(*, tenant: Tenant, actor: Actor, signing_secret: str, operator_owned: bool) -> SlackApp:
    app, created = SlackApp.objects.update_or_create(
        tenant=tenant,
        defaults={
            "signing_secret": signing_secret,
            "operator_owned": operator_owned,
            "updated_by": actor.user,
        },
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="slack_app.connected" if created else "slack_app.rekeyed",
        subject=app,
        data={"tenant": tenant.slug, "secret": "installation" if operator_owned else "tenant"},
    )
    _unlink_everyone(
        tenant=tenant,
        actor=actor,
        why="The Slack app's signing secret changed: every Slack account is linked again, by its owner.",
    )
    return app


def slack_app_secret(app: SlackApp) -> str:
    """The secret that verifies ``app``'s requests ("" verifies nothing)."""
    return saga().slack_signing_secret if app.operator_owned else app.signing_secret


def slack_press_decides(app: SlackApp) -> bool:
    """Whether a signed press is the linked person's decision: only when nobody but the operator
    holds the secret. With a secret a tenant admin set (or could read), a press is a request the
    linked person confirms in the dashboard."""
    return app.operator_owned


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
        _unlink_everyone(
            tenant=tenant,
            actor=actor,
            why="The Slack app was disconnected: links made under its secret go with it.",
        )
    return bool(deleted)


def _slack_id(value: str, *, field: str, what: str) -> str:
    value = value.strip().upper()
    if not (1 <= len(value) <= 32 and value.isalnum() and value.isascii()):
        raise errors.ValidationFailed(
            f"{what} is letters and digits, like T0123ABC or U0456DEF.", details={"field": field}
        )
    return value


# --- Linking a Slack account: only its owner does it ---------------------------------------------
#
# An admin who could type "Slack user U123 is Bob" could approve as Bob from their own Slack
# account. So a link needs both halves proved by the person themself: the dashboard shows the
# signed-in user a one-time code (proving the dashboard user), and the code comes back in a
# command Slack signed for the Slack user who typed it (proving the Slack user).

LINK_CODE_TTL = timedelta(minutes=10)
# Crockford's base32 (no I, L, O, U: nothing to misread when typing it); 16 characters, 80 bits,
# so guessing one within its ten minutes, through a throttled endpoint, is out of reach.
_CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CODE_LENGTH = 16


def normalized_link_code(text: str) -> str:
    """The code as typed, without the grouping dashes or spaces and in upper case."""
    return "".join(ch for ch in text.upper() if ch not in "- ")


def _link_code_hash(code: str) -> str:
    return hashlib.sha256(normalized_link_code(code).encode()).hexdigest()


@dataclass(frozen=True)
class IssuedLinkCode:
    # Shown once, to the user it was issued to; only its hash is stored.
    code: str
    expires_at: datetime


@transaction.atomic
def slack_link_code_issue(*, tenant: Tenant, user: User) -> IssuedLinkCode:
    """A fresh one-time code for ``user`` to link their Slack account in ``tenant`` (replacing any
    earlier one they did not use). Only the user themself may ask: the dashboard calls this for
    the signed-in user and nobody else."""
    if not user.is_active or not Membership.objects.filter(user=user, tenant=tenant).exists():
        raise errors.Forbidden("Only a member of the tenant can link a Slack account to it.")
    if not SlackApp.objects.filter(tenant=tenant).exists():
        raise errors.ValidationFailed(
            f"{tenant.name} has no Slack app connected yet: a tenant admin connects it first.",
            details={"tenant": tenant.slug},
        )
    raw = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(_CODE_LENGTH))
    code = "-".join(raw[i : i + 4] for i in range(0, _CODE_LENGTH, 4))
    expires_at = timezone.now() + LINK_CODE_TTL
    SlackLinkCode.objects.update_or_create(
        tenant=tenant, user=user, defaults={"code_hash": _link_code_hash(code), "expires_at": expires_at}
    )
    audit_record(
        tenant=tenant,
        actor=Actor.for_user(user),
        kind="slack_user.link_code_issued",
        subject=f"user:{user.pk}",
        data={"user": user.get_username(), "expires_at": expires_at.isoformat()},
    )
    return IssuedLinkCode(code=code, expires_at=expires_at)


@transaction.atomic
def slack_link_redeem(*, tenant: Tenant, team_id: str, slack_user_id: str, code: str) -> SlackUserLink:
    """Link the Slack user who sent ``code`` (read from a request Slack signed with ``tenant``'s
    app secret) to the dashboard user the code was issued to. The code is single-use (deleted
    under its row lock, so two redemptions cannot both succeed), expires after
    ``LINK_CODE_TTL`` and works only in the tenant it was issued for. A Slack user linked to
    someone else stays so: that link is removed first (by its owner or an admin)."""
    team_id = _slack_id(team_id, field="team_id", what="The Slack team (workspace) id")
    slack_user_id = _slack_id(slack_user_id, field="slack_user_id", what="The Slack user id")
    row = (
        SlackLinkCode.objects.select_for_update()
        .select_related("user")
        .filter(tenant=tenant, code_hash=_link_code_hash(code))
        .first()
    )
    if row is None or row.expires_at <= timezone.now():
        raise errors.ValidationFailed(
            "That link code is unknown, used or expired: get a new one in Saga Admin (Your Slack "
            "account) and send it within ten minutes.",
            details={"field": "code"},
            code="link_code_invalid",
        )
    user = row.user
    row.delete()
    if not user.is_active or not Membership.objects.filter(user=user, tenant=tenant).exists():
        raise errors.Forbidden(f"{user.get_username()} is no longer a member of {tenant.name}.")
    now = timezone.now()
    link = (
        SlackUserLink.objects.select_for_update()
        .select_related("user")
        .filter(tenant=tenant, team_id=team_id, slack_user_id=slack_user_id)
        .first()
    )
    data: dict[str, Any] = {"team_id": team_id, "slack_user_id": slack_user_id, "user": user.get_username()}
    if link is not None and link.confirmed_at is not None:
        if link.user_id == user.pk:
            return link  # already theirs: nothing to change
        raise errors.Conflict(
            f"Slack user {team_id}/{slack_user_id} is already linked to another Saga Admin user; "
            "that link must be removed first (by its owner or a tenant admin).",
            details={"team_id": team_id, "slack_user_id": slack_user_id},
            code="slack_user_mapped",
        )
    if link is not None:
        # An admin typed this one in before links were self-service; the person now proved both
        # halves, so it becomes theirs.
        data["replaces_unconfirmed_link_of"] = link.user.get_username()
        link.user, link.confirmed_at = user, now
        link.save(update_fields=["user", "confirmed_at"])
    else:
        try:
            with transaction.atomic():
                link = SlackUserLink.objects.create(
                    tenant=tenant, team_id=team_id, slack_user_id=slack_user_id, user=user, confirmed_at=now
                )
        except IntegrityError:
            raise errors.Conflict(
                f"Slack user {team_id}/{slack_user_id} was linked by another request just now.",
                details={"team_id": team_id, "slack_user_id": slack_user_id},
                code="slack_user_mapped",
            ) from None
    audit_record(tenant=tenant, actor=Actor.for_user(user), kind="slack_user.linked", subject=link, data=data)
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
    """The dashboard user a Slack user linked themself to (an unconfirmed link counts for nothing)."""
    link = (
        SlackUserLink.objects.select_related("user")
        .filter(
            tenant=tenant,
            team_id=team_id,
            slack_user_id=slack_user_id,
            user__is_active=True,
            confirmed_at__isnull=False,
        )
        .first()
    )
    return link.user if link is not None else None
