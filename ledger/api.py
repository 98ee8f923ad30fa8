"""The agent-facing REST API (runs, actions, checkpoints, commands, trail, policies)."""

from __future__ import annotations

from ninja import Router

router = Router(tags=["agents"])
