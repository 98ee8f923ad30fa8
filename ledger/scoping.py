"""Tenant scoping: the one vocabulary for "what may this caller see", and the one place of its rules.

A ``Reach`` is who is asking, reduced to what narrows a query: the tenants they may see and, when
only one agent's runs are theirs, that agent (``owner``). It is made in one of three ways:

- ``Reach.of_key(key, write=...)``: an API key. Its tenant, and the owner rule: a run belongs to
  the agent whose key created it (``Run.owner``, the key's name; every key issued with that name
  is the same agent, so a rotated key keeps access and older keys keep it until revoked). An
  ``agent`` key reaches only its agent's runs; a key with the ``operator`` scope *reads* every
  run of its tenant, but writes as an agent (actions, checkpoints, heartbeats, complete, fail,
  command acks) reach its own agent's runs only.
- ``Reach.of_tenants(tenants)``: tenants alone, no owner: a dashboard user's memberships
  (``dashboard.permissions.reach_for``; a superuser too sees only the tenants they are a member
  of), or an operator key's tenant for what has no agent of its own (items, unwinds, steps,
  approvals, bulk decisions, checkpoints).
- ``Reach.of_reference(run)``: the tenant and owner a run reference carries
  (``ledger.selectors.run_reference_for_write``), for a service that locks or writes the row
  itself.

What a reach narrows, given where a model keeps its tenant (``tenant_field``) and, for what
belongs to a run, its run's owner (``owner_field``: ``"owner"`` on a run, ``"run__owner"``
through one): ``reach.q()`` a filter, ``reach.filter(queryset)`` a queryset, ``reach.get`` one
object or ``infra.errors.NotFound`` (the API's 404), ``reach.first`` one object or None (the
dashboard answers 404 or 410 itself); ``reach.owner`` is the rule as a value, for a
one-statement SQL read (``saga_admin.api.reads``). Out of reach is not found, exactly as an unknown id:
never 403, so another tenant's or another agent's object does not leak that it exists. A reach
with an owner narrowing a model without ``owner_field`` is a programming error, refused (it would
otherwise widen an agent's reach to its whole tenant).

``Tenants`` is the shape list reads take for "the tenants to show" (a tenant, tenants or their
ids), ``tenant_ids`` its ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from django.db.models import Manager, Model, Q, QuerySet

from infra import errors
from ledger.models import Action, AgentKey, Run, Tenant

M = TypeVar("M", bound=Model)

Tenants = Tenant | Iterable[Tenant] | Iterable[int]


def tenant_ids(tenants: Tenants) -> list[int]:
    if isinstance(tenants, Tenant):
        return [tenants.pk]
    return [t.pk if isinstance(t, Tenant) else t for t in tenants]


@dataclass(frozen=True)
class Reach:
    """What one caller may see: ``tenant_ids`` and, when not None, only ``owner``'s runs."""

    tenant_ids: tuple[int, ...]
    owner: str | None = None

    @classmethod
    def of_tenants(cls, tenants: Tenants) -> Reach:
        return cls(tuple(tenant_ids(tenants)))

    @classmethod
    def of_key(cls, key: AgentKey, *, write: bool = False) -> Reach:
        """The key's tenant, and the owner rule (the module's docstring): its own agent's runs,
        unless it has the ``operator`` scope and only reads."""
        if write or AgentKey.Scope.OPERATOR not in key.scopes:
            return cls((key.tenant_id,), owner=key.name)
        return cls((key.tenant_id,))

    @classmethod
    def of_reference(cls, ref: Run | Action) -> Reach:
        """The reference's tenant and, when it carries one (built for an agent's key), its owner."""
        return cls((ref.tenant_id,), owner=ref.owner or None)

    def q(self, *, tenant_field: str = "tenant_id", owner_field: str | None = None) -> Q:
        scoped = Q(**{f"{tenant_field}__in": self.tenant_ids})
        if self.owner is None:
            return scoped
        if owner_field is None:
            raise ValueError("An owner's reach narrows only what names its run's owner (owner_field).")
        return scoped & Q(**{owner_field: self.owner})

    def filter(
        self,
        queryset: QuerySet[M] | Manager[M],
        pk: str | int | None = None,
        *,
        tenant_field: str = "tenant_id",
        owner_field: str | None = None,
    ) -> QuerySet[M]:
        scoped = queryset.filter(self.q(tenant_field=tenant_field, owner_field=owner_field))
        return scoped if pk is None else scoped.filter(pk=pk)

    def first(
        self,
        queryset: QuerySet[M] | Manager[M],
        pk: str | int,
        *,
        tenant_field: str = "tenant_id",
        owner_field: str | None = None,
    ) -> M | None:
        return self.filter(queryset, pk, tenant_field=tenant_field, owner_field=owner_field).first()

    def get(
        self,
        queryset: QuerySet[M] | Manager[M],
        pk: str | int,
        *,
        tenant_field: str = "tenant_id",
        owner_field: str | None = None,
    ) -> M:
        obj = self.first(queryset, pk, tenant_field=tenant_field, owner_field=owner_field)
        if obj is None:
            raise errors.NotFound.for_id(queryset.model.__name__, str(pk))
        return obj
