"""A ``statement_timeout`` for every statement of one thread's connection, set per transaction.

``SET statement_timeout`` on the session is what a pooled connection must not carry: behind
PgBouncer's transaction pooling it stays on the server connection, which the next transaction of
any client is handed (bounding that client's statements instead), while this thread's next
statement runs on another server connection, unbounded. Here each transaction sets it ``LOCAL``:
before its first statement, and a statement run in autocommit becomes a transaction of its own to
carry it. Installed with ``connection.execute_wrapper(StatementBound(ms))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from psycopg import pq


class StatementBound:
    def __init__(self, timeout_ms: int) -> None:
        self._sql = f"SET LOCAL statement_timeout = {int(timeout_ms)}"

    def _set(self, raw: Any) -> None:
        # On the driver's cursor, past the execute wrappers (this one included).
        with raw.cursor() as cursor:
            cursor.execute(self._sql)

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        wrapper = context["connection"]
        if wrapper.in_atomic_block:
            raw = wrapper.connection
            # psycopg opens the transaction with its first statement: still idle, this is it.
            if raw.info.transaction_status == pq.TransactionStatus.IDLE:
                self._set(raw)
            return execute(sql, params, many, context)
        with transaction.atomic(using=wrapper.alias):
            self._set(wrapper.connection)
            return execute(sql, params, many, context)
