"""The one keyset paginator: pages in a total order, and a cursor it did not hand out never
reaches the database (the API refuses it, the dashboard shows the first page)."""

from __future__ import annotations

import base64
import json

import pytest

from infra import errors
from infra.pagination import MAX_CURSOR_LENGTH, NEWEST_FIRST, keyset_page
from ledger.models import Run
from tests.factories import make_run

FORGED = [
    "not-a-cursor",
    base64.urlsafe_b64encode(b"[" * 5000).decode(),  # deeper than json's stack
    base64.urlsafe_b64encode(b"[" * 200 + b"]" * 200).decode(),  # nested, but a list of one
    base64.urlsafe_b64encode(
        json.dumps(["2026-13-45T00:00:00", "run_01m80000000000000000000000"]).encode()
    ).decode(),
    base64.urlsafe_b64encode(json.dumps(["2026-11-22T00:00:00+00:00", "run_\u0000"]).encode()).decode(),
    "A" * (MAX_CURSOR_LENGTH + 1),
]


@pytest.fixture
def five_runs(tenant, agent):
    return [make_run(tenant, agent, external_id=f"job-{n}") for n in range(5)]


def test_it_walks_every_row_once_newest_first(five_runs):
    seen, cursor = [], None
    while True:
        page = keyset_page(Run.objects.all(), keys=NEWEST_FIRST, cursor=cursor, limit=2)
        seen += [run.pk for run in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [run.pk for run in sorted(five_runs, key=lambda r: (r.created_at, r.pk), reverse=True)]


@pytest.mark.parametrize("cursor", FORGED, ids=range(len(FORGED)))
def test_the_api_refuses_a_cursor_it_did_not_hand_out(five_runs, cursor):
    with pytest.raises(errors.ValidationFailed) as refused:
        keyset_page(Run.objects.all(), keys=NEWEST_FIRST, cursor=cursor, limit=2)
    assert refused.value.details == {"cursor": "invalid"}


@pytest.mark.parametrize("cursor", FORGED, ids=range(len(FORGED)))
def test_the_dashboard_shows_the_first_page_for_it(five_runs, cursor):
    first = keyset_page(Run.objects.all(), keys=NEWEST_FIRST, cursor=None, limit=2)
    assert keyset_page(Run.objects.all(), keys=NEWEST_FIRST, cursor=cursor, limit=2, strict=False) == first


def test_the_runs_of_several_tenants_page_as_one_list_a_tenant_at_a_time(tenant, other_tenant, agent):
    """runs_page reads a page per tenant and merges them (``merged_keyset_page``): every run of
    both tenants once, newest first, however their runs interleave, with same-instant runs in id
    order; and a tenant outside the list is never read."""
    from datetime import timedelta

    from django.utils import timezone

    from ledger.models import Tenant
    from ledger.run_filter import RunFilter, runs_page

    stranger = Tenant.objects.create(slug="initech", name="Initech")
    base = timezone.now() - timedelta(hours=1)
    made = []
    for n, owner in enumerate([tenant, other_tenant, other_tenant, tenant, stranger, tenant, other_tenant]):
        run = make_run(owner, agent, external_id=f"job-{n}")
        # Two pairs share their instant: the id breaks the tie, across tenants too.
        Run.objects.filter(pk=run.pk).update(created_at=base + timedelta(seconds=n // 2))
        made.append(run)
    expected = [
        run.pk
        for run in sorted(
            (r for r in Run.objects.filter(pk__in=[r.pk for r in made]) if r.tenant_id != stranger.pk),
            key=lambda r: (r.created_at, r.pk),
            reverse=True,
        )
    ]
    seen, cursor = [], None
    while True:
        page, _exact = runs_page(
            tenants=[tenant, other_tenant], run_filter=RunFilter(), cursor=cursor, limit=2
        )
        assert len(page.items) <= 2
        seen += [run.pk for run in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == expected
