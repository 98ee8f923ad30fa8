"""``make bench``'s unwind phase: runs whose every action has a no-op Python compensator, failed and
then compensated through the product's own services, carried out by the Procfile's worker (and by
each candidate worker). ``failed_run``, ``start_unwind``, ``wait_finished`` and ``operator`` serve
the workers' scale-out (bench/scale.py) too."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import fixtures
from bench.harness import CANDIDATES
from bench.stats import log
from bench.tables import fmt, ratio_of

if TYPE_CHECKING:
    from bench.harness import Harness

TENANT = "bench"


def failed_run(*, steps: int, index: int, compensation_tool: str = "bench.undo", label: str = "") -> Any:
    """A run with ``steps`` succeeded actions, each registering ``compensation_tool``, failed and
    in the recovery queue: (run, item)."""
    from ledger.audit import Actor
    from ledger.models import AgentKey
    from ledger.services import runs
    from ledger.services.actions import moves
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


def start_unwind(item: Any, user: Any) -> Any:
    from ledger.audit import Actor
    from recovery.actions.compensations import unwind_start

    return unwind_start(item=item, actor=Actor.for_user(user), reason="benchmark")


def wait_finished(unwind_ids: list[str], timeout_s: float) -> dict[str, Any]:
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


def operator() -> Any:
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
    unwinds = [start_unwind(item, user) for _, item in runs]
    ids = [u.pk for u in unwinds]
    done = wait_finished(ids, timeout_s)
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
    fixtures.load_bench_policies(log_dir)
    if not fixtures_have_key():
        fixtures.agent_keys(tenant_slug=TENANT, count=1)
    user = operator()
    # Warm the worker (imports, first connections) with one short unwind that is not counted.
    warm = [failed_run(steps=2, index=-1)]
    _measure(warm, user, timeout_s=120)
    single = _measure([failed_run(steps=steps, index=0)], user, timeout_s=300)
    many = _measure([failed_run(steps=steps, index=i + 1) for i in range(concurrent)], user, timeout_s=900)
    return {"single": single, "concurrent": many, "steps_per_unwind": steps}


def fixtures_have_key() -> bool:
    from ledger.models import AgentKey

    return AgentKey.objects.filter(tenant__slug=TENANT).exists()


# --- The phase ------------------------------------------------------------------------------


def phase(h: Harness) -> None:
    s = h.section("unwind")
    candidates = list(CANDIDATES)
    for candidate in (None, *candidates):
        log(
            f"unwinds on the {candidate or 'Procfile'} worker: 1 x {h.sizes.unwind_steps} steps, "
            f"then {h.sizes.concurrent_unwinds} concurrent"
        )
        worker = h.start_worker(candidate)
        try:
            measured = measure(
                steps=h.sizes.unwind_steps,
                concurrent=h.sizes.concurrent_unwinds,
                log_dir=h.log_dir,
            )
        finally:
            worker.stop()
        if candidate:
            s.setdefault("candidates", {})[candidate] = measured
        else:
            s.update(measured)


# --- The report -----------------------------------------------------------------------------


def rows(unwind: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    sources = [(unwind, "L3_chain", "Procfile worker")]
    for name, measured in unwind.get("candidates", {}).items():
        # Compared with the L3 no-op job of the same worker class (the candidate worker's).
        sources.append((measured, "L3_chain_candidate", f"candidate {name}"))
    for source, chain_key, who in sources:
        chain = base.get(chain_key, {}).get("per_job_ms")
        for key, label in (
            ("single", "unwind: 1 x {n} steps"),
            ("concurrent", "unwind: {c} concurrent x {n} steps"),
        ):
            u = source.get(key)
            if u:
                ratio = ratio_of(u["per_step_ms"], chain)
                rows.append(
                    [
                        label.format(n=source.get("steps_per_unwind"), c=u["unwinds"]) + f" ({who})",
                        "1 worker",
                        fmt(u["steps_per_s"]) + " steps",
                        fmt(u["per_step_ms"], 2) + " /step",
                        fmt(u["seconds"], 2) + " s total",
                        "–",
                        "–",
                        f"{ratio:.2f}x L3 chained job" if ratio else "–",
                    ]
                )
    return rows


def targets(sec: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    unwind = sec.get("unwind", {})
    chain = base.get("L3_chain", {}).get("per_job_ms")
    single = unwind.get("single")
    if single and chain:
        out.append(
            (
                "unwind step overhead ≤ 2× an L3 no-op job (chained, same worker)",
                f"{single['per_step_ms']:.1f} ms/step vs {chain:.1f} ms/job = {single['per_step_ms'] / chain:.2f}x",
                single["per_step_ms"] <= 2 * chain,
            )
        )
        n = unwind.get("steps_per_unwind")
        out.append(
            (
                f"a {n}-step no-op unwind completes in < 2 s",
                f"{single['seconds']:.2f} s",
                single["seconds"] < 2.0 and single["unwind_statuses"] == ["completed"],
            )
        )
    else:
        out.append(("unwind step overhead ≤ 2× L3; 50-step unwind < 2 s", "not measured", None))
    return out


def markdown(sec: dict[str, Any], base: dict[str, Any]) -> list[str]:
    unwind = sec.get("unwind", {})
    out = [
        "## Unwind",
        "",
        "Runs whose actions each registered the `bench.undo` compensation (a Python no-op compensator), failed "
        "into the recovery queue and compensated with the product's own services; one Procfile worker carries "
        "the steps out. Time from the Compensate decision to the unwind's `finished_at`.",
        "",
    ]
    for key in ("single", "concurrent"):
        u = unwind.get(key)
        if u:
            out.append(
                f"- {key}: {u['unwinds']} unwind(s), {u['steps']} steps in {u['seconds']:.2f} s = "
                f"{u['per_step_ms']:.1f} ms/step ({u['steps_per_s']:.1f} steps/s); unwinds "
                f"{u['unwind_statuses']}, steps {u['step_statuses']}"
            )
    chain = base.get("L3_chain")
    if chain:
        out.append(f"- L3 chained no-op job on the same worker: {chain['per_job_ms']:.1f} ms/job")
    for name, cand in unwind.get("candidates", {}).items():
        for key in ("single", "concurrent"):
            u = cand.get(key)
            if u:
                out.append(
                    f"- candidate `{name}` (`bench/candidate_worker.py`), {key}: {u['unwinds']} unwind(s), "
                    f"{u['steps']} steps in {u['seconds']:.2f} s = {u['per_step_ms']:.1f} ms/step; "
                    f"unwinds {u['unwind_statuses']}"
                )
    chain = base.get("L3_chain_candidate")
    if chain:
        out.append(f"- L3 chained no-op job on the candidate worker: {chain['per_job_ms']:.1f} ms/job")
    return out
