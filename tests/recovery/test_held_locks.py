"""The lock the archiver holds per tenant across its pass (infra.held_locks): one holder at a time,
free again when the holder is done or its connection goes, and a holder told when it has lost it.
Behind a real PgBouncer: tests/recovery/test_pooler.py."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from infra.held_locks import LockLost, held_lock

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_holder_at_a_time_and_free_once_it_is_done():
    with held_lock("tests:one") as first:
        assert first is not None
        with held_lock("tests:one") as second:
            assert second is None
        with held_lock("tests:another") as other:
            assert other is not None
        first.check()
    with held_lock("tests:one") as again:
        assert again is not None


def test_a_holder_whose_connection_was_ended_is_told_and_the_lock_is_free():
    with held_lock("tests:ended") as lock:
        assert lock is not None
        with connection.cursor() as cursor:
            # What a pooler's idle transaction timeout, or an operator, does to the lock's session.
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND objid = (hashtextextended('tests:ended', 0) & 4294967295)::bigint::oid"
            )
        with pytest.raises(LockLost, match="'tests:ended' was lost"):
            lock.check()
        with held_lock("tests:ended") as taken_over:
            assert taken_over is not None


def test_the_lock_connection_is_closed_on_the_way_out():
    with held_lock("tests:closed") as lock:
        assert lock is not None
        raw = lock._raw
    assert raw.closed
    with pytest.raises(psycopg.OperationalError):
        raw.execute("SELECT 1")
