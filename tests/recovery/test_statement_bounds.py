"""The ticker's statement timeout, set per transaction (infra.statement_bounds): a statement in
autocommit and every statement of a transaction run under it, and the session keeps none of it
(behind transaction pooling, the next client would inherit it)."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from infra.statement_bounds import StatementBound


def _timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_each_transaction_carries_the_timeout_and_the_session_none():
    with connection.execute_wrapper(StatementBound(1234)):
        assert _timeout() == "1234ms"  # autocommit: a transaction of its own
        with transaction.atomic():
            assert _timeout() == "1234ms"
            assert _timeout() == "1234ms"
        with (
            pytest.raises(Exception, match="statement timeout"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute("SELECT pg_sleep(5)")
    assert _timeout() == "0"
