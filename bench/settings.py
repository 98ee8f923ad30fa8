"""The product's settings plus the bench-only query counter. Used for the dashboard pages only:
the ledger-append measurement runs the product's own settings module untouched."""

from __future__ import annotations

from saga_admin.settings import *  # noqa: F403
from saga_admin.settings import MIDDLEWARE

# Outermost, so every query of the request (sessions, auth, the view) is counted.
MIDDLEWARE = ["bench.middleware.QueryCountMiddleware", *MIDDLEWARE]
