"""Django's PostgreSQL backend (``ENGINE = "infra.postgresql"``), with one change: the health
check of a reused connection at the start of a request.

With ``CONN_HEALTH_CHECKS`` (on: a connection that PostgreSQL or a pooler closed between two
requests must not fail the next request), Django sends ``SELECT 1`` before each request's first
query. Every ledger write is one round trip (docs/API.md, "What a write costs"), so that check
doubled the round trips of every write in production, unseen by tests through Django's test client
(which skips the request signals that ask for the check).

Here the check first looks at the socket: an idle connection that the server closed has something
to read (its ``FATAL`` notice, the end of the stream), one that nobody closed has nothing. Nothing
to read → healthy, no round trip. Anything to read, a transaction left open, or a connection
psycopg already marked broken → Django's own ``SELECT 1`` decides, as before. A host that vanished
without closing its end looks healthy to both checks: the query after fails as it did.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def close_if_health_check_failed(self) -> None:
        # Django's own attributes, which its type stubs do not declare.
        enabled: bool = getattr(self, "health_check_enabled", False)
        done: bool = getattr(self, "health_check_done", True)
        if (
            self.connection is not None
            and enabled
            and not done
            and not self.pool
            and _idle_and_quiet(self.connection)
        ):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()


def _idle_and_quiet(connection: object) -> bool:
    """Open, outside any transaction, and with nothing from the server waiting to be read."""
    pgconn = getattr(connection, "pgconn", None)
    if pgconn is None or getattr(connection, "closed", True) or getattr(connection, "broken", True):
        return False
    if pgconn.status != pq.ConnStatus.OK or pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        readable, _, _ = select.select([pgconn.socket], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable
