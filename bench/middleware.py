"""Bench-only middleware (installed by ``bench.settings``, never by the product's settings)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse


class QueryCountMiddleware:
    """Counts the SQL statements a request runs and reports them in ``X-Bench-Queries`` (and their
    time in ``X-Bench-DB-ms``), so the harness reads query counts over HTTP from the very
    processes it times. ``execute_wrapper`` costs a function call per query, nothing more."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        stats = {"count": 0, "seconds": 0.0}

        def counter(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            stats["count"] += 1
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                stats["seconds"] += time.perf_counter() - started

        with connection.execute_wrapper(counter):
            response = self.get_response(request)
        response["X-Bench-Queries"] = str(stats["count"])
        response["X-Bench-DB-ms"] = f"{stats['seconds'] * 1000:.2f}"
        return response
