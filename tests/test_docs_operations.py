"""docs/OPERATIONS.md names only what exists: every ``SAGA_*`` variable is read by the code, every
command it tells an operator to run is one, every metric of its table is one the scrape exposes
(``tests/test_metrics.py``'s ``NAMED``, which a real scrape checks), every alert of its table is
a rule of the rules file and every rule is in the table, every log event it names is one the code
logs, and every test, test file and repository path it cites exists."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from django.core.management import get_commands

from tests.test_docs_security import _tests_in
from tests.test_metrics import NAMED

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "OPERATIONS.md"
# Where a setting is read or set: the code, and the files that ship its configuration.
SOURCES = ("saga_admin", "infra", "ledger", "recovery", "dashboard", "scripts", "deploy")
SHIPPED = ("compose.yaml", "Dockerfile", "Procfile", "Makefile")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _code() -> str:
    files = [path for folder in SOURCES for path in (ROOT / folder).rglob("*") if path.is_file()]
    files += [ROOT / name for name in SHIPPED]
    texts = []
    for path in files:
        if path.suffix in {".pyc", ".png", ".ico", ".woff2"} or "node_modules" in path.parts:
            continue
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def _section(title: str) -> str:
    text = _doc()
    start = text.index(f"\n{title}\n")
    end = text.find("\n#", start + len(title) + 2)
    return text[start : end if end != -1 else None]


def _table_first_column(section: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)`", section, re.M)]


def test_every_saga_variable_it_names_is_read_by_the_code() -> None:
    code = _code()
    named = set(re.findall(r"\bSAGA_[A-Z0-9_]*[A-Z0-9]\b", _doc()))
    assert len(named) > 40
    missing = []
    for name in sorted(named):
        if name in code:
            continue
        # NAME_FILE: any secret read through infra.env.env_secret("NAME") takes it.
        base = name.removesuffix("_FILE")
        if base != name and f'env_secret("{base}"' in code:
            continue
        missing.append(name)
    assert missing == [], f"docs/OPERATIONS.md names variables the code never reads: {missing}"


def test_every_command_it_tells_an_operator_to_run_exists() -> None:
    text = _doc()
    commands = set(get_commands())
    named = set(re.findall(r"python -m saga_admin (\w+)", text))
    # Commands named on their own in code spans: `prune`, `verify_audit --archive …`.
    named |= {word for word in re.findall(r"`(\w+)(?: [^`]*)?`", text) if word in commands}
    missing = sorted(name for name in named if name not in commands)
    assert missing == [], f"docs/OPERATIONS.md names commands that do not exist: {missing}"
    assert {"archive_runs", "prune", "verify_audit", "verify_audit_stream"} <= named


def test_every_metric_of_its_table_is_exposed_and_every_exposed_one_is_in_it() -> None:
    table = _section("### The metrics")
    documented: set[str] = set()
    for cell in _table_first_column(table):
        documented.add(cell)
    # `saga_database_up`, `saga_redis_up` share a row.
    documented |= set(re.findall(r"^\| `\w+`, `(\w+)`", table, re.M))
    exposed = {name.removesuffix("_bucket") for name in NAMED}
    assert documented == exposed, (
        f"in the doc only: {sorted(documented - exposed)}; exposed but undocumented: {sorted(exposed - documented)}"
    )


def test_every_alert_of_its_table_is_a_rule_and_every_rule_is_in_it() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "saga-admin-rules.yml").read_text())
    defined = {
        rule["alert"]: rule["labels"]["severity"] for group in rules["groups"] for rule in group["rules"]
    }
    table = _section("### Alert rules")
    documented: dict[str, str] = {}
    for row in re.finditer(r"^\| (`Saga\w+`(?:, `Saga\w+`)*) \|.*\| (\w+) \|$", table, re.M):
        for name in re.findall(r"`(\w+)`", row.group(1)):
            documented[name] = row.group(2)
    assert documented == defined, f"docs/OPERATIONS.md: {documented}; the rules file: {defined}"


def test_every_log_event_it_names_is_logged() -> None:
    code = _code()
    table = _section("### What went wrong, in the logs")
    rows = re.findall(r"^\| (`[\w.]+`(?:, `[\w.]+`)*) \| (\w+)", table, re.M)
    assert len(rows) >= 9 and {level for _names, level in rows} == {"warning", "error"}
    named = {name for names, _level in rows for name in re.findall(r"`([\w.]+)`", names)}
    # And the events named elsewhere: `sso.…`, `scheduling.…`, `metrics.…`, `worker.…`.
    named |= set(re.findall(r"`((?:sso|scheduling|metrics|worker)\.[a-z_]+)`", _doc()))
    missing = sorted(name for name in named if f'"{name}"' not in code)
    assert missing == [], f"docs/OPERATIONS.md names log events the code never logs: {missing}"


def test_every_test_it_cites_exists() -> None:
    text = _doc()
    cited = set(re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?", text))
    assert len(cited) >= 10
    for module, test in sorted(cited):
        path = ROOT / module
        assert path.exists(), f"docs/OPERATIONS.md cites {module}, which does not exist"
        if test:
            assert test in _tests_in(path), f"docs/OPERATIONS.md cites {module}::{test}, which does not exist"


def _exists(path: str) -> bool:
    # `ledger/0013` is that app's migration 0013.
    app, _, number = path.partition("/")
    if number.isdigit():
        return any((ROOT / app / "migrations").glob(f"{number}_*.py"))
    return (ROOT / path).exists()


def test_every_repository_path_it_names_exists() -> None:
    text = _doc()
    named = set(
        re.findall(r"`((?:deploy|infra|saga_admin|recovery|ledger|dashboard|scripts)/[\w./-]*[\w/])`", text)
    )
    assert len(named) >= 10
    missing = sorted(path for path in named if not _exists(path))
    assert missing == [], f"docs/OPERATIONS.md names paths that do not exist: {missing}"
