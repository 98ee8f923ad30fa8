"""``make bench``'s before-images phase: what reading an update's before- and after-image
costs a governed call, and what the worker's drift check and read-back cost an undo step.

1. **A governed call at one agent**, through the Python client's ``run.step``: the same update tool
   under a policy without ``before`` and under one with it (the client then reads the target
   before the call and after it, through a reader registered on the client, and sends both images
   with the record and the success). The steps alternate, so both see the same server and machine.
   What Saga Admin adds is the step's time less the tool's own; the reads are the agent's own code
   (here a dictionary lookup, as cheap as a read can be), timed and shown apart.
2. **An undo step with and without the checks**: failed runs of the same update tool, compensated
   through the product's services and carried out by the Procfile's worker; with ``before`` each
   step reads the target through a Python reader before the compensator (drift) and after it
   (read-back), without it neither. The target's value lives in Redis, so the worker's compensator
   and reader see what the other did.
"""

from __future__ import annotations

import io
import json
import os
import time
from typing import TYPE_CHECKING, Any

from bench.loadgen import percentile
from bench.stats import log
from bench.tables import fmt

if TYPE_CHECKING:
    from bench.harness import Harness

TENANT = "bench-images"
READ, IMAGED, PLAIN, RESTORE = "bench.img_read", "bench.img_set", "bench.img_plain", "bench.img_restore"
_KEY = "saga-bench:img:"

POLICIES: dict[str, Any] = {
    "policies": [
        {"tool": READ, "risk": "low", "approval": "auto", "action_class": "read_only"},
        # The undo's own tool: low risk and automatic, so an operator's compensation runs unattended.
        {
            "tool": RESTORE,
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "none",
        },
        {
            "tool": IMAGED,
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "before": {"tool": READ, "args": {"id": "$args.id"}, "path": "record"},
            "compensation_tool": RESTORE,
            "compensation_args": {"id": "$args.id", "v": "$before.v"},
        },
        {
            "tool": PLAIN,
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "compensation_tool": RESTORE,
            "compensation_args": {"id": "$args.id", "v": "$args.old"},
        },
    ],
    "compensators": {RESTORE: {"python": "bench.images.restore"}},
    "readers": {READ: {"python": "bench.images.read_record"}},
}


# --- In the worker: the target's value, in Redis ---------------------------------------------


def _redis() -> Any:
    from redis import Redis

    return Redis.from_url(os.environ["REDIS_URL"])


def restore(*, args: dict[str, Any], **_: Any) -> dict[str, Any]:
    """The compensator: put the record's value back (what ``$before.v`` filled)."""
    record = {"id": args["id"], "v": args["v"]}
    _redis().set(_KEY + str(args["id"]), json.dumps(record))
    return {"state": record}


def read_record(*, args: dict[str, Any], **_: Any) -> dict[str, Any]:
    """The reader of ``bench.img_read``: the record as it is now."""
    raw = _redis().get(_KEY + str(args["id"]))
    return {"record": json.loads(raw) if raw else None}


# --- The phase --------------------------------------------------------------------------------


def _prepare(h: Harness) -> tuple[str, Any]:
    """The tenant's policy file, an agent key and an operator: (the key's secret, the operator)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from bench.fixtures import agent_keys

    h.log_dir.mkdir(parents=True, exist_ok=True)
    path = h.log_dir / "bench-images-policies.json"
    path.write_text(json.dumps(POLICIES, indent=2))
    [(_, secret)] = agent_keys(tenant_slug=TENANT, count=1)
    call_command(
        "load_policies", str(path), tenant=TENANT, verbosity=0, stdout=io.StringIO(), stderr=io.StringIO()
    )
    call_command(
        "create_staff",
        "bench-images-operator",
        password="Correct-Horse-Battery-7",
        tenant=TENANT,
        role="operator",
        stdout=io.StringIO(),
    )
    return secret, get_user_model().objects.get(username="bench-images-operator")


def governed(h: Harness, secret: str, steps: int) -> dict[str, Any]:
    """At one agent: ``run.step`` of the update tool without ``before`` and with it, alternating."""
    from saga_client import Saga

    store: dict[str, dict[str, Any]] = {}
    reads: list[float] = []
    added: dict[str, list[float]] = {PLAIN: [], IMAGED: []}
    with Saga(f"http://127.0.0.1:{h.port}", secret) as saga:

        @saga.reader(READ)
        def read(id: str) -> dict[str, Any]:  # noqa: A002 - the read tool's own argument name
            t = time.perf_counter()
            record = {"record": dict(store.setdefault(id, {"id": id, "v": 0}))}
            reads.append(time.perf_counter() - t)
            return record

        with saga.run(agent="bench-images", request="a governed update, with and without images") as run:
            for n in range(steps + 20):
                for tool in (PLAIN, IMAGED):
                    inner: list[float] = []
                    target = f"{tool}-{n}"

                    def do(args: dict[str, Any], inner: list[float] = inner) -> dict[str, Any]:
                        t = time.perf_counter()
                        store[args["id"]] = {"id": args["id"], "v": args["v"]}
                        inner.append(time.perf_counter() - t)
                        return {"ok": True}

                    t0 = time.perf_counter()
                    run.step(
                        tool, target=("record", target), args={"id": target, "v": n + 1, "old": 0}, do=do
                    )
                    elapsed = time.perf_counter() - t0
                    if n >= 20:  # the first rounds warm the connection, the policy copy, the server
                        added[tool].append(elapsed - inner[0])
    out: dict[str, Any] = {"steps": steps}
    for tool, name in ((PLAIN, "without"), (IMAGED, "with")):
        values = sorted(added[tool])
        out[f"{name}_p50_ms"] = percentile(values, 50) * 1000
        out[f"{name}_p99_ms"] = percentile(values, 99) * 1000
    reads.sort()
    out["read_p50_ms"] = percentile(reads, 50) * 1000 if reads else 0.0
    out["images_p50_ms"] = out["with_p50_ms"] - out["without_p50_ms"]
    out["images_p99_ms"] = out["with_p99_ms"] - out["without_p99_ms"]
    return out


def _failed_runs(*, tool: str, runs: int, steps: int, label: str) -> list[Any]:
    """``runs`` failed runs of ``steps`` updates of ``tool`` each, in the queue: their items. Each
    record is set to its after-value in Redis, as the agent left it."""
    from ledger.audit import Actor
    from ledger.models import AgentKey
    from ledger.services import runs as run_services
    from ledger.services.actions import moves
    from recovery.actions.approvals import action_record_gated
    from recovery.actions.reports import run_fail_and_queue

    key = AgentKey.objects.select_related("tenant").get(tenant__slug=TENANT)
    actor = Actor.for_key(key)
    redis = _redis()
    items = []
    for index in range(runs):
        run = run_services.run_create(
            tenant=key.tenant, actor=actor, agent="bench-images", request=f"undo checks {label}{index}"
        )
        for n in range(steps):
            target = f"{label}{index}-{n}"
            before, after = {"id": target, "v": 0}, {"id": target, "v": 1}
            action = action_record_gated(
                run=run,
                actor=actor,
                tool=tool,
                idempotency_key=f"{run.pk}:{n}",
                target_type="record",
                target_id=target,
                args={"id": target, "v": 1, "old": 0},
                before_snapshot=before,
            ).action
            moves.action_start(action=action, actor=actor)
            moves.action_succeed(action=action, actor=actor, result={"ok": True}, after_snapshot=after)
            redis.set(_KEY + target, json.dumps(after))
        items.append(run_fail_and_queue(run=run, actor=actor, error="benchmark failure").item)
    return items


def undo_steps(h: Harness, user: Any, *, runs: int, steps: int) -> dict[str, Any]:
    """Per undo step on the Procfile's worker: unchecked (no ``before``), then checked (drift check
    and read-back through the reader), the same number of runs and steps each."""
    from bench.unwinds import start_unwind, wait_finished
    from recovery.models import UnwindStep

    out: dict[str, Any] = {"runs": runs, "steps_per_run": steps}
    worker = h.start_worker(None)
    try:
        for tool, name in ((PLAIN, "unchecked"), (IMAGED, "checked")):
            items = _failed_runs(tool=tool, runs=runs, steps=steps, label=name)
            started = time.time()
            ids = [start_unwind(item, user).pk for item in items]
            done = wait_finished(ids, timeout_s=300)
            ends = [
                d["finished_at"].timestamp() if d["finished_at"] else d["observed"] for d in done.values()
            ]
            elapsed = max(ends) - started
            finished = UnwindStep.objects.filter(unwind_id__in=ids)
            out[name] = {
                "seconds": elapsed,
                "steps": finished.count(),
                "per_step_ms": elapsed / max(finished.count(), 1) * 1000,
                "verified": finished.filter(verified=True).count(),
                "statuses": sorted(set(finished.values_list("status", flat=True))),
            }
    finally:
        worker.stop()
    out["checks_per_step_ms"] = out["checked"]["per_step_ms"] - out["unchecked"]["per_step_ms"]
    return out


def phase(h: Harness) -> None:
    s = h.section("images")
    secret, user = _prepare(h)
    log(f"before-images: a governed call at one agent, {h.sizes.governed_steps} steps with and without")
    web = h.start_web("web-images")
    try:
        s["governed"] = governed(h, secret, h.sizes.governed_steps)
    finally:
        web.stop()
    runs, steps = h.sizes.concurrent_unwinds, h.sizes.unwind_steps
    log(f"before-images: undo steps with and without the checks, {runs} runs x {steps} steps each")
    s["undo"] = undo_steps(h, user, runs=runs, steps=steps)


# --- The report -------------------------------------------------------------------------------


def rows(sec: dict[str, Any]) -> list[list[str]]:
    """The one table's rows (bench.tables.HEADER): p50 and p99 columns, the rest in the note."""
    g, u = sec.get("governed"), sec.get("undo")
    out: list[list[str]] = []
    if g:
        for name, label in (("without", "governed call, no before"), ("with", "governed call, with before")):
            p50, p99 = fmt(g[f"{name}_p50_ms"], 2), fmt(g[f"{name}_p99_ms"], 2)
            out.append([f"{label} (added)", "1", "–", p50, "–", p99, "–", "–", "–"])
        note = f"images add {fmt(g['images_p50_ms'], 2)} ms p50, {fmt(g['images_p99_ms'], 2)} ms p99"
        out[-1][-1] = note
    if u:
        for name, label in (
            ("unchecked", "undo step, no checks"),
            ("checked", "undo step, drift + read-back"),
        ):
            m = u[name]
            out.append(
                [label, "–", "–", fmt(m["per_step_ms"], 2), "–", "–", "–", "–", f"{m['verified']} verified"]
            )
        out[-1][-1] += f"; checks add {fmt(u['checks_per_step_ms'], 2)} ms/step"
    return out


def markdown(sec: dict[str, Any]) -> list[str]:
    g, u = sec.get("governed"), sec.get("undo")
    lines = ["## Before-images", ""]
    if not g and not u:
        return [*lines, "Not measured in this run.", ""]
    lines += [
        "What an update's before- and after-image costs (`bench/images.py`). A governed call "
        "is the Python client's `run.step` at one agent, the update tool under a policy without "
        "`before` and with it, alternating; Saga Admin's part is the step's time less the tool's. "
        "The reads are the agent's own code (here a dictionary lookup), shown apart.",
        "",
    ]
    if g:
        lines += [
            "| governed call at one agent | p50 added | p99 added |",
            "|---|---|---|",
            f"| without `before` ({g['steps']} steps) | {fmt(g['without_p50_ms'])} ms | {fmt(g['without_p99_ms'])} ms |",
            f"| with `before` (two reads, both images sent) | {fmt(g['with_p50_ms'])} ms | {fmt(g['with_p99_ms'])} ms |",
            f"| **what the images add** | **{fmt(g['images_p50_ms'])} ms** | **{fmt(g['images_p99_ms'])} ms** |",
            "",
            f"The agent's read itself took {fmt(g['read_p50_ms'], 3)} ms p50 here; a real read (an MCP or "
            "HTTP round trip to the system that holds the value) adds its own time twice per call.",
            "",
        ]
    if u:
        lines += [
            f"An undo step on the Procfile's worker ({u['runs']} runs × {u['steps_per_run']} steps, "
            "Python compensator and Python reader reading a value in Redis):",
            "",
            "| undo step | per step | steps verified | step states |",
            "|---|---|---|---|",
            _undo_row("without `before` (no checks)", u["unchecked"]),
            _undo_row("with `before` (drift check + read-back)", u["checked"]),
            f"| **what the checks add** | **{fmt(u['checks_per_step_ms'])} ms** | | |",
            "",
        ]
    return lines


def _undo_row(label: str, measured: dict[str, Any]) -> str:
    states = ", ".join(measured["statuses"])
    return f"| {label} | {fmt(measured['per_step_ms'])} ms | {measured['verified']} / {measured['steps']} | {states} |"
