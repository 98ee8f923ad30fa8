"""Every change of a ``status`` column goes through ``ledger.transitions`` (``compare_and_set``,
``try_compare_and_set``, ``compare_and_set_rows``), read from the code itself: one place decides
which state may follow which, and how a lost race looks.

A module writes a status directly when it passes ``status`` to a queryset's ``update`` (or to
``update_or_create``'s defaults), names it in ``save(update_fields=…)`` or ``bulk_update(…)``,
spreads into one of those a dict it put a ``status`` in, assigns ``obj.status`` and then saves
``obj`` whole, or runs SQL that sets it. Inserts (``create``, ``bulk_create``, the benchmark
seeding's COPY) are a row's first state, not a change, and are not counted. A bulk item's
``outcome`` is its status under another name, and is held to the same rule.

Left out, each for its reason: the helper itself; migrations, which run against the historical
models of their time (neither the helper nor today's tables describe those); and the test suite,
which sets up states to test from (it is not under the folders read).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("ledger", "recovery", "saga_admin", "dashboard", "infra")
HELPER = "ledger/transitions.py"
WRITES = {"update", "update_or_create", "bulk_update", "save"}
# The state columns: every model's ``status``, and a bulk item's ``outcome``.
STATES = frozenset({"status", "outcome"})
# ``UPDATE … SET … status =`` before any WHERE (a WHERE comparing the status is a read).
SQL_SETS_STATUS = re.compile(
    rf"\bUPDATE\b.*?\bSET\b(?:(?!\bWHERE\b).)*?\b(?:{'|'.join(sorted(STATES))})\s*=", re.I | re.S
)


def _names_status(node: ast.AST) -> bool:
    """Whether ``node`` names the status column: as a dict key, a list/tuple/set element or a
    keyword."""
    for child in ast.walk(node):
        if isinstance(child, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value in STATES for key in child.keys
        ):
            return True
        if isinstance(child, (ast.List, ast.Tuple, ast.Set)) and any(
            isinstance(elt, ast.Constant) and elt.value in STATES for elt in child.elts
        ):
            return True
        if isinstance(child, ast.Call) and any(k.arg in STATES for k in child.keywords):
            return True
    return False


def _status_dicts(function: ast.AST) -> set[str]:
    """The local names a function puts a ``status`` in: ``x = {"status": …}``, ``x["status"] = …``,
    ``x.update(status=…)``."""
    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if (
                    isinstance(target, ast.Name)
                    and isinstance(node.value, ast.Dict)
                    and _names_status(node.value)
                ):
                    names.add(target.id)
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and isinstance(target.slice, ast.Constant)
                    and target.slice.value in STATES
                ):
                    names.add(target.value.id)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and isinstance(node.func.value, ast.Name)
            and (any(k.arg in STATES for k in node.keywords) or any(_names_status(a) for a in node.args))
        ):
            names.add(node.func.value.id)
    return names


def _status_assigned(function: ast.AST) -> set[str]:
    """The names whose ``.status`` a function assigns (``obj.status = …``, ``a.status, b = …``,
    ``setattr(obj, "status", …)``)."""
    names: set[str] = set()
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for target in node.targets:
                targets.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets.append(node.target)
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr in STATES
                and isinstance(target.value, ast.Name)
            ):
                names.add(target.value.id)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in STATES
        ):
            names.add(node.args[0].id)
    return names


def _writes_status(call: ast.Call, *, carrying: set[str], assigned: set[str]) -> bool:
    """Whether ``call`` (a ``WRITES`` verb) writes a status, given the function's names that carry
    one (``_status_dicts``) and whose ``.status`` it assigned (``_status_assigned``)."""
    assert isinstance(call.func, ast.Attribute)
    verb, receiver = call.func.attr, call.func.value
    fields = next((k.value for k in call.keywords if k.arg == "update_fields"), None)
    spread = [k.value for k in call.keywords if k.arg is None]
    if verb == "save" and fields is None:
        # A whole save writes every column, the status just assigned too.
        return isinstance(receiver, ast.Name) and receiver.id in assigned
    if any(k.arg in STATES for k in call.keywords):
        return True  # a queryset's update, or a dict's on its way to one (``updates.update(status=…)``)
    passed = [*call.args, *(k.value for k in call.keywords)] if verb != "save" else [fields]
    if verb != "update" and any(_names_status(arg) for arg in passed if arg is not None):
        return True  # update_fields, bulk_update's fields, update_or_create's defaults
    if verb == "update" and any(isinstance(s, ast.Dict) and _names_status(s) for s in spread):
        return True
    used = [*spread, *([fields] if fields is not None else [])]
    return any(isinstance(n, ast.Name) and n.id in carrying for expr in used for n in ast.walk(expr))


def _sql_sets_status(tree: ast.AST) -> set[int]:
    """The lines of SQL strings (f-strings' literal parts too) that set a status."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                p.value for p in node.values if isinstance(p, ast.Constant) and isinstance(p.value, str)
            )
        else:
            continue
        if SQL_SETS_STATUS.search(text):
            found.add(node.lineno)
    return found


def _status_writes_in(source: str) -> list[int]:
    """The lines of ``source`` that write a status directly."""
    tree = ast.parse(source)
    found = _sql_sets_status(tree)
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        # Names are followed within a function (the module's own statements: direct writes only).
        local = scope is not tree
        carrying = _status_dicts(scope) if local else set()
        assigned = _status_assigned(scope) if local else set()
        found.update(
            node.lineno
            for node in ast.walk(scope)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and _writes_status(node, carrying=carrying, assigned=assigned)
        )
    return sorted(found)


def _modules() -> list[Path]:
    paths = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if "migrations" in relative.parts or relative.as_posix() == HELPER:
                continue
            paths.append(path)
    return paths


def _direct_writes() -> dict[str, list[int]]:
    writes = {}
    for path in _modules():
        if lines := _status_writes_in(path.read_text()):
            writes[path.relative_to(ROOT).as_posix()] = lines
    return writes


def test_it_reads_the_modules_that_move_states():
    # A walk that read nothing would pass vacuously.
    read = {path.relative_to(ROOT).as_posix() for path in _modules()}
    assert {
        "recovery/transitions/approvals.py",
        "recovery/actions/commands.py",
        "recovery/actions/bulk_worker.py",
        "recovery/notifications/delivery.py",
        "recovery/sweeper.py",
        "ledger/services/runs.py",
    } <= read
    assert HELPER not in read and not any("/migrations/" in path for path in read)


def test_it_moves_every_status_through_the_compare_and_set():
    assert _direct_writes() == {}, "write status through ledger.transitions (compare_and_set and its kin)"


def test_the_helper_is_the_one_that_writes():
    """The exclusion is no blind spot: it holds the one UPDATE (``_move``), of ``status`` unless
    its caller names another state column."""
    tree = ast.parse((ROOT / HELPER).read_text())
    move = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_move")
    defaults = {
        arg.arg: default.value
        for arg, default in zip(move.args.kwonlyargs, move.args.kw_defaults, strict=True)
        if isinstance(default, ast.Constant)
    }
    assert defaults.get("column") == "status"
    spread_updates = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "update"
        and any(k.arg is None for k in n.keywords)
    ]
    assert len(spread_updates) == 1 and spread_updates[0] in list(ast.walk(move))


PLANTED = {
    "queryset update": "def f(rows):\n    rows.filter(pk=1).update(status='done')\n",
    "spread dict literal": "def f(rows):\n    rows.update(**{'status': 'done'})\n",
    "dict built, then spread": (
        "def f(rows, ok):\n    updates = {'at': 1}\n    if ok:\n        updates.update(status='done')\n"
        "    rows.filter(pk=1).update(**updates)\n"
    ),
    "dict literal, then update_fields": (
        "def f(obj):\n    fields = {'status': 'done', 'at': 1}\n    obj.save(update_fields=list(fields))\n"
    ),
    "item set, then spread": "def f(rows):\n    u = {}\n    u['status'] = 'x'\n    rows.update(**u)\n",
    "annotated dict, then spread": "def f(rows):\n    u: dict = {'status': 'x'}\n    rows.update(**u)\n",
    "save with update_fields": "def f(obj):\n    obj.status = 'done'\n    obj.save(update_fields=['status', 'at'])\n",
    "whole save": "def f(obj):\n    obj.status = 'done'\n    obj.save()\n",
    "setattr, whole save": "def f(obj):\n    setattr(obj, 'status', 'done')\n    obj.save()\n",
    "bulk_update": "def f(M, objs):\n    M.objects.bulk_update(objs, ['status'])\n",
    "bulk_update by keyword": "def f(M, objs):\n    M.objects.bulk_update(objs, fields=('at', 'status'))\n",
    "update_or_create": "def f(M):\n    M.objects.update_or_create(pk=1, defaults={'status': 'x'})\n",
    "another state column": "def f(rows):\n    rows.filter(pk=1).update(outcome='done', code='')\n",
    "raw SQL": "def f(c):\n    c.execute('UPDATE t SET at = now(), status = %s WHERE id = %s', [1, 2])\n",
}


def test_it_catches_each_kind_of_direct_write():
    """The walk can fail: each way of writing a status, planted, is found."""
    missed = [name for name, source in PLANTED.items() if not _status_writes_in(source)]
    assert missed == []


def test_it_catches_a_planted_write_among_the_modules(tmp_path, monkeypatch):
    rogue = tmp_path / "recovery" / "rogue.py"
    rogue.parent.mkdir()
    rogue.write_text(PLANTED["queryset update"])
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert _direct_writes() == {"recovery/rogue.py": [2]}


def test_it_leaves_reads_and_other_columns_alone():
    reads = (
        "def f(c, rows, run, row):\n"
        "    c.execute('UPDATE t SET at = %s WHERE status = %s RETURNING status', [1, 2])\n"
        "    rows.filter(status='x').update(job_id='')\n"
        "    run.status, run.at = row[0], 1\n"  # what the database answered, not a write
        "    run.save(update_fields=['at'])\n"
    )
    assert _status_writes_in(reads) == []
