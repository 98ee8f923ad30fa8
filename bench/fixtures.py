"""What the load tests need in the database before the clock starts: keys, a policy, runs.
Everything goes through the product's services, so the data is what real agents would leave."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

# The benchmark's tools: low risk, automatic approval, with a Python no-op compensator, so the
# append path is the common one (no approval gate) and unwinds exercise only the engine.
BENCH_POLICIES: dict[str, Any] = {
    "policies": [
        {
            "tool": "bench.*",
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
        },
        # The same, with two limits every record checks (limits are on the hot path): a count
        # per agent and a sum per tenant, both far out of reach, so each record pays the locks and
        # the count over its window and is never held back by them.
        {
            "tool": "bench.limited_*",
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "limits": [
                {"window": "1h", "per": "agent", "max_count": 1000000},
                {"window": "1h", "per": "tenant", "sum_arg": "n", "max_sum": 1000000000000},
            ],
        },
    ],
    "compensators": {"bench.undo": {"python": "bench.jobs.noop_compensator"}},
}


def load_bench_policies(log_dir: Path, *, compensators: dict[str, Any] | None = None) -> None:
    """Load the benchmark's policy file, with ``compensators`` beside ``bench.undo`` (e.g. the
    worker scale-out section's webhook: compensator URLs are the operator's configuration)."""
    from django.core.management import call_command

    policies = {**BENCH_POLICIES, "compensators": {**BENCH_POLICIES["compensators"], **(compensators or {})}}
    path = log_dir / "bench-policies.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(policies, indent=2))
    call_command("load_policies", str(path), verbosity=0, stdout=io.StringIO())


def agent_keys(*, tenant_slug: str, count: int) -> list[tuple[str, str]]:
    """One key per client, as each agent has its own: (key id, raw secret)."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=tenant_slug, name="Benchmark agents")
    out = []
    for i in range(count):
        issued = agent_key_create(
            tenant=tenant, name=f"bench-agent-{i}", scopes=["agent", "operator"], actor=Actor.system("bench")
        )
        out.append((issued.key.pk, issued.secret))
    return out


def fresh_runs(*, keys: list[tuple[str, str]], per_client: int) -> list[list[str]]:
    """``per_client`` new running runs for each key's client, created as its agent would."""
    from ledger.audit import Actor
    from ledger.models import AgentKey
    from ledger.services.runs import run_create

    out = []
    for key_id, _ in keys:
        key = AgentKey.objects.select_related("tenant").get(pk=key_id)
        actor = Actor.for_key(key)
        out.append(
            [
                run_create(
                    tenant=key.tenant, actor=actor, agent="bench-agent", request=f"benchmark run {i}"
                ).pk
                for i in range(per_client)
            ]
        )
    return out


def runs_with_checkpoint(*, keys: list[tuple[str, str]]) -> list[list[str]]:
    """One running run for each key's client, with one checkpoint: what the framework-floor GET
    (a run's checkpoints) and the heartbeat figures use."""
    from ledger.audit import Actor
    from ledger.models import AgentKey
    from ledger.services.checkpoints import checkpoint_write
    from ledger.services.runs import run_create

    out = []
    for key_id, _ in keys:
        key = AgentKey.objects.select_related("tenant").get(pk=key_id)
        actor = Actor.for_key(key)
        run = run_create(tenant=key.tenant, actor=actor, agent="bench-agent", request="benchmark floor")
        checkpoint_write(run=run, actor=actor, name="planned", state={"step": 1}, summary="benchmark")
        out.append([run.pk])
    return out
