"""The bulk preview is bounded. It runs in the web request, and its
``needs_approval`` walked every action of every matching run: a filter over thousands of long runs
held a web thread (and the database) for as long as that took. The preview now walks at most
``PREVIEW_RUNS`` runs and ``PREVIEW_ACTIONS`` actions (saying when it stopped short), and its
statements run under ``PREVIEW_TIMEOUT_MS``: past it, 503 ``preview_timeout``, not a held thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from django.db import connection
from django.db.models.signals import post_init

from ledger.models import Action
from recovery.actions import bulk_filter
from recovery.selectors import QueueFilter
from tests.factories import auto_policy
from tests.recovery.bulk_support import crm_policies, failing_runs

RUNS = 5


def _approval_needed() -> None:
    crm_policies()
    auto_policy("crm.restore", approval="manual", compensation="none")


@pytest.mark.django_db
def test_the_preview_walks_at_most_its_cap_of_actions(tenant, agent, monkeypatch):
    _approval_needed()
    failing_runs(tenant, agent, RUNS, undoable=True)  # two actions a run
    monkeypatch.setattr(bulk_filter, "PREVIEW_RUNS", 2, raising=False)
    monkeypatch.setattr(bulk_filter, "PREVIEW_ACTIONS", 3, raising=False)
    loaded: list[object] = []

    def count(sender: type, instance: object, **kwargs: object) -> None:
        loaded.append(instance)

    post_init.connect(count, sender=Action)
    try:
        preview = bulk_filter.bulk_preview(
            tenant=tenant, queue_filter=QueueFilter(tool="crm.update_*"), action="compensate"
        )
    finally:
        post_init.disconnect(count, sender=Action)
    # Every run still counted, but only the cap's actions walked, and the count said to be partial.
    assert preview.count == RUNS
    assert len(loaded) <= 3 + bulk_filter.SAMPLE_SIZE  # the cap, and the sample's failed actions
    walked = [a for a in loaded if getattr(a, "action_class", None) is not None]
    assert len({a.run_id for a in walked if a.tool == "crm.create_note"}) <= 2
    assert 1 <= preview.needs_approval <= 2 and preview.needs_approval_capped is True


@pytest.mark.django_db
def test_an_uncapped_preview_says_so(tenant, agent):
    _approval_needed()
    failing_runs(tenant, agent, 2, undoable=True)
    preview = bulk_filter.bulk_preview(
        tenant=tenant, queue_filter=QueueFilter(tool="crm.update_*"), action="compensate"
    )
    assert (preview.needs_approval, preview.needs_approval_capped) == (2, False)


@contextlib.contextmanager
def _table_locked() -> Iterator[None]:
    """Another session holding ``ledger_action`` exclusively (a long migration, a stuck VACUUM
    FULL, or simply a preview's statement that takes minutes): every read of it waits."""
    settings = connection.settings_dict
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with (
            psycopg.connect(
                host=settings["HOST"], port=settings["PORT"], user=settings["USER"], dbname=settings["NAME"]
            ) as other,
            other.transaction(),
        ):
            other.execute("LOCK TABLE ledger_action IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_preview_that_cannot_finish_is_cut_off_with_503(
    live_server, operator_key, tenant, agent, monkeypatch
):
    _approval_needed()
    failing_runs(tenant, agent, 2, undoable=True)
    monkeypatch.setattr(bulk_filter, "PREVIEW_TIMEOUT_MS", 500, raising=False)
    with (
        httpx.Client(
            base_url=f"{live_server.url}/api/v1",
            headers={"Authorization": f"Bearer {operator_key[1]}"},
            timeout=30,
        ) as client,
        _table_locked(),
    ):
        response = client.post(
            "/recovery/bulk",
            json={
                "filter": {"tool": "crm.update_*"},
                "action": "compensate",
                "reason": "upstream broke",
                "preview": True,
            },
        )
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "preview_timeout" and "narrow the filter" in error["message"]
    assert error["details"] == {"timeout_ms": 500}
