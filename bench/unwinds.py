"""Unwind throughput: runs whose every action has a no-op Python compensator, failed and then
compensated through the product's own services, carried out by the Procfile's worker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ledger.services.actions import moves

TENANT = "bench"


def _failed_run(*, steps: int, index: int, compensation_tool: str = "bench.undo", label: str = "") -> Any:
    """A run with ``steps`` succeeded actions, each registering ``compensation_tool``, failed and
    in the recovery queue: (run, item)."""
    from ledger.audit import Actor
    from ledger.models import AgentKey
    from ledger.services import runs
    from recovery.actions.approvals import action_record_gated
    from recovery.actions.reports import run_fail_and_queue

    key = AgentKey.objects.select_related("tenant").filter(tenant__slug=TENANT).first()
    if key is None:
        raise RuntimeError(f"No agent key in tenant {TENANT!r}; measure() creates one before any run.")
    actor = Actor.for_key(key)
    run = runs.run_create(
        tenant=key.tenant, actor=actor, agent="bench-unwind", request=f"unwind bench {label}{index}"
    )
    for n in range(steps):
        action = action_record_gated(
            run=run,
            actor=actor,
            tool="bench.update_record",
            idempotency_key=f"{run.pk}:{n}",
            target_type="record",
            target_id=f"{run.pk}-{n}",
            args={"n": n},
            compensation={"tool": compensation_tool, "args": {"n": n}},
        ).action
        moves.action_start(action=action, actor=actor)
        moves.action_succeed(action=action, actor=actor, result={"ok": True})
    outcome = run_fail_and_queue(run=run, actor=actor, error="benchmark failure")
    return run, outcome.item


def _start(item: Any, user: Any) -> Any:
    from ledger.audit import Actor
    from recovery.actions.compensations import unwind_start

    return unwind_start(item=item, actor=Actor.for_user(user), reason="benchmark")


def _wait(unwind_ids: list[str], timeout_s: float) -> dict[str, Any]:
    from recovery.models import Unwind

    finished = {Unwind.Status.COMPLETED, Unwind.Status.FAILED, Unwind.Status.CANCELLED}
    deadline = time.monotonic() + timeout_s
    done: dict[str, Any] = {}
    while len(done) < len(unwind_ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(done)}/{len(unwind_ids)} unwinds finished within {timeout_s}s")
        pending = [pk for pk in unwind_ids if pk not in done]
        for pk, status, fin in Unwind.objects.filter(pk__in=pending).values_list(
            "pk", "status", "finished_at"
        ):
            if status in finished:
                done[pk] = {"status": status, "observed": time.time(), "finished_at": fin}
        # The end is the engine's own finished_at, so the poll need not be fine; polling every
        # 10 ms took about a third of a core (this process and PostgreSQL) from the workers measured.
        time.sleep(0.2)
    return done


def _operator() -> Any:
    import io

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command(
        "create_staff",
        "bench-unwinder",
        password="Correct-Horse-Battery-7",
        tenant=TENANT,
        role="operator",
        stdout=io.StringIO(),
    )
    return get_user_model().objects.get(username="bench-unwinder")


def _measure(runs: list[Any], user: Any, timeout_s: float) -> dict[str, Any]:
    from recovery.models import UnwindStep

    started_wall = time.time()
    unwinds = [_start(item, user) for _, item in runs]
    ids = [u.pk for u in unwinds]
    done = _wait(ids, timeout_s)
    # The engine's own finished_at stamps the end; polling granularity does not count.
    ends = [d["finished_at"].timestamp() if d["finished_at"] else d["observed"] for d in done.values()]
    elapsed = max(ends) - started_wall
    steps = UnwindStep.objects.filter(unwind_id__in=ids)
    statuses: dict[str, int] = {}
    for status in steps.values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    total_steps = sum(statuses.values())
    return {
        "unwinds": len(ids),
        "steps": total_steps,
        "seconds": elapsed,
        "per_step_ms": elapsed / total_steps * 1000 if total_steps else 0.0,
        "steps_per_s": total_steps / elapsed if elapsed else 0.0,
        "unwind_statuses": sorted({d["status"] for d in done.values()}),
        "step_statuses": statuses,
        "per_unwind_s": sorted(e - started_wall for e in ends),
    }


def measure(*, steps: int, concurrent: int, log_dir: Path) -> dict[str, Any]:
    from bench import fixtures

    fixtures.load_bench_policies(log_dir)
    if not fixtures_have_key():
        fixtures.agent_keys(tenant_slug=TENANT, count=1)
    user = _operator()
    # Warm the worker (imports, first connections) with one short unwind that is not counted.
    warm = [_failed_run(steps=2, index=-1)]
    _measure(warm, user, timeout_s=120)
    single = _measure([_failed_run(steps=steps, index=0)], user, timeout_s=300)
    many = _measure([_failed_run(steps=steps, index=i + 1) for i in range(concurrent)], user, timeout_s=900)
    return {"single": single, "concurrent": many, "steps_per_unwind": steps}


def fixtures_have_key() -> bool:
    from ledger.models import AgentKey

    return AgentKey.objects.filter(tenant__slug=TENANT).exists()
