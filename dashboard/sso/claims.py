"""A claim's values → the tenants and roles they grant: ``saga:acme:approver`` is the role
``approver`` in tenant ``acme`` (prefix ``SAGA_OIDC_ROLE_PREFIX``, default ``saga``).

Read as hostile input (an identity provider's group names are typed by people, and a group claim
also carries every other group the person is in): a value that is not ours (another prefix) is
passed over; one of ours that does not parse (not three parts, a tenant slug a tenant cannot have,
an unknown role, too long, not a string) is ignored with a log line; a claim that is neither a
list nor a string grants nothing. Several roles for one tenant: the one latest in
viewer, operator, approver, admin (one role per tenant, as ``Membership`` holds).
"""

from __future__ import annotations

import structlog
from django.core.exceptions import ValidationError

from ledger.models import Membership, Tenant

log = structlog.get_logger(__name__)

# A value longer than this is not a group name we wrote; it is not parsed (nor logged whole).
MAX_VALUE_CHARS = 200
# Values read from one claim; a person in more groups than this has the first ones read.
MAX_VALUES = 1000
# A tenant's slug is what ledger.Tenant's own field accepts (its validators: letters, digits, -
# and _, at most its max_length), so a claim can name every tenant there is and nothing else.
_TENANT_SLUG_FIELD = Tenant._meta.get_field("slug")
# Several roles claimed for one tenant: the latest in Membership.Role's order (least to most).
ROLE_ORDER: list[str] = list(Membership.Role)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def roles_from_claim(value: object, *, prefix: str, claim: str = "groups") -> dict[str, str]:
    """tenant slug → role, from the claim's value as the provider sent it (``None``: absent)."""
    if value is None:
        return {}
    if isinstance(value, str):
        values: list[object] = [value]
    elif isinstance(value, list):
        values = value
    else:
        log.warning("sso.claim_ignored", claim=claim, reason=f"not a list but {type(value).__name__}")
        return {}
    if len(values) > MAX_VALUES:
        log.warning("sso.claim_truncated", claim=claim, values=len(values), read=MAX_VALUES)
        values = values[:MAX_VALUES]
    wanted: dict[str, str] = {}
    for item in values:
        parsed = _parse(item, prefix=prefix, claim=claim)
        if parsed is None:
            continue
        slug, role = parsed
        previous = wanted.get(slug)
        if previous is not None and previous != role:
            log.warning("sso.claim_roles_conflict", claim=claim, tenant=slug, roles=sorted({previous, role}))
            role = max(previous, role, key=ROLE_ORDER.index)
        wanted[slug] = role
    return wanted


def _is_tenant_slug(value: str) -> bool:
    if not value:  # Django's validators pass over an empty value; a slug is never empty
        return False
    try:
        _TENANT_SLUG_FIELD.run_validators(value)
    except ValidationError:
        return False
    return True


def _parse(item: object, *, prefix: str, claim: str) -> tuple[str, str] | None:
    if not isinstance(item, str):
        log.warning("sso.claim_value_ignored", claim=claim, reason=f"not a string but {type(item).__name__}")
        return None
    if len(item) > MAX_VALUE_CHARS:
        if item.startswith(prefix + ":"):
            log.warning("sso.claim_value_ignored", claim=claim, reason=f"longer than {MAX_VALUE_CHARS}")
        return None
    parts = item.split(":")
    if parts[0] != prefix:
        return None  # another application's group: not ours to read
    if len(parts) != 3:
        log.warning(
            "sso.claim_value_ignored", claim=claim, value=_shown(item), reason="not prefix:tenant:role"
        )
        return None
    _, slug, role = parts
    if not _is_tenant_slug(slug):
        log.warning("sso.claim_value_ignored", claim=claim, value=_shown(item), reason="not a tenant slug")
        return None
    if role not in Membership.Role.values:
        log.warning(
            "sso.claim_value_ignored",
            claim=claim,
            value=_shown(item),
            reason=f"unknown role (one of {', '.join(Membership.Role.values)})",
        )
        return None
    return slug, role
