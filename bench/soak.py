"""Soak: undo keeps up under load and faults.

Agents record onboarding sagas (create the HR record, provision the licence, send the welcome
email) over the API for the load's length, every third saga failing; an operator, through the API
with an operator key, compensates each failed run as it appears in the recovery queue; the one
``saga_worker`` (the Procfile's line, started and restarted as a process supervisor would) carries
the undos out against the tools' webhook compensators, served by ``World`` in this process. Halfway
through the worker is SIGKILLed; later the harness's own Redis (a throwaway redis-server, never the
machine's) is stopped and started again empty, as ``--save ""`` restarts.

What it measures (bench/soak_report.py renders it): whether every failed run was compensated
within ``deadline_s`` of the load's end; whether every compensating call carried its step's
idempotency key and each undo took effect once at the tool; that no succeeded run was touched; the
5xx answers; and the undo latency (the operator's decision, the unwind's ``created_at``, to its
last step done, the unwind's ``finished_at``) during and after the load.

The agents, the World and the operator are in bench/soak_world.py, the report's section in
bench/soak_report.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import machine, procs
from bench.environment import child_env
from bench.loadgen import LoadControl, percentile, run_load
from bench.soak_world import STEPS, TENANT, Operator, World, serve_world
from bench.stats import log, summarize

if TYPE_CHECKING:
    from bench.harness import Harness


@dataclass
class SoakSizes:
    duration_s: float = 90
    agents: int = 8
    kill_at_s: float = 30
    outage_at_s: float = 55
    outage_s: float = 6
    sweep_interval_s: int = 5
    # The target: every failed run compensated within this long after the load's end.
    deadline_s: float = 60
    # How long the harness goes on watching after the load's end (an observation limit, not a
    # target: past the deadline it still measures how late the undo is, up to here).
    observe_s: float = 300
    # An agent's pause between two tool calls (a model's turn is much longer; this is load).
    think_s: float = 0.05
    fail_every: int = 3
    # The tools' time per compensating call (a downstream API).
    tool_delay_s: float = 0.05
    client_processes: int = 4

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


FULL = SoakSizes()
SMOKE = SoakSizes(duration_s=6, agents=2, kill_at_s=2, outage_at_s=3.5, outage_s=1, observe_s=120)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The soak's knobs; unset, the size's (full: 90 s, 8 agents, kill at 30 s, Redis
    down 6 s at 55 s; --smoke: seconds)."""
    group = parser.add_argument_group("soak")
    group.add_argument("--soak-duration", type=float, default=None, help="seconds of load")
    group.add_argument("--soak-agents", type=int, default=None, help="agents recording sagas")
    group.add_argument(
        "--soak-kill-at", type=float, default=None, help="SIGKILL the worker this long in (<0: never)"
    )
    group.add_argument(
        "--soak-outage-at", type=float, default=None, help="stop Redis this long in (<0: never)"
    )
    group.add_argument("--soak-outage", type=float, default=None, help="seconds Redis stays down")
    group.add_argument(
        "--soak-observe",
        type=float,
        default=None,
        help="seconds to keep watching after the load (not a target)",
    )


def sizes_from(args: argparse.Namespace) -> SoakSizes:
    base = SMOKE if args.smoke else FULL
    overrides = {
        "duration_s": args.soak_duration,
        "agents": args.soak_agents,
        "kill_at_s": args.soak_kill_at,
        "outage_at_s": args.soak_outage_at,
        "outage_s": args.soak_outage,
        "observe_s": args.soak_observe,
    }
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


# --- The harness's own Redis and the supervised worker ----------------------------------------


def _quiet_port() -> int:
    """A free port below the kernel's ephemeral range: nothing takes it while this Redis is down."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(20000, max(20001, low))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range for the soak's Redis")


class OwnRedis:
    """redis-server on 127.0.0.1 without persistence: stopped, it loses every job; started again on
    the same port, it is empty (what ``--save ""`` restarts to)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = _quiet_port()
        self.log_dir = log_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        from redis import Redis
        from redis.exceptions import RedisError

        binary = shutil.which("redis-server")
        if not binary:
            raise RuntimeError("the soak needs redis-server on PATH (its own, throwaway)")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / "soak-redis.log").open("ab")
        self.process = subprocess.Popen(  # noqa: S603 - our own redis-server, on loopback
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.pids.append(self.process.pid)
        client = Redis.from_url(self.url, socket_timeout=2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the soak's redis-server exited ({self.process.returncode}); port {self.port}"
                )
            with suppress(RedisError, OSError):
                if client.info("server").get("process_id") == self.process.pid:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the soak's redis-server did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: rq's work horses call setpgrp, so a group kill misses them (a
    crashed host would not)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    victims = descendants(pid)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for victim in victims:
        with suppress(ProcessLookupError):
            os.kill(victim, sig)


class Supervisor:
    """The Procfile's worker line, restarted a second after it exits, as systemd's
    ``Restart=always`` (or a container runtime) would."""

    RESTART_S = 1.0

    def __init__(self, env: dict[str, str], log_dir: Path, t0: Callable[[], float]) -> None:
        self.env, self.log_dir, self.t0 = env, log_dir, t0
        self.proc: Any = None
        self.pids: list[int] = []
        self.exits: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="soak-supervisor")

    def _spawn(self) -> None:
        with self.lock:
            # Checked under the lock ``stop`` takes: nothing is started once it has begun.
            if self.stopping.is_set():
                return
            self.proc = procs.start(
                f"soak-worker-{len(self.pids)}", procs.worker_command(), self.env, self.log_dir
            )
            self.pids.append(self.proc.popen.pid)

    def start(self) -> None:
        self._spawn()
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.is_set():
            proc = self.proc
            code = proc.popen.wait()
            kill_tree(proc.popen.pid)  # a horse left behind must not go on working
            proc.log.close()
            if self.stopping.is_set():
                return
            self.exits.append({"at_s": time.time() - self.t0(), "returncode": code})
            if self.stopping.wait(self.RESTART_S):
                return
            self._spawn()

    def kill_hard(self) -> float:
        """SIGKILL the worker and its work horses: a crashed host. Returns when it happened."""
        with self.lock:
            pid = self.proc.popen.pid
        kill_tree(pid)
        return time.time()

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
            proc = self.proc
        if proc is not None and proc.popen.poll() is None:
            horses = descendants(proc.popen.pid)
            with suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)
            kill_tree(proc.popen.pid)
            for pid in horses:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.thread.join(timeout=30)


# --- The run ------------------------------------------------------------------------------------


def _policies(world: World) -> dict[str, Any]:
    """The onboarding tools as the demo world's policy file has them, their compensators the
    World's webhooks; nothing compensates automatically: the operator decides each undo."""
    policies: list[dict[str, Any]] = []
    compensators: dict[str, Any] = {}
    for forward, undo, path in STEPS:
        irreversible = forward.startswith("email.")
        policies.append(
            {
                "tool": forward,
                "risk": "medium",
                "approval": "auto",
                "action_class": "external_irreversible" if irreversible else "external_reversible",
                "compensation": "correction" if irreversible else "custom",
                "compensation_tool": undo,
                "compensation_args": {"email": "$args.email"},
            }
        )
        policies.append(
            {
                "tool": undo,
                "risk": "medium",
                "approval": "auto",
                "action_class": "internal_update",
                "compensation": "none",
            }
        )
        compensators[undo] = {"webhook": f"http://127.0.0.1:{world.port}{path}", "secret": world.secret}
    return {
        "policies": policies,
        "compensators": compensators,
        "unwind": {"on_compensation_failure": "alert_and_continue", "max_attempts": 5},
        "auto_compensate": {"max_risk": None},
    }


def _load_policies(path: Path, policies: dict[str, Any]) -> None:
    import io

    from django.core.management import call_command

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(policies, indent=2))
    # Its warnings (auto-approved deleting compensators) are for a person editing policies, not here.
    call_command("load_policies", str(path), verbosity=0, stdout=io.StringIO(), stderr=io.StringIO())


def _keys(agents: int) -> tuple[list[str], str]:
    """One agent key per agent (each its own agent), and the operator's key."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=TENANT, name="Soak")
    actor = Actor.system("bench-soak")
    agent_secrets = [
        agent_key_create(tenant=tenant, name=f"soak-agent-{i}", scopes=["agent"], actor=actor).secret
        for i in range(agents)
    ]
    operator = agent_key_create(tenant=tenant, name="soak-operator", scopes=["operator"], actor=actor)
    return agent_secrets, operator.secret


def _wait_registered(redis_url: str, pid: int, timeout: float) -> None:
    from redis import Redis
    from rq import Worker

    redis = Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(w.pid == pid for w in Worker.all(connection=redis)):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the soak's worker did not register with its Redis within {timeout:.0f} s")


def _faults(
    sizes: SoakSizes, t0: Callable[[], float], supervisor: Supervisor, redis: OwnRedis
) -> list[dict[str, Any]]:
    """The scripted faults at their times after the load's start (the only sleeps of the soak:
    a fault's time is the script, not something to observe)."""
    events: list[dict[str, Any]] = []

    def until(offset: float) -> None:
        time.sleep(max(0.0, t0() + offset - time.time()))

    if 0 <= sizes.kill_at_s < sizes.duration_s:
        until(sizes.kill_at_s)
        events.append({"event": "worker SIGKILLed", "at_s": supervisor.kill_hard() - t0()})
    if 0 <= sizes.outage_at_s < sizes.duration_s and sizes.outage_s > 0:
        until(sizes.outage_at_s)
        redis.stop()
        events.append({"event": "Redis stopped", "at_s": time.time() - t0()})
        until(sizes.outage_at_s + sizes.outage_s)
        redis.start()
        events.append({"event": "Redis started again, empty", "at_s": time.time() - t0()})
    return events


def _settled() -> tuple[bool, dict[str, int]]:
    """Every run that went to the recovery queue is compensated, and no unwind is running."""
    from ledger.models import Run
    from recovery.models import RecoveryItem

    queued = RecoveryItem.objects.filter(tenant__slug=TENANT).values_list("run_id", flat=True).distinct()
    statuses: Counter[str] = Counter(Run.objects.filter(pk__in=queued).values_list("status", flat=True))
    return set(statuses) <= {"compensated"}, dict(statuses)


class Soak:
    """One soak: its Redis, the World, the web and the supervised worker, the operator, the faults
    and the agents' load; ``run`` returns the section's figures and leaves nothing running."""

    def __init__(self, harness: Harness) -> None:
        self.harness, self.log = harness, log
        self.sizes: SoakSizes = sizes_from(harness.args)
        self.log_dir: Path = harness.log_dir
        self.redis = OwnRedis(self.log_dir)
        self.control = LoadControl()
        self.web: Any = None
        self.supervisor: Supervisor | None = None
        self.operator: Operator | None = None
        self.events: list[dict[str, Any]] = []

    def t0(self) -> float:
        """The load's start (wall clock), once the agents' window has begun."""
        return self.control.window_at.value or time.time()

    def _start(self, world: World) -> list[str]:
        """The policies and keys, then the web and the worker on the soak's Redis: the agents' keys."""
        _load_policies(self.log_dir / "soak-policies.json", _policies(world))
        agent_secrets, operator_secret = _keys(self.sizes.agents)
        env = child_env(
            database_url=self.harness.database_url,
            redis_url=self.redis.url,
            port=self.harness.port,
            settings_module="saga_admin.settings",
        )
        env["SAGA_SWEEP_INTERVAL_S"] = str(self.sizes.sweep_interval_s)
        self.web = procs.start("soak-web", procs.web_command(), env, self.log_dir)
        procs.wait_http(self.harness.port, "/healthz", self.web, timeout=120)
        procs.warm_http(self.harness.port, "/api/v1/policies", self.web, connections=8)
        self.supervisor = Supervisor(env, self.log_dir, self.t0)
        self.supervisor.start()
        _wait_registered(self.redis.url, self.supervisor.pids[0], timeout=120)
        self.operator = Operator(self.harness.port, operator_secret, self.t0)
        self.operator.start()
        return agent_secrets

    def _faults(self) -> None:
        # The script counts from the agents' window, which opens once their processes are up.
        if self.control.wait_window(timeout=300) and self.supervisor is not None:
            self.events.extend(_faults(self.sizes, self.t0, self.supervisor, self.redis))

    def _load(self, agent_secrets: list[str]) -> Any:
        sizes = self.sizes
        return run_load(
            scenario="onboarding_saga",
            host="127.0.0.1",
            port=self.harness.port,
            clients=sizes.agents,
            processes=min(sizes.client_processes, sizes.agents),
            warmup_s=0,
            window_s=sizes.duration_s,
            params={
                "think_s": sizes.think_s,
                "fail_every": sizes.fail_every,
                "headers_per_client": {
                    i: {"Authorization": f"Bearer {s}"} for i, s in enumerate(agent_secrets)
                },
                # A bound on each agent's requests whatever the machine's speed.
                "max_requests_per_client": int(sizes.duration_s / max(sizes.think_s, 0.01)) * 3 + 50,
            },
            control=self.control,
        )

    def _watch(self, load_end: float) -> dict[str, Any]:
        """Poll PostgreSQL until every queued run is compensated, or ``observe_s`` after the load."""
        deadline = load_end + self.sizes.observe_s
        settled, statuses = _settled()
        while not settled and time.time() < deadline:
            time.sleep(0.5)
            settled, statuses = _settled()
        return {
            "settled": settled,
            "settled_observed_s": time.time() - load_end,
            "queued_run_statuses": statuses,
        }

    def run(self) -> dict[str, Any]:
        sizes = self.sizes
        out: dict[str, Any] = {"sizes": sizes.as_dict(), "load_before": machine.loadavg()}
        self.redis.start()
        try:
            with serve_world(sizes.tool_delay_s) as world:
                agent_secrets = self._start(world)
                faults = threading.Thread(target=self._faults, daemon=True, name="soak-faults")
                self.log(
                    f"soak: {sizes.agents} agents for {sizes.duration_s:.0f} s, worker SIGKILLed at "
                    f"{sizes.kill_at_s:.0f} s, Redis down {sizes.outage_s:.0f} s at {sizes.outage_at_s:.0f} s"
                )
                faults.start()
                result = self._load(agent_secrets)
                load_end = self.t0() + sizes.duration_s
                faults.join(timeout=sizes.outage_s + 60)
                out["load_after"] = machine.loadavg()
                self.log(
                    f"soak: load over; watching for every failed run to be compensated (≤ {sizes.observe_s:.0f} s)"
                )
                out.update(self._watch(load_end))
                assert self.operator is not None and self.supervisor is not None  # noqa: S101 - set by _start
                self.operator.stop()
                out["events"] = self.events
                out["load"] = summarize(result)
                out["load"]["by_op"] = {op: summarize(result, op) for op in result.ops()}
                out["agent_statuses"] = _status_counts(result)
                out["operator"] = {
                    "polls": self.operator.polls,
                    "decisions": len(self.operator.decisions),
                    "statuses": dict(self.operator.statuses),
                }
                out["worker"] = {"restarts": len(self.supervisor.exits), "exits": list(self.supervisor.exits)}
                out.update(
                    analyse(
                        world=world,
                        t0=self.t0(),
                        load_end=load_end,
                        sizes=sizes,
                        decisions=self.operator.decisions,
                    )
                )
        finally:
            self.stop()
        out["pids"] = self.pids()
        return out

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.web is not None:
            self.web.stop()
        self.redis.stop()

    def pids(self) -> list[int]:
        """Every process the soak started (for a caller to check that none is left)."""
        workers = self.supervisor.pids if self.supervisor else []
        return [*self.redis.pids, *workers, *([self.web.popen.pid] if self.web else [])]


def phase(h: Harness) -> None:
    h.section("soak").update(Soak(h).run())


def _status_counts(result: Any) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for sample in result.samples:
        counts[str(sample.status)] += 1
    return dict(counts)


def _percentiles(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50_s": percentile(ordered, 50) if ordered else None,
        "p99_s": percentile(ordered, 99) if ordered else None,
        "max_s": ordered[-1] if ordered else None,
    }


def analyse(
    *, world: World, t0: float, load_end: float, sizes: SoakSizes, decisions: list[dict[str, Any]]
) -> dict[str, Any]:
    """The targets' figures, from PostgreSQL (what the engine recorded) and the World (what the
    tools received)."""
    from ledger.models import Run
    from recovery.models import RecoveryItem, Unwind, UnwindStep

    runs = dict(Run.objects.filter(tenant__slug=TENANT).values_list("pk", "status"))
    planned_ok = set(
        Run.objects.filter(tenant__slug=TENANT, external_id__endswith="-ok").values_list("pk", flat=True)
    )
    queued = set(RecoveryItem.objects.filter(tenant__slug=TENANT).values_list("run_id", flat=True))
    unwinds: list[dict[str, Any]] = [
        dict(u)
        for u in Unwind.objects.filter(tenant__slug=TENANT)
        .order_by("created_at")
        .values("pk", "run_id", "status", "created_at", "finished_at")
    ]
    by_run: dict[str, list[dict[str, Any]]] = {}
    for unwind in unwinds:
        by_run.setdefault(unwind["run_id"], []).append(unwind)

    # Undo latency per failed run: the operator's first decision to the last step of the unwind
    # that compensated it.
    during: list[float] = []
    after: list[float] = []
    done_at: dict[str, float] = {}
    for run_id in queued:
        history = by_run.get(run_id, [])
        completed = [u for u in history if u["status"] == "completed" and u["finished_at"]]
        if runs.get(run_id) != "compensated" or not completed:
            continue
        decided = history[0]["created_at"].timestamp()
        done_at[run_id] = completed[-1]["finished_at"].timestamp()
        (during if decided < load_end else after).append(done_at[run_id] - decided)
    undecided = [r for r in queued if r not in by_run]
    late = [r for r in queued if r not in done_at or done_at[r] > load_end + sizes.deadline_s]
    last_done = max(done_at.values()) if done_at else None

    # One idempotency key per undo, one effect each, as the tools saw it.
    steps = list(
        UnwindStep.objects.filter(unwind__tenant__slug=TENANT).values(
            "action_id", "idempotency_key", "status"
        )
    )
    keys_of: dict[str, set[str]] = {}
    done_actions: set[str] = set()
    for step in steps:
        keys_of.setdefault(step["action_id"], set()).add(step["idempotency_key"])
        if step["status"] == "done":
            done_actions.add(step["action_id"])
    with world.lock:
        calls = list(world.calls)
        effects = Counter(world.effects)
        overlaps, refused = world.overlaps, world.refused
    received: dict[str, set[str]] = {}
    without_key = foreign_key = 0
    for call in calls:
        if not call["key"]:
            without_key += 1
        elif call["key"] not in keys_of.get(call["action_id"], set()):
            foreign_key += 1
        received.setdefault(call["action_id"], set()).add(call["key"])
    many_keys = sorted(a for a, keys in received.items() if len(keys) > 1)
    double = sorted(a for a, n in effects.items() if n > 1)
    unseen = sorted(done_actions - set(effects))

    # No succeeded run touched: the runs the agents completed kept their status, got no unwind,
    # and no tool was called for any of their actions.
    succeeded = {r for r, status in runs.items() if status == "succeeded"}
    called_runs = {c["run_id"] for c in calls}
    touched = sorted(
        {
            r
            for r in planned_ok
            if r in by_run or r in called_runs or runs[r] in ("compensating", "compensated")
        }
    )
    return {
        "runs": {
            "total": len(runs),
            "by_status": dict(Counter(runs.values())),
            "queued": len(queued),
            "succeeded": len(succeeded),
            "planned_ok": len(planned_ok),
        },
        "compensation": {
            "failed_runs": len(queued),
            "compensated": sum(1 for r in queued if runs.get(r) == "compensated"),
            "never_decided": len(undecided),
            "late_or_missing": len(late),
            "last_done_after_load_s": (last_done - load_end) if last_done is not None else None,
            "unwinds": len(unwinds),
            "unwind_statuses": dict(Counter(u["status"] for u in unwinds)),
            "re_decided_runs": sum(1 for h in by_run.values() if len(h) > 1),
            "step_statuses": dict(Counter(s["status"] for s in steps)),
        },
        "latency": {
            "during": _percentiles(during),
            "after": _percentiles(after),
            "all": _percentiles(during + after),
        },
        "idempotency": {
            "calls": len(calls),
            "keys": len({c["key"] for c in calls}),
            "calls_without_key": without_key,
            "calls_with_a_foreign_key": foreign_key,
            "actions_called": len(received),
            "actions_with_several_keys": len(many_keys),
            "actions_with_several_effects": len(double),
            "done_without_a_call": len(unseen),
            "overlapping_calls": overlaps,
            "refused_signatures": refused,
            "examples": {"several_keys": many_keys[:5], "several_effects": double[:5], "unseen": unseen[:5]},
        },
        "untouched": {"succeeded_runs": len(succeeded), "touched": len(touched), "examples": touched[:5]},
        "decisions_timeline": [round(d["at_s"], 1) for d in decisions][:2000],
        "t0": t0,
        "load_end": load_end,
    }
