"""The layering (docs/README.md, "Where things are"), read from the code's own imports; and the size
budget every module keeps.

Dependencies point down: ``saga_client`` (no server code at all; the server imports it only in
the demo's agents) ← ``infra`` (the platform: configuration, errors, outbound requests,
observability) ← ``ledger`` (the record) ←
``recovery`` (the decisions) ← ``saga_admin.api`` and ``dashboard`` (HTTP and pages, peers that do
not import each other) ← the project shell (``saga_admin`` settings and urls) and ``demo`` ←
``bench`` (the benchmark harness: a tool over all of it, which nothing imports; the installed
distribution does not carry it).
Inside ``recovery`` the decisions (the ``recovery.services`` package) sit on top: nothing below
them imports them.

Every import counts, function-level ones included (an import inside a function is still a
dependency; moving it there only hides a cycle), and so does ``importlib`` reaching a module by
its name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("saga_client", "infra", "ledger", "recovery", "saga_admin", "dashboard", "demo", "bench")
SERVER_AND_FRAMEWORKS = {
    "django",
    "ninja",
    "infra",
    "ledger",
    "recovery",
    "saga_admin",
    "dashboard",
    "demo",
    "rq",
}


# The client is its own distribution (clients/python); its package sits under that folder.
PACKAGE_ROOTS = {"saga_client": ROOT / "clients" / "python"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        root = PACKAGE_ROOTS.get(package, ROOT)
        for path in (root / package).rglob("*.py"):
            modules[_module_name(path, root)] = path
    return modules


MODULES = _sources()


def _raw_imports(path: Path, module: str) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            # ``from recovery import services`` depends on the module recovery.services.
            yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in {"import_module", "find_spec", "__import__"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    yield first.value


def imports_of(module: str) -> set[str]:
    """The project modules ``module`` imports (resolved to modules that exist), and the names of
    the outside packages it imports (their top level)."""
    found: set[str] = set()
    for name in _raw_imports(MODULES[module], module):
        if name in MODULES:
            found.add(name)
        elif name.split(".")[0] not in PACKAGES:
            found.add(name.split(".")[0])
        elif name.rpartition(".")[0] in MODULES and name.rpartition(".")[0] != module:
            # ``from ledger.models import Run``: the module is ledger.models.
            found.add(name.rpartition(".")[0])
    return found - {module}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    if top == "saga_client":
        return 0
    if top == "infra":
        return 1
    if top == "ledger":
        return 2
    if top == "recovery":
        return 3
    if top == "dashboard" or module == "saga_admin.api" or module.startswith("saga_admin.api."):
        return 4
    if top == "bench":
        return 6
    return 5  # the project shell (settings, urls, health) and the demo


API_AND_DASHBOARD = 4


def _app(module: str) -> str:
    return "saga_admin.api" if module.startswith("saga_admin.api") else module.split(".")[0]


def test_it_finds_the_modules_it_checks():
    # A test that read no imports would pass vacuously.
    assert {
        "infra.outbound",
        "ledger.models",
        "recovery.services.compensating",
        "saga_admin.api.app",
        "dashboard.views.queue",
    } <= set(MODULES)
    assert "recovery.items" in imports_of("recovery.services.compensating")
    assert "ledger.services.runs" in imports_of("recovery.services.compensating")
    # A package's ``__init__`` is a module too (``from recovery.unwinds import advance`` imports both).
    assert {"recovery.unwinds", "recovery.unwinds.advance"} <= imports_of("recovery.services.approving")
    # The harness's entry point and the phases it runs are read too.
    assert {"bench.harness", "bench.report", "bench.size"} <= imports_of("bench.run")


def test_it_keeps_every_import_pointing_down():
    upward = {
        module: sorted(
            target for target in imports_of(module) if target in MODULES and _layer(target) > _layer(module)
        )
        for module in MODULES
    }
    assert {module: targets for module, targets in upward.items() if targets} == {}


def test_it_keeps_the_api_and_the_dashboard_apart():
    crossing = {
        module: sorted(
            t
            for t in imports_of(module)
            if t in MODULES and _layer(t) == API_AND_DASHBOARD and _app(t) != _app(module)
        )
        for module in MODULES
        if _layer(module) == API_AND_DASHBOARD
    }
    assert {module: targets for module, targets in crossing.items() if targets} == {}


DECISIONS = "recovery.services"


def _is_decisions(module: str) -> bool:
    return module == DECISIONS or module.startswith(f"{DECISIONS}.")


def test_it_keeps_the_decisions_module_on_top_of_recovery():
    """The decisions (recovery.services, a package) call items, approvals, commands and the
    engine; none of them (nor anything else in recovery but the jobs the worker runs) calls them
    back, and every one of them stands on a floor above the rest of recovery."""
    callers = sorted(
        module
        for module in MODULES
        if module.startswith("recovery.")
        and not _is_decisions(module)
        and any(_is_decisions(target) for target in imports_of(module))
    )
    assert callers == ["recovery.jobs"]
    decisions = {m for m in RECOVERY_FLOORS if _is_decisions(m) and m != DECISIONS}
    below = set(RECOVERY_FLOORS) - decisions - {DECISIONS, "recovery.jobs"}
    assert decisions and min(map(_recovery_floor, decisions)) > max(map(_recovery_floor, below))


# Inside recovery, each module's floor: a module imports only recovery modules on lower floors.
# A new module must be given its floor here, which is where its place in the layering is decided.
# A package's ``__init__`` holds only a docstring naming its modules: it imports nothing, so it
# stands on the ground floor (importing ``from recovery.unwinds import advance`` imports it too).
RECOVERY_FLOORS = {
    # What everything stands on: the models and the plumbing (queues, compensator calls, mail).
    "recovery": 0,
    "recovery.notifications": 0,
    "recovery.unwinds": 0,
    "recovery.services": 0,
    "recovery.models": 0,
    "recovery.queueing": 0,
    "recovery.compensators": 0,
    "recovery.slack": 0,
    # Telling people and agents: raising a notification, pushing a command; delivering a row.
    "recovery.notifications.outbox": 2,
    "recovery.notifications.command_push": 1,
    "recovery.notifications.delivery": 3,
    # Pruning the outbox's finished rows (over the models; the batches are ledger.pruning's).
    "recovery.notifications.prune": 1,
    "recovery.planner": 1,
    "recovery.trail": 1,
    # An approval's deadline in words (the inbox card, notifications, Slack).
    "recovery.deadline_words": 1,
    # Checking a compensator with the protocol's harmless calls (over the compensator calls).
    "recovery.compensator_checks": 1,
    # The worker process surviving Redis outages (over nothing of recovery: rq and the filesystem).
    "recovery.worker_liveness": 0,
    # The periodic duties' "anything due?" questions and the ticker (over the approval deadlines;
    # it runs the duties through the worker command, which hands it recovery.jobs).
    "recovery.scheduling": 5,
    # The engine's Prometheus metrics: counted where steps move, read from the models when scraped.
    "recovery.metrics": 1,
    "recovery.admin": 4,
    # Each object's own transitions.
    "recovery.items": 3,
    "recovery.approvals": 3,
    "recovery.commands": 3,
    "recovery.channels": 3,
    # The reads, and the engine over the objects it moves: what every verb of it shares, then
    # create, claim and finish, then advance (which claims and finishes) and the operator's
    # moves, then the runner (which records an outcome and advances); the sweeper over it all.
    "recovery.selectors": 4,
    # Approval deadlines as the sweeps keep them: reminders, escalation (over the approvals).
    "recovery.approval_deadlines": 4,
    "recovery.unwinds.state": 4,
    "recovery.unwinds.dispatch": 4,
    "recovery.unwinds.create": 5,
    "recovery.unwinds.claim": 5,
    "recovery.unwinds.finish": 5,
    "recovery.unwinds.advance": 6,
    "recovery.unwinds.moves": 6,
    "recovery.unwinds.runner": 7,
    "recovery.sweeper": 8,
    # Which decisions are possible now, and refusals in words (over the engine's state sets).
    "recovery.decisions": 5,
    # The decisions the UI and the API call (refusals audited under each; compensating under the
    # reports that auto-compensate and the bulk decisions; the periodic duties over approving and
    # the reports), then what the worker runs.
    "recovery.services.refusals": 9,
    "recovery.services.approving": 10,
    "recovery.services.compensating": 10,
    "recovery.services.resolving": 10,
    "recovery.services.cancelling": 10,
    "recovery.services.reports": 11,
    "recovery.services.bulk": 11,
    # The bulk's worker half (lanes, claims, the authority re-check) under its service half.
    "recovery.services.bulk_worker": 11,
    "recovery.services.bulk_filter": 12,
    "recovery.services.periodic": 12,
    "recovery.jobs": 13,
    # The audit stream to a SIEM: its sinks and messages, how they are sent, the cursor moving.
    "recovery.audit_stream": 0,
    # Bulk decisions by filter: their own tables (the decisions are recovery.services.bulk_filter).
    "recovery.bulk": 0,
    "recovery.bulk.models": 0,
    "recovery.audit_stream.models": 0,
    "recovery.audit_stream.config": 1,
    "recovery.audit_stream.records": 1,
    "recovery.audit_stream.transport": 3,
    "recovery.audit_stream.delivery": 4,
    # Retention: each tenant's window and destination, what belongs to a run, its files written,
    # its removal, and the pass over every tenant (over the audit stream's delivery: a run is
    # archived only once the stream has its events).
    "recovery.archive": 0,
    "recovery.archive.policy": 1,
    "recovery.archive.records": 1,
    "recovery.archive.write": 2,
    "recovery.archive.remove": 3,
    "recovery.archive.runner": 5,
}


def _recovery_floor(module: str) -> int:
    if module.startswith(
        (
            "recovery.migrations",
            "recovery.management",
            "recovery.audit_stream.migrations",
            "recovery.bulk.migrations",
        )
    ):
        return 14 if module.startswith("recovery.management") else 0
    return RECOVERY_FLOORS[module]


def test_it_gives_every_recovery_module_a_floor():
    unplaced = sorted(
        m
        for m in MODULES
        if m.split(".")[0] == "recovery"
        and m not in RECOVERY_FLOORS
        and not m.startswith(
            (
                "recovery.migrations",
                "recovery.management",
                "recovery.audit_stream.migrations",
                "recovery.bulk.migrations",
            )
        )
    )
    assert unplaced == []


def test_it_keeps_recovery_layered_items_engine_decisions():
    upward = {
        module: sorted(
            t
            for t in imports_of(module)
            if t.split(".")[0] == "recovery"
            and t in MODULES
            and _recovery_floor(t) >= _recovery_floor(module)
        )
        for module in MODULES
        if module.split(".")[0] == "recovery" and module in RECOVERY_FLOORS
    }
    assert {module: targets for module, targets in upward.items() if targets} == {}


def _cycles() -> list[list[str]]:
    """Every import cycle among ``MODULES``, each as the path that closes it."""
    graph = {module: {t for t in imports_of(module) if t in MODULES} for module in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_it_has_no_import_cycles():
    assert _cycles() == []


def test_it_catches_a_cycle_in_the_harness(tmp_path, monkeypatch):
    """The harness is held to the same rule: two of its modules importing each other, one of them
    inside a function, are a cycle."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("def f():\n    from bench import rogue_second\n")
    second.write_text("from bench.rogue_first import f\n")
    monkeypatch.setitem(MODULES, "bench.rogue_first", first)
    monkeypatch.setitem(MODULES, "bench.rogue_second", second)
    assert ["bench.rogue_first", "bench.rogue_second", "bench.rogue_first"] in _cycles()


def _unit(module: str) -> str:
    """What a reader learns as one room: a sub-package (``ledger.policies``, ``recovery.unwinds``)
    with everything in it, or a module standing directly in its app (``ledger.upstreams``)."""
    parts = module.split(".")
    package = ".".join(parts[:2])
    if len(parts) > 2 and MODULES.get(package, Path()).name == "__init__.py":
        return package
    return module


def _unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        for target in imports_of(module):
            if target in MODULES and _unit(target) != _unit(module):
                graph.setdefault(_unit(module), set()).add(_unit(target))
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        unit = todo.pop()
        if unit not in seen:
            seen.add(unit)
            todo.extend(graph.get(unit, ()))
    return seen


def _cycles_between_units(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of rooms that reach each other (more than one room each), each sorted."""
    reach = {unit: _reachable(graph, unit) for unit in graph}
    groups = {
        tuple(sorted({unit} | {other for other in reach[unit] if unit in reach.get(other, set())}))
        for unit in graph
        if unit in reach[unit]
    }
    return [list(group) for group in sorted(groups)]


def test_it_has_no_cycles_between_packages():
    """A module-level check lets ``policies.load → upstreams → services.actions.compensation →
    policies.resolve`` pass, though a reader must learn those three rooms together: a room is a
    sub-package or a module standing in its app, and no two rooms import each other, however
    indirectly."""
    assert _cycles_between_units(_unit_graph()) == []


def test_it_sees_a_cycle_between_packages():
    # The check can fail: the loop this test was written for is found.
    looped = {"ledger.policies": {"ledger.upstreams"}, "ledger.upstreams": {"ledger.services"}}
    looped["ledger.services"] = {"ledger.policies"}
    assert _cycles_between_units(looped) == [["ledger.policies", "ledger.services", "ledger.upstreams"]]
    assert (
        _unit("ledger.policies.load") == "ledger.policies" and _unit("ledger.upstreams") == "ledger.upstreams"
    )


def test_it_keeps_the_client_free_of_the_server():
    offenders = {
        module: sorted(imports_of(module) & SERVER_AND_FRAMEWORKS)
        for module in MODULES
        if module.startswith("saga_client")
    }
    assert {module: names for module, names in offenders.items() if names} == {}


# The server's distribution (pyproject.toml) does not carry the client: what the server shares with
# it (the webhook signature) it implements itself (infra.signing, proved against the client's by
# clients/spec/vectors/signatures.json). Only the demo's agents are integrators, playing the client
# against the server from ``seed_demo``, a development command; nothing else reaches them.
CLIENT_USERS = {"demo.agents", "demo.mcp_agent"}


def test_it_keeps_the_server_free_of_the_client():
    # The harness is not the server: like the tests, it drives the product as an integrator does.
    server = [module for module in MODULES if not module.startswith(("saga_client", "bench"))]
    importers = {
        module for module in server if any(name.split(".")[0] == "saga_client" for name in imports_of(module))
    }
    assert importers == CLIENT_USERS
    reaching = {module for module in server if imports_of(module) & CLIENT_USERS} - CLIENT_USERS
    assert reaching == {"demo.management.commands.seed_demo"}


def test_it_catches_a_hidden_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a ledger module importing recovery inside a function, or by
    name through importlib, is an upward import all the same."""
    rogue = tmp_path / "rogue.py"
    rogue.write_text(
        "import importlib\n"
        "def f():\n    from recovery import services\n"
        "def g():\n    return importlib.import_module('saga_admin.api.app')\n"
    )
    monkeypatch.setitem(MODULES, "ledger.rogue", rogue)
    assert {"recovery.services", "saga_admin.api.app"} <= imports_of("ledger.rogue")
    assert all(
        _layer(target) > _layer("ledger.rogue") for target in ("recovery.services", "saga_admin.api.app")
    )


# The size budget: a module over 700 lines holds more than one job; split it by verb family (one
# module per family, as ``ledger/services/`` is split by entity). Counted in the apps, the client,
# scripts/ and the benchmark harness (bench/); not in migrations (generated), tests or demo/.
SIZE_BUDGET = 700
BUDGETED = ("ledger", "recovery", "dashboard", "saga_admin", "clients/python/saga_client", "scripts", "bench")


def _budgeted_modules() -> dict[str, int]:
    """Every budgeted module's path (from the repository's root) and its length in lines."""
    lengths = {}
    for folder in BUDGETED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if {"migrations", "tests"} & set(relative.parts):
                continue
            lengths[relative.as_posix()] = len(path.read_text().splitlines())
    return lengths


def test_it_counts_the_lines_of_the_modules_it_budgets():
    # A budget that counted nothing would pass vacuously.
    lengths = _budgeted_modules()
    assert {"ledger/models.py", "saga_admin/settings.py", "clients/python/saga_client/errors.py"} <= set(
        lengths
    )
    assert "scripts/devservers.py" in lengths and lengths["ledger/models.py"] > 100
    assert not any("/migrations/" in path for path in lengths)


def test_it_keeps_every_module_within_the_size_budget():
    over = {path: lines for path, lines in _budgeted_modules().items() if lines > SIZE_BUDGET}
    assert over == {}, f"modules over {SIZE_BUDGET} lines (split them by verb family): {over}"
