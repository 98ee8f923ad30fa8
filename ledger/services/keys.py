"""Tenants and their API keys (shown once, stored hashed)."""

from __future__ import annotations

import copy
import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_record
from ledger.conf import saga
from ledger.hashing import sha256_hex
from ledger.models import AgentKey, Tenant

KEY_PREFIX = "sk"


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


@transaction.atomic
def agent_key_create(
    *, tenant: Tenant, name: str, scopes: Iterable[str] = ("agent",), actor: Actor
) -> IssuedKey:
    """Issue a key. ``name`` is the agent (or automation) it is for: every key issued with the same
    name is the same agent — it owns the runs created under that name — so rotating a key is
    issuing a new one with the same name and revoking the old one when nothing uses it."""
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
    prefix = f"{KEY_PREFIX}_{secrets.token_hex(6)}"
    secret_part = secrets.token_urlsafe(32).replace("_", "-")
    key = AgentKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, key_hash=sha256_hex(secret_part), scopes=scope_list
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="agent_key.created",
        subject=key,
        data={"name": name, "scopes": scope_list},
    )
    return IssuedKey(key=key, secret=f"{prefix}_{secret_part}")


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
    key = AgentKey.objects.select_related("tenant").filter(prefix=prefix).first()
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
