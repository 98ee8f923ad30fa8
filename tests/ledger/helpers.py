"""Small builders for ledger tests: a run, an action in a given state, and the assertion that a
refused transition changed nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from ledger import errors, services
from ledger.models import Action, Event, Run, ToolPolicy


def make_run(tenant, actor, **fields: Any) -> Run:
    return services.run_create(
        tenant=tenant, actor=actor, agent="onboarding", request="Onboard Ashu Kumar", **fields
    )


def auto_policy(
    tool: str = "hr.*", *, tenant=None, action_class: str = "internal_update", **fields: Any
) -> ToolPolicy:
    """A low-risk, auto-approved policy, so actions can start without an approval."""
    values = {
        "risk": "low",
        "approval": "auto",
        "action_class": action_class,
        "compensation": "custom",
        **fields,
    }
    return ToolPolicy.objects.create(tenant=tenant, tool=tool, **values)


def record(run: Run, actor, key: str, *, tool: str = "hr.create_user", **fields: Any) -> Action:
    fields.setdefault("args", {"email": f"{key}@company.com"})
    return services.action_record(run=run, actor=actor, tool=tool, idempotency_key=key, **fields).action


def force_status(obj: Action | Run, status: str) -> Action | Run:
    """Test setup only: put a row straight into ``status`` (bypassing the services) so that every
    refused transition can be tried from every state."""
    type(obj).objects.filter(pk=obj.pk).update(status=status)
    obj.refresh_from_db()
    return obj


@contextlib.contextmanager
def refused(
    obj: Action | Run, *, current: str, error: type[errors.SagaError] = errors.InvalidTransition
) -> Iterator[None]:
    """Expect the block to raise ``error`` naming ``current``, and to change nothing: the row is
    identical and no audit event was written."""
    model = type(obj)
    before = model.objects.filter(pk=obj.pk).values().get()
    events_before = Event.objects.count()
    with pytest.raises(error) as excinfo:
        yield
    if isinstance(excinfo.value, errors.InvalidTransition):
        assert excinfo.value.current == current
        assert excinfo.value.details["current"] == current
    assert excinfo.value.details.get("current", current) == current
    assert model.objects.filter(pk=obj.pk).values().get() == before
    assert Event.objects.count() == events_before
