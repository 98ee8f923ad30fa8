"""The alert rules under deploy/prometheus as Prometheus's own checker reads them (Debian's
``promtool``, installed by ``make promtool``): ``promtool check rules``, the rules' unit tests
(``promtool test rules saga-admin-rules.test.yml``: each alert firing, and silent before its
``for:`` runs out or at its threshold), that every alert has such a test, and that every
``runbook_url`` is a section of docs/OPERATIONS.md. A real scrape of the web and of a worker
through ``promtool check metrics``: tests/test_metrics_live.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from tests.support import promql
from tests.support.promtool import check_metrics, promtool
from tests.test_docs_links import anchors

RULES_DIR = promql.RULES.parent
RULE_TESTS = RULES_DIR / "saga-admin-rules.test.yml"
OPERATIONS = promql.ROOT / "docs" / "OPERATIONS.md"
# Where the rules file says the runbooks are (its header: replace the base with your docs' place).
RUNBOOK_BASE = "https://git.example.com/saga-admin/blob/main/docs/OPERATIONS.md"


def _alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in promql.load_rules()["groups"] for rule in group["rules"]}


def test_promtool_checks_the_rules_file() -> None:
    done = promtool("check", "rules", str(promql.RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout


def test_the_rules_unit_tests_pass() -> None:
    done = promtool("test", "rules", RULE_TESTS.name, cwd=RULES_DIR)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_unit_tests_can_fail(tmp_path: Path) -> None:
    """The same tests against rules with one threshold moved: promtool says which alert broke."""
    for path in (promql.RULES, RULE_TESTS):
        shutil.copy(path, tmp_path / path.name)
    rules = tmp_path / promql.RULES.name
    text = rules.read_text()
    assert text.count("saga_unwind_step_oldest_in_flight_seconds) > 900") == 1
    rules.write_text(
        text.replace(
            "saga_unwind_step_oldest_in_flight_seconds) > 900",
            "saga_unwind_step_oldest_in_flight_seconds) > 899",
        )
    )
    done = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert done.returncode != 0 and "name: SagaUnwindStuck" in done.stdout + done.stderr, (
        done.stdout + done.stderr
    )


def test_every_alert_is_tested_firing_and_silent() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [promql.RULES.name]
    fired: set[str] = set()
    silent: set[str] = set()
    for group in tests["tests"]:
        for case in group["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    assert fired == set(_alerts()), sorted(set(_alerts()) ^ fired)
    assert silent == set(_alerts()), sorted(set(_alerts()) ^ silent)


def test_every_alert_has_a_runbook_section_in_operations_md() -> None:
    sections = anchors(OPERATIONS.read_text(encoding="utf-8"))
    for name, rule in _alerts().items():
        url = rule["annotations"].get("runbook_url", "")
        parts = urlsplit(url)
        assert url.startswith(f"{RUNBOOK_BASE}#"), (name, url)
        assert parts.fragment in sections, (
            f"{name}: {url}: no heading #{parts.fragment} in docs/OPERATIONS.md"
        )
        # Its own section, named for it: the runbook an on-call person lands on is this alert's.
        assert parts.fragment == name.lower(), (name, url)
    assert f"{RUNBOOK_BASE.rsplit('/docs/', 1)[0]}/docs/" in promql.RULES.read_text()  # the header says so


def test_check_metrics_refuses_what_it_refused_in_our_scrapes() -> None:
    """The checker the live scrapes go through (tests/test_metrics_live.py) can fail: django-rq's
    summary named as a counter, as every scrape carried it before our namespace filter."""
    refused = (
        "# HELP rq_request_processing_seconds_total x\n# TYPE rq_request_processing_seconds_total summary\n"
    )
    refused += "rq_request_processing_seconds_total_count 0.0\nrq_request_processing_seconds_total_sum 0.0\n"
    try:
        check_metrics(refused)
    except AssertionError as exc:
        assert 'non-counter metrics should not have "_total" suffix' in str(exc)
    else:
        raise AssertionError("promtool accepted a summary named _total")
    check_metrics("# HELP saga_up x\n# TYPE saga_up gauge\nsaga_up 1.0\n")
