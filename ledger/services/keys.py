"""Tenants and their API keys (shown once, stored hashed)."""

from __future__ import annotations

import copy
import hmac
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from infra import errors
from infra.conf import saga
from infra.hashing import sha256_hex
from ledger.audit import Actor, audit_record
from ledger.models import AgentKey, Membership, Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import User

KEY_PREFIX = "sk"

# The roles that may own an approver key: the same people who approve in the dashboard.
APPROVER_ROLES = (Membership.Role.APPROVER, Membership.Role.ADMIN)


@transaction.atomic
def tenant_get_or_create(*, slug: str, name: str = "") -> Tenant:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return tenant


@dataclass(frozen=True)
class IssuedKey:
    key: AgentKey
    secret: str  # the full key; shown once, never stored


def _split_key(raw: str) -> tuple[str, str] | None:
    parts = raw.split("_")
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return f"{parts[0]}_{parts[1]}", parts[2]


def key_owner_check(*, tenant: Tenant, scopes: Iterable[str], owner: User | None) -> None:
    """Refuse an owner who may not stand behind a key of ``scopes`` in ``tenant``: an approver key
    needs one, a member of the tenant with the approver or admin role (the people who approve in
    the dashboard); any other key may have one, a member of the tenant in any role."""
    approver = AgentKey.Scope.APPROVER in set(scopes)
    if owner is None:
        if approver:
            raise errors.ValidationFailed(
                "An approver key belongs to a person: name them with --owner USERNAME (a member of "
                "the tenant with the approver or admin role). People, not keys, approve: their login "
                "and every key they own count as one approver.",
                details={"owner": "required"},
                code="owner_required",
            )
        return
    username = owner.get_username()
    membership = Membership.objects.filter(user=owner, tenant=tenant).first()
    if not owner.is_active or membership is None:
        raise errors.ValidationFailed(
            f"{username} is not an active member of tenant {tenant.slug}, so they cannot own its keys. "
            f"Give them a role first: manage.py create_staff {username} --tenant {tenant.slug} --role ….",
            details={"owner": username, "tenant": tenant.slug},
            code="owner_not_member",
        )
    if approver and membership.role not in APPROVER_ROLES:
        raise errors.ValidationFailed(
            f"{username} is {membership.role} at {tenant.slug}; an approver key's owner must have "
            "the approver or admin role there.",
            details={"owner": username, "role": membership.role, "allowed": list(APPROVER_ROLES)},
            code="owner_not_approver",
        )


def _key_fields_check(
    *, tenant: Tenant, name: str, scopes: Iterable[str], owner: User | None
) -> tuple[str, list[str]]:
    """The checks every key passes, issued or imported: a name, known scopes, never ``agent``
    with ``approver``, an owner who may stand behind it. Returns the stripped name and the sorted
    scopes."""
    name = name.strip()
    if not name:
        raise errors.ValidationFailed(
            "A key needs a name: the agent or automation it is for.", details={"name": "required"}
        )
    scope_list = sorted(set(scopes))
    unknown = set(scope_list) - set(AgentKey.Scope.values)
    if not scope_list or unknown:
        raise errors.ValidationFailed(
            f"Scopes must be a non-empty subset of {', '.join(AgentKey.Scope.values)}.",
            details={"scopes": sorted(unknown)},
        )
    # The database refuses the pair too (a check constraint); this says why, before it does.
    if {AgentKey.Scope.AGENT, AgentKey.Scope.APPROVER} <= set(scope_list):
        raise errors.ValidationFailed(
            "A key cannot hold both the 'agent' and the 'approver' scope: an agent must never approve "
            "what it asked for. Issue the approver its own key (--scopes approver).",
            details={"scopes": scope_list, "conflict": ["agent", "approver"]},
        )
    key_owner_check(tenant=tenant, scopes=scope_list, owner=owner)
    return name, scope_list


def agent_key_new_secret() -> str:
    """Fresh key material in the one format keys have: ``sk_`` + 12 hex digits (the public
    prefix) + ``_`` + 43 characters of ``A-Z a-z 0-9 -`` (256 random bits)."""
    return f"{KEY_PREFIX}_{secrets.token_hex(6)}_{secrets.token_urlsafe(32).replace('_', '-')}"


# What ``agent_key_new_secret`` makes, and the only thing ``agent_key_import`` accepts.
KEY_FORMAT = re.compile(rf"{KEY_PREFIX}_[0-9a-f]{{12}}_[A-Za-z0-9-]{{43}}")
KEY_FORMAT_TEXT = "sk_ + 12 lower-case hex digits + _ + 43 characters of A-Z, a-z, 0-9 and -"


def agent_key_material_check(raw: str) -> tuple[str, str]:
    """The prefix and secret part of provided key material, or ``ValidationFailed`` saying what a
    key looks like. The material itself is never repeated in the message."""
    if not KEY_FORMAT.fullmatch(raw):
        raise errors.ValidationFailed(
            f"The key is not in the format of a key this server issues ({KEY_FORMAT_TEXT}; "
            f"{len(raw)} characters given, a key has 60). `manage.py bootstrap --print-new-key` "
            "prints fresh key material.",
            details={"key": "malformed", "length": len(raw)},
            code="key_malformed",
        )
    split = _split_key(raw)
    assert split is not None  # the format has exactly two underscores
    return split


@transaction.atomic
def agent_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: Iterable[str] = ("agent",),
    actor: Actor,
    owner: User | None = None,
) -> IssuedKey:
    """Issue a key. ``name`` is the agent (or automation) it is for: every key issued with the same
    name is the same agent — it owns the runs created under that name — so rotating a key is
    issuing a new one with the same name and revoking the old one when nothing uses it.
    ``owner``: the person behind the key (``key_owner_check``; required with ``approver``)."""
    name, scope_list = _key_fields_check(tenant=tenant, name=name, scopes=scopes, owner=owner)
    raw = agent_key_new_secret()
    prefix, secret_part = agent_key_material_check(raw)
    key = _key_store(
        tenant=tenant,
        name=name,
        scopes=scope_list,
        owner=owner,
        material=(prefix, secret_part),
        actor=actor,
        kind="agent_key.created",
    )
    return IssuedKey(key=key, secret=raw)


def _key_store(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str],
    owner: User | None,
    material: tuple[str, str],
    actor: Actor,
    kind: str,
) -> AgentKey:
    """Store a checked key (only the digest of its secret part) and audit it as ``kind``: what an
    issued and an imported key share."""
    prefix, secret_part = material
    key = AgentKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, key_hash=sha256_hex(secret_part), scopes=scopes, owner=owner
    )
    data: dict[str, object] = {"name": name, "scopes": scopes}
    if owner is not None:
        data["owner"] = owner.get_username()
    audit_record(tenant=tenant, actor=actor, kind=kind, subject=key, data=data)
    return key


def agent_key_matches(*, key: AgentKey, raw: str) -> bool:
    """Whether provided key material is ``key``'s (its prefix and, in constant time, its secret)."""
    split = _split_key(raw)
    if split is None or split[0] != key.prefix:
        return False
    return hmac.compare_digest(key.key_hash, sha256_hex(split[1]))


@transaction.atomic
def agent_key_import(
    *,
    tenant: Tenant,
    name: str,
    secret: str,
    scopes: Iterable[str] = ("agent",),
    actor: Actor,
    owner: User | None = None,
) -> AgentKey:
    """Store a key whose material the operator made (``manage.py bootstrap``: a key a deployment
    declares in its secrets, so it need not be read off a one-time output). The same checks as an
    issued key, plus the format of one (``agent_key_material_check``); a prefix already in use is
    refused (409). Only the digest of the secret part is stored, as for an issued key. Audited
    ``agent_key.imported``: unlike an issued key, someone other than this server has seen it."""
    name, scope_list = _key_fields_check(tenant=tenant, name=name, scopes=scopes, owner=owner)
    prefix, secret_part = agent_key_material_check(secret)
    if AgentKey.objects.filter(prefix=prefix).exists():
        raise errors.Conflict(
            f"A key with the prefix {prefix} already exists; every key needs its own (make new key "
            "material rather than reusing a key's).",
            details={"key": prefix},
            code="key_prefix_taken",
        )
    return _key_store(
        tenant=tenant,
        name=name,
        scopes=scope_list,
        owner=owner,
        material=(prefix, secret_part),
        actor=actor,
        kind="agent_key.imported",
    )


@transaction.atomic
def agent_key_set_owner(*, key: AgentKey, owner: User, actor: Actor) -> AgentKey:
    """Give a key that has none its owner (``key_owner_check``), once: a key issued before owners
    existed becomes that person's. An owner is never replaced — a grant made through a key must
    stay the grant of the person who owned it then — so a key that has one, or a revoked key, is
    refused (409); issue a new key instead."""
    key_owner_check(tenant=key.tenant, scopes=key.scopes, owner=owner)
    if (
        AgentKey.objects.filter(pk=key.pk, owner__isnull=True, revoked_at__isnull=True).update(owner=owner)
        != 1
    ):
        current = AgentKey.objects.select_related("owner").get(pk=key.pk)
        state = "revoked" if current.revoked_at is not None else f"owned by {current.owner}"
        raise errors.Conflict(
            f"Key {key.prefix} is {state}; an owner is set once, on a key that has none. Issue a new "
            "key with create_agent_key --owner instead.",
            details={"key": key.prefix, "current": state},
            code="key_owner_set",
        )
    # The new owner counts at once in this process, and within SAGA_KEY_CACHE_S in others.
    key_cache_clear()
    transaction.on_commit(key_cache_clear)
    key.refresh_from_db()
    audit_record(
        tenant=key.tenant,
        actor=actor,
        kind="agent_key.owner_set",
        subject=key,
        data={"name": key.name, "owner": owner.get_username(), "scopes": list(key.scopes)},
    )
    return key


# Keys this process has looked up: {sha256 of the presented key: (monotonic time, key)}. An entry
# answers for ``SAGA_KEY_CACHE_S`` seconds (the bound on how long a key revoked by another process
# keeps working here); a revocation in this process drops every entry at once. Only keys that
# authenticated are kept: an unknown or revoked key is looked up every time (the gate's
# per-address throttle is what bounds those). Bounded in size, so a flood of valid keys cannot
# grow it without limit.
_KEY_CACHE: dict[str, tuple[float, AgentKey]] = {}
_KEY_CACHE_LOCK = threading.Lock()
_KEY_CACHE_MAX = 10_000


def key_cache_clear() -> None:
    with _KEY_CACHE_LOCK:
        _KEY_CACHE.clear()


def _detached(key: AgentKey) -> AgentKey:
    """A copy for one request: callers may set attributes on the key or its tenant without
    touching the cached instance other threads read."""
    twin = copy.copy(key)
    twin.tenant = copy.copy(key.tenant)
    return twin


def agent_key_authenticate(*, raw_key: str) -> AgentKey | None:
    """The active key for a presented secret, or None. Constant-time on the secret part. Served
    from this process's cache for up to ``SAGA_KEY_CACHE_S`` seconds after a lookup."""
    ttl = saga().key_cache_s
    digest = sha256_hex(raw_key.strip())
    now = time.monotonic()
    if ttl > 0:
        hit = _KEY_CACHE.get(digest)
        if hit is not None and now - hit[0] < ttl:
            return _detached(hit[1])
    key = _agent_key_lookup(raw_key)
    if key is not None and ttl > 0:
        with _KEY_CACHE_LOCK:
            if len(_KEY_CACHE) >= _KEY_CACHE_MAX:
                _KEY_CACHE.clear()
            _KEY_CACHE[digest] = (now, _detached(key))
    return key


def _agent_key_lookup(raw_key: str) -> AgentKey | None:
    split = _split_key(raw_key.strip())
    if split is None:
        return None
    prefix, secret_part = split
    # The owner comes along: an approver key's grants are its owner's (recovery.transitions.approvals).
    key = AgentKey.objects.select_related("tenant", "owner").filter(prefix=prefix).first()
    # Compare even when no key matched, so timing does not tell valid prefixes apart.
    stored = key.key_hash if key else "0" * 64
    if not hmac.compare_digest(stored, sha256_hex(secret_part)) or key is None or key.revoked_at is not None:
        return None
    now = timezone.now()
    # last_used_at is advisory: refresh at most once a minute so hot keys don't write per call.
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
        AgentKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


@transaction.atomic
def agent_key_revoke(*, key: AgentKey, actor: Actor) -> AgentKey:
    if AgentKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) != 1:
        raise errors.InvalidTransition(key, to="revoked", current="revoked")
    # Effective at once in this process (dropped now, and again once committed, in case a request
    # looked it up in between); other processes drop it within SAGA_KEY_CACHE_S.
    key_cache_clear()
    transaction.on_commit(key_cache_clear)
    key.refresh_from_db()
    audit_record(tenant=key.tenant, actor=actor, kind="agent_key.revoked", subject=key)
    return key
