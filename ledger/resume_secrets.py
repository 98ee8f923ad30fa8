"""Whose commands a run's pushes are, and the key each agent's are signed with: one agent's own
secret (per tenant and agent name) for the commands pushed to it (``recovery.notifications
.command_push``; ``manage.py resume_secret`` prints it for the agent's operator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.conf import saga
from infra.signing import derive_secret

if TYPE_CHECKING:
    from ledger.models import Run, Tenant


def resume_secret(tenant: Tenant, agent: str) -> str:
    """The key that signs the commands pushed to one agent — ``agent`` is the agent's name (the
    name of the key that created the run) in ``tenant``: HMAC-SHA256 of ``resume:<slug>:<agent>``
    under ``SAGA_RESUME_WEBHOOK_SECRET``. Each agent verifies with a secret of its own, so no agent
    can sign a command another agent would accept (of its own tenant or another: a slug has no
    ``:``, so no two (tenant, agent) pairs share a context). Empty when no master is set (commands
    are then pushed unsigned)."""
    master = saga().resume_webhook_secret
    return derive_secret(master, resume_secret_context(tenant.slug, agent)) if master else ""


def resume_secret_context(tenant_slug: str, agent: str) -> str:
    """The derivation context of one agent's resume secret (see ``resume_secret``)."""
    return f"resume:{tenant_slug}:{agent}"


def run_agent(run: Run) -> str:
    """The agent a run's commands are for: the authenticated agent that created it (its key's
    name), or, for a run created without a key, the agent it declared."""
    return run.owner or run.agent
