"""The alert rules and the Grafana dashboard under deploy/, read as Prometheus and Grafana read
them: each expression parsed by a real PromQL parser (``promql-parser``), and the metric names it
selects; and the names a ``/metrics`` scrape exposes."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "saga-admin-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "saga-admin-dashboard.json"

# Grafana's own variables ($__rate_interval, $__interval, …) stand for a duration; the dashboard's
# ($tenant, ${tenant}) for a regular expression in a label matcher. Replaced as Grafana would
# before the query reaches Prometheus.
_GRAFANA_DURATION = re.compile(r"\$__\w+|\$\{__\w+\}")
_GRAFANA_VARIABLE = re.compile(r"\$\{\w+\}|\$\w+")
# A template variable's query: Grafana's label_values(selector, label), not PromQL; the selector
# (a metric, with label matchers or not) is.
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$")
# The dashboard's selectors: every panel's every series selector matches each, so one dashboard
# shows one environment, job or instance at a time (Grafana's "All" is the regular expression .*,
# which also matches a series without the label).
SCOPE = {"environment": "$environment", "job": "$job", "instance": "$instance"}


def selected_metrics(expr: str) -> set[str]:
    """Every metric name the expression selects. Raises ValueError when it is not PromQL, and
    AssertionError for a selector without a name (``{__name__=~…}``: nothing to check it by)."""
    names: set[str] = set()
    unnamed: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            else:
                unnamed.append(str(node))

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    assert not unnamed, f"selectors without a metric name in {expr!r}: {unnamed}"
    return names


@dataclass(frozen=True)
class Query:
    where: str  # "rule SagaWorkersGone", "panel 'RQ queue depth' A", "variable tenant"
    expr: str
    # The metrics the server must expose for it: those it selects, less Prometheus's own series.
    metrics: frozenset[str]


def load_rules() -> dict[str, Any]:
    loaded = yaml.safe_load(RULES.read_text())
    assert isinstance(loaded, dict), "the rules file is not a mapping"
    return loaded


# Series Prometheus writes itself for every scrape target, whatever the target exposes.
PROMETHEUS_OWN = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


def rule_queries() -> list[Query]:
    return [
        Query(
            f"rule {rule['alert']}", rule["expr"], frozenset(selected_metrics(rule["expr"]) - PROMETHEUS_OWN)
        )
        for group in load_rules()["groups"]
        for rule in group["rules"]
    ]


def load_dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def grafana_promql(expr: str) -> str:
    """A panel's query as Grafana sends it to Prometheus."""
    return _GRAFANA_VARIABLE.sub(".*", _GRAFANA_DURATION.sub("5m", expr))


def dashboard_queries() -> list[Query]:
    dashboard = load_dashboard()
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            queries.append(
                Query(
                    f"panel {panel['title']!r} {target['refId']}",
                    expr,
                    frozenset(selected_metrics(grafana_promql(expr))),
                )
            )
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = _LABEL_VALUES.match(query)
        assert match, f"variable {variable['name']}: not label_values(selector, label): {query!r}"
        queries.append(
            Query(
                f"variable {variable['name']}",
                match.group(1),
                frozenset(selected_metrics(grafana_promql(match.group(1)))),
            )
        )
    return queries


def unscoped(expr: str, scope: dict[str, str] = SCOPE) -> list[str]:
    """The series selectors of a dashboard expression that do not match every label of ``scope``
    against its variable (``label=~"$variable"``): as written, before Grafana substitutes them."""
    # Each variable stands in as a literal PromQL parses; what stands for a duration, as Grafana's.
    marked = _GRAFANA_VARIABLE.sub(
        lambda m: "VAR_" + m.group(0).strip("${}"), _GRAFANA_DURATION.sub("5m", expr)
    )
    wanted = {(label, "VAR_" + variable.lstrip("$")) for label, variable in scope.items()}
    missing: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matched = {(m.name, m.value) for m in node.matchers.matchers if m.op == promql_parser.MatchOp.Re}
            if not wanted <= matched:
                missing.append(str(node))

    promql_parser.walk(promql_parser.parse(marked), pre_visit=visit)
    return missing


def exposed(text: str) -> dict[str, float]:
    """A scrape's samples: ``'name{a="b",c="d"}'`` (labels sorted) → value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def exposed_names(text: str) -> set[str]:
    return {key.split("{", 1)[0] for key in exposed(text)}


def own_process_samples() -> dict[str, float]:
    """What this process alone has counted (its own files in the multiprocess directory), in the
    form ``exposed`` gives: a test that asserts exact deltas must not see what another process of
    the same directory (a worker or server an earlier test started, still busy) counted meanwhile.
    The scrape across processes is tests/test_metrics_live.py's."""
    import shutil
    import tempfile

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from infra.metrics import multiprocess_dir

    with tempfile.TemporaryDirectory() as folder:
        for file in multiprocess_dir().glob(f"*_{os.getpid()}.db"):
            shutil.copy(file, folder)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=folder)
        return exposed(generate_latest(registry).decode())
