"""The web process's gunicorn configuration (the Procfile's ``-c python:saga_admin.gunicorn``):
each start of the web removes the Prometheus multiprocess files (``infra.metrics``) of processes
that are gone, and gunicorn's own lines — the access log and its error log — are JSON lines like
the application's (``JsonLogger``).

There is no ``child_exit`` hook: prometheus-client's ``mark_process_dead`` removes only the files
of live gauges (``livesum``, ``liveall`` …), and no process keeps one (every gauge is read from
PostgreSQL and Redis at scrape time). The files of an exited worker's counters and histograms must
stay: removing them would make the deployment's counters go backwards.

Besides the logger class, only hooks: every setting stays on the Procfile's command line, where
operators look for it.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from gunicorn.glogging import Logger

from saga_admin.logs import redact_query, redact_text


def _line(*, level: str, logger: str, event: str, **fields: Any) -> str:
    return json.dumps(
        {
            "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "level": level,
            "logger": logger,
            "event": event,
            **fields,
        },
        ensure_ascii=False,
        default=str,
    )


class _JsonErrorFormatter(logging.Formatter):
    """gunicorn's error log ("Booting worker", "Worker timeout") as one JSON object a line."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        if record.exc_info:
            fields["exception"] = redact_text(self.formatException(record.exc_info))
        return _line(
            level=record.levelname.lower(),
            logger=record.name,
            event=redact_text(record.getMessage()),
            pid=record.process,
            **fields,
        )


class JsonLogger(Logger):  # type: ignore[misc]  # gunicorn ships no type hints
    """One JSON object per request on the access log (``--access-logfile``): ``method``, ``path``,
    ``query`` (secrets redacted: ``redact_query``, the OIDC callback's ``code`` and ``state`` among
    them), ``status``, ``bytes``, ``duration_ms``, ``remote_addr``,
    ``user_agent``, ``request_id`` (the one the application answered with, ``X-Request-Id``) and
    ``pid``; gunicorn's error log as JSON lines too."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            if getattr(handler, "_gunicorn", False):
                handler.setFormatter(_JsonErrorFormatter())

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        if not self.access_log_enabled:
            return
        try:
            status = resp.status.split(None, 1)[0] if isinstance(resp.status, str) else resp.status
            headers = dict((name.lower(), value) for name, value in (resp.headers or []))
            self.access_log.info(
                _line(
                    level="info",
                    logger="gunicorn.access",
                    event="request",
                    method=environ.get("REQUEST_METHOD", ""),
                    path=redact_text(environ.get("PATH_INFO", "")),
                    query=redact_query(environ.get("QUERY_STRING", "")),
                    status=int(status),
                    bytes=getattr(resp, "sent", None) or 0,
                    duration_ms=round(request_time.total_seconds() * 1000, 3),
                    remote_addr=environ.get("REMOTE_ADDR", ""),
                    user_agent=redact_text(environ.get("HTTP_USER_AGENT", "")),
                    request_id=headers.get("x-request-id", ""),
                    pid=os.getpid(),
                )
            )
        except Exception:
            self.error_log.exception("access log line failed")


logger_class = JsonLogger


def on_starting(server: Any) -> None:
    """In the master, before any worker is forked: a new deployment's counters start from zero
    (Prometheus's ``rate()`` and ``increase()`` take the reset in their stride)."""
    from infra import metrics

    removed = metrics.forget_dead_processes()
    server.log.info(
        f"metrics: {removed} file(s) of earlier processes removed from {metrics.MULTIPROCESS_DIR}"
    )
