"""The layering (docs/README.md, "Where things are"), read from the code's own imports; and the size
budget every module keeps.

Dependencies point down: ``saga_client`` (no server code at all; the server imports it only in
the demo's agents) ← ``infra`` (the platform: configuration, errors, outbound requests,
observability) ← ``ledger`` (the record) ←
``recovery`` (the decisions) ← ``saga_admin.api`` and ``dashboard`` (HTTP and pages, peers that do
not import each other) ← the project shell (``saga_admin`` settings and urls) and ``demo`` ←
``bench`` (the benchmark harness: a tool over all of it, which nothing imports; the installed
distribution does not carry it).
Inside ``recovery`` the modules stand in groups (``RECOVERY_GROUPS``): the models and plumbing, the
single-object transitions the engine makes, the reads and the engine, the one write layer
(``recovery.actions``), and what calls it (the jobs, the admin, the management commands).

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
            # ``from recovery import actions`` depends on the module recovery.actions.
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
        "recovery.actions.compensations",
        "saga_admin.api.app",
        "dashboard.views.queue",
    } <= set(MODULES)
    assert "recovery.transitions.items" in imports_of("recovery.actions.compensations")
    assert "ledger.services.runs" in imports_of("recovery.actions.compensations")
    # A package's ``__init__`` is a module too (``from recovery.unwinds import advance`` imports both).
    assert {"recovery.unwinds", "recovery.unwinds.advance"} <= imports_of("recovery.actions.approvals")
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


# Inside recovery, the groups in order, lowest first: a module imports only recovery modules of its
# own group or a lower one. Inside a group anything may import anything but a cycle (the cycle
# test above covers every module). A module's group is that of the longest prefix naming it, so a
# new module of a sub-package joins its package's group; a new top-level module must be named here,
# which is where its place in the layering is decided.
RECOVERY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # The models and the plumbing: queues, compensator calls, telling people and agents (the
    # notification outbox, command pushes, Slack's shapes), the planner, the trail, the metrics, and
    # the sub-packages that are their own tables and duties (the audit stream, retention, the bulk
    # tables) over nothing of the rest.
    (
        "plumbing",
        (
            "recovery",
            "recovery.models",
            "recovery.grant_models",
            "recovery.queueing",
            "recovery.compensators",
            "recovery.compensator_checks",
            "recovery.readers",
            "recovery.slack",
            "recovery.worker_liveness",
            "recovery.metrics",
            "recovery.planner",
            "recovery.trail",
            "recovery.deadline_words",
            "recovery.notifications",
            "recovery.audit_stream",
            "recovery.archive",
            "recovery.bulk",
        ),
    ),
    # Single-object transitions the engine itself makes (an item leaving the queue when its unwind
    # finishes, a step's approval asked for or withdrawn): below the engine so that it can call them.
    ("transitions", ("recovery.transitions",)),
    # The reads and the engine: the queue's selectors, which decisions are possible now, approval
    # deadlines as the sweeps keep them, the unwind engine, the sweeper and the ticker.
    (
        "engine",
        (
            "recovery.selectors",
            "recovery.decisions",
            "recovery.approval_deadlines",
            "recovery.unwinds",
            "recovery.sweeper",
            "recovery.scheduling",
        ),
    ),
    # The one write layer: the service functions the UI, the API, Slack and the bulk job call.
    ("actions", ("recovery.actions",)),
    # What runs the actions: the worker's jobs, the Django admin and the management commands.
    ("callers", ("recovery.jobs", "recovery.admin", "recovery.management")),
)
RECOVERY_MIGRATIONS = ("recovery.migrations", "recovery.audit_stream.migrations", "recovery.bulk.migrations")


def _recovery_group(module: str) -> int | None:
    """The index of the module's group in RECOVERY_GROUPS (None for a module no group names)."""
    best: tuple[int, int] | None = None  # (prefix length, group)
    for index, (_name, prefixes) in enumerate(RECOVERY_GROUPS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(f"{prefix}.")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), index)
    return best[1] if best else None


def _recovery_modules() -> list[str]:
    return [m for m in MODULES if m.split(".")[0] == "recovery" and not m.startswith(RECOVERY_MIGRATIONS)]


def _recovery_upward() -> dict[str, list[str]]:
    """Each recovery module's imports of a recovery module in a higher group."""
    upward = {}
    for module in _recovery_modules():
        group = _recovery_group(module)
        assert group is not None, module
        targets = sorted(
            t
            for t in imports_of(module)
            if t.split(".")[0] == "recovery"
            and t in MODULES
            and not t.startswith(RECOVERY_MIGRATIONS)
            and (_recovery_group(t) or 0) > group
        )
        if targets:
            upward[module] = targets
    return upward


def test_it_gives_every_recovery_module_a_group():
    unplaced = sorted(m for m in _recovery_modules() if _recovery_group(m) is None)
    assert unplaced == []
    # The groups named are the ones the code has: a prefix naming no module is a stale entry.
    stale = sorted(
        prefix
        for _name, prefixes in RECOVERY_GROUPS
        for prefix in prefixes
        if not any(m == prefix or m.startswith(f"{prefix}.") for m in _recovery_modules())
    )
    assert stale == []


def test_it_keeps_recovery_layered_plumbing_transitions_engine_actions_callers():
    assert _recovery_upward() == {}


def test_it_keeps_the_actions_on_top_of_recovery():
    """Nothing in recovery below the callers imports the write layer but the write layer itself."""
    actions = next(i for i, (name, _prefixes) in enumerate(RECOVERY_GROUPS) if name == "actions")
    callers = sorted(
        module
        for module in _recovery_modules()
        if (_recovery_group(module) or 0) < actions
        and any(_recovery_group(t) == actions for t in imports_of(module) if t.split(".")[0] == "recovery")
    )
    assert callers == []
    assert _recovery_group("recovery.actions.approvals") == actions
    assert _recovery_group("recovery.unwinds.runner") == actions - 1


def test_it_catches_an_upward_import_inside_recovery(tmp_path, monkeypatch):
    """The group rule can fail: the engine calling an action (inside a function, even) is upward."""
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f():\n    from recovery.actions import approvals\n")
    monkeypatch.setitem(MODULES, "recovery.unwinds.rogue", rogue)
    assert _recovery_upward() == {
        "recovery.unwinds.rogue": ["recovery.actions", "recovery.actions.approvals"]
    }


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
        "def f():\n    from recovery import actions\n"
        "def g():\n    return importlib.import_module('saga_admin.api.app')\n"
    )
    monkeypatch.setitem(MODULES, "ledger.rogue", rogue)
    assert {"recovery.actions", "saga_admin.api.app"} <= imports_of("ledger.rogue")
    assert all(
        _layer(target) > _layer("ledger.rogue") for target in ("recovery.actions", "saga_admin.api.app")
    )


# The size budget: a module over 700 lines holds more than one job; split it by verb family (one
# module per family, as ``ledger/services/`` is split by entity). Counted in the apps, the client,
# scripts/ and the benchmark harness (bench/); not in migrations (generated), tests or demo/.
SIZE_BUDGET = 700
BUDGETED = (
    "infra",
    "ledger",
    "recovery",
    "dashboard",
    "saga_admin",
    "clients/python/saga_client",
    "scripts",
    "bench",
)


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
