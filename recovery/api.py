"""The operator REST API (/recovery, /unwinds, /approvals)."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["recovery"])
