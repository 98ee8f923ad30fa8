"""The Django admin: every model registered, the record read-only, the audit log untouchable,
keys revoked only through the service, and tenant admins scoped to their tenants."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.urls import reverse

from ledger.models import AgentKey, Event, Run
from recovery.models import RecoveryItem
from tests.factories import make_run, record

BIG_TABLES = [
    "run",
    "action",
    "checkpoint",
    "event",
    "idempotencyrecord",
    "recoveryitem",
    "unwind",
    "unwindstep",
    "approval",
    "agentcommand",
]


@pytest.fixture
def root(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", "correct-horse-battery")


@pytest.fixture
def root_client(client, root):
    client.force_login(root)
    return client


@pytest.fixture
def acme_run(tenant, agent):
    run = make_run(tenant, agent)
    record(run, agent, "k1")
    RecoveryItem.objects.create(tenant=tenant, run=run, reason="failed")
    return run


def _url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_it_registers_every_ledger_and_recovery_model():
    for label in ("ledger", "recovery", "audit_stream", "bulk"):
        for model in apps.get_app_config(label).get_models():
            assert admin.site.is_registered(model), model


@pytest.mark.parametrize("model_name", BIG_TABLES)
def test_it_skips_the_full_count_on_big_tables(model_name):
    model = next(m for m in admin.site._registry if m._meta.model_name == model_name)
    assert admin.site._registry[model].show_full_result_count is False


def test_it_renders_every_changelist_and_change_page(root_client, acme_run, agent_key):
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("ledger", "recovery", "bulk"):
            continue
        assert root_client.get(_url(model, "changelist")).status_code == 200, model
        obj = model_admin.get_queryset(_request_as("root")).first()
        if obj is not None:
            assert root_client.get(_url(model, "change", obj.pk)).status_code == 200, model


def _request_as(username: str):
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = get_user_model().objects.get(username=username)
    return request


def test_it_keeps_the_audit_log_read_only(root_client, acme_run):
    event = Event.objects.filter(run=acme_run).first()
    assert root_client.get(_url(Event, "add")).status_code == 403
    page = root_client.get(_url(Event, "change", event.pk))
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert root_client.post(_url(Event, "change", event.pk), {"reason": "rewritten"}).status_code == 403
    assert root_client.post(_url(Event, "delete", event.pk), {"post": "yes"}).status_code == 403
    assert Event.objects.get(pk=event.pk).reason == event.reason


def test_it_never_shows_a_keys_hash_and_never_creates_keys(root_client, agent_key):
    key, _ = agent_key
    page = root_client.get(_url(AgentKey, "change", key.pk))
    assert page.status_code == 200
    assert key.key_hash.encode() not in page.content
    assert root_client.get(_url(AgentKey, "add")).status_code == 403
    assert root_client.post(_url(AgentKey, "change", key.pk), {"name": "renamed"}).status_code == 403


def test_it_revokes_selected_keys_through_the_service(root_client, agent_key, operator_key):
    from ledger.services.keys import agent_key_authenticate

    keys = [agent_key, operator_key]
    response = root_client.post(
        _url(AgentKey, "changelist"),
        {
            "action": "revoke_keys",
            "_selected_action": [k.pk for k, _ in keys],
        },
    )
    assert response.status_code == 302
    for key, raw in keys:
        assert AgentKey.objects.get(pk=key.pk).revoked_at is not None
        assert agent_key_authenticate(raw_key=raw) is None
        assert Event.objects.filter(kind="agent_key.revoked", subject_id=key.pk, actor_label="root").exists()


def test_it_refuses_state_edits_to_the_record(root_client, acme_run):
    assert root_client.get(_url(Run, "add")).status_code == 403
    assert root_client.post(_url(Run, "change", acme_run.pk), {"status": "succeeded"}).status_code == 403
    assert Run.objects.get(pk=acme_run.pk).status == "running"


def test_it_shows_a_tenant_admin_only_their_tenants(
    client, tenant, other_tenant, agent, outsider_key, acme_run
):
    from ledger.audit import Actor
    from ledger.staff import staff_set

    theirs = make_run(other_tenant, Actor.for_key(outsider_key[0]))
    dave = staff_set(
        username="dave",
        password="correct-horse-battery",
        tenant=tenant,
        role="admin",
        actor=Actor.system("tests"),
    ).user
    client.force_login(dave)
    listing = client.get(_url(Run, "changelist"))
    assert listing.status_code == 200
    assert acme_run.pk.encode() in listing.content and theirs.pk.encode() not in listing.content
    assert client.get(_url(Run, "change", theirs.pk)).status_code == 302  # "does not exist" → admin index
    assert b"globex" not in client.get(_url(Run, "changelist")).content
    # Revoking a key of another tenant is impossible: it is not in the admin's queryset.
    outsider = outsider_key[0]
    client.post(_url(AgentKey, "changelist"), {"action": "revoke_keys", "_selected_action": [outsider.pk]})
    assert AgentKey.objects.get(pk=outsider.pk).revoked_at is None


def test_it_keeps_non_admin_staff_out(client, alice):
    client.force_login(alice)
    assert client.get(reverse("admin:index")).status_code == 302
