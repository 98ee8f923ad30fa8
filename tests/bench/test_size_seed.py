"""The size benchmark's seeder (bench/size_seed.py) writes what the product would have written:
every audit chain it makes verifies as ``verify_audit`` checks it, every run's head is its chain's
last hash, and the rows agree with each other (counts, foreign keys). Its speed is `make bench`'s
business, not this test's."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from bench import size_seed
from ledger.audit import Actor, audit_heads_verify, audit_verify
from ledger.models import Action, Event, Run
from ledger.services.keys import agent_key_create, tenant_get_or_create
from recovery.models import Approval, RecoveryItem
from tests.support.processes import database_url_for_subprocesses

pytestmark = pytest.mark.django_db(transaction=True)


def _tenants() -> list[tuple[int, list[tuple[str, str]]]]:
    out = []
    for slug in ("acme", "globex"):
        tenant = tenant_get_or_create(slug=slug)
        keys = [
            (
                agent_key_create(
                    tenant=tenant, name=f"seed-{agent}", scopes=["agent"], actor=Actor.system("t")
                ).key.pk,
                agent,
            )
            for agent in size_seed.AGENTS[:3]
        ]
        out.append((tenant.pk, keys))
    return out


def test_seeded_chains_verify_and_rows_agree():
    spec = size_seed.Spec(
        actions=1500,
        days=30,
        open_items=20,
        pending_approvals=10,
        running=10,
        big_runs=(70,),
        workers=2,
        tenants=_tenants(),
    )
    connection.close()
    result = size_seed.seed(database_url_for_subprocesses(), spec, log=lambda _: None)
    counts = result["counts"]

    assert Run.objects.count() == counts["runs"] and Action.objects.count() == counts["actions"]
    assert Event.objects.filter(run__isnull=False).count() == counts["events"]
    assert RecoveryItem.objects.count() == counts["items"] and Approval.objects.count() == counts["approvals"]
    # Every chain links up and matches its hashes, and ends at its run's recorded head.
    checked, broken = audit_verify(events=Event.objects.filter(run__isnull=False))
    assert broken is None and checked == counts["events"]
    assert audit_heads_verify() == []
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert "Audit log intact" in out.getvalue()
    # The indexes dropped for the load are back, the unique constraint on an event's hash with them.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_constraint WHERE conname = 'ledger_event_hash_key'")
        assert cursor.fetchone() is not None
    # Rows agree: each run's action count, no action or event of a run that is not there, the big
    # run in the queue with its open item.
    mismatched = [r for r in Run.objects.all() if r.action_count != Action.objects.filter(run=r).count()]
    assert mismatched == []
    assert not Action.objects.exclude(run_id__in=Run.objects.values("pk")).exists()
    big = Run.objects.get(action_count=70)
    assert (
        big.status == "failed"
        and RecoveryItem.objects.filter(run=big, status__in=["open", "claimed"]).exists()
    )
    assert size_seed.check(sample=10)["ok"]
