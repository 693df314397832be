"""The alert rules and the dashboard of deploy/observability against the metric
catalogue: every metric they name is one the service defines (docs/metrics.md), each
rule carries what an on-call engineer and Alertmanager need, and each panel queries
something. promtool is not installed here, so PromQL is checked cheaply: balanced
brackets, no empty expression, counters and histogram series only as range vectors."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs installed; read as Any

from tests.fixtures.metrics import catalogue

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "observability"
ALERTS = DEPLOY / "alerts.yaml"
DASHBOARD = DEPLOY / "dashboard.json"

SEVERITIES = {"page", "ticket"}

# Prometheus' own series, not ours: `up` is the scrape health of a target (the rules
# read it for the worker's ops endpoint).
ALLOWED_FOREIGN = {"up"}

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# PromQL words that are not metric names: functions, aggregations, keywords. A word
# outside this set and the catalogue fails the test, so a typo in either shows up.
PROMQL_WORDS = {
    "abs", "absent", "absent_over_time", "and", "avg", "avg_over_time", "bool", "by",
    "ceil", "changes", "clamp_max", "clamp_min", "count", "count_over_time", "delta",
    "deriv", "floor", "group_left", "group_right", "histogram_quantile", "idelta",
    "ignoring", "increase", "irate", "label_replace", "max", "max_over_time", "min",
    "min_over_time", "offset", "on", "or", "predict_linear", "quantile", "rate",
    "resets", "round", "sort", "sort_desc", "sum", "sum_over_time", "time", "topk",
    "bottomk", "unless", "vector", "without",
}  # fmt: skip

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_VARIABLE = re.compile(r"\$\{\w+\}|\$\w+")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# A selector of ours (name, optional matchers) and whether a range follows it.
_SELECTOR = re.compile(r"\b((?:tool_dispatcher|outbox_relay)_\w+)\s*(\{[^{}]*\})?\s*(\[)?")


def _strip(expr: str) -> str:
    """The expression without what is not a metric name: strings, dashboard variables,
    label matchers, grouping label lists, ranges and numbers."""
    out = _STRING.sub('""', expr)
    out = _VARIABLE.sub("1", out)
    out = _MATCHERS.sub("", out)
    out = _GROUPING.sub(r"\1", out)
    return _RANGE.sub("", out)


def metric_names(expr: str) -> set[str]:
    """Every word of ``expr`` that is neither a PromQL word nor a number: the metrics."""
    return {
        word
        for word in _WORD.findall(_strip(expr))
        if word not in PROMQL_WORDS and not re.fullmatch(r"[eE]\d*|Inf|NaN", word)
    }


def unknown_metrics(expr: str) -> set[str]:
    """The metric names of ``expr`` the catalogue does not define (a histogram's
    ``_bucket``, ``_sum`` and ``_count`` series are its own)."""
    types = {entry.name: entry.type for entry in catalogue()}
    unknown = set()
    for name in metric_names(expr) - ALLOWED_FOREIGN:
        base = re.sub("(" + "|".join(HISTOGRAM_SUFFIXES) + ")$", "", name)
        if name not in types and types.get(base) != "histogram":
            unknown.add(name)
    return unknown


def syntax_problems(expr: str) -> list[str]:
    """What promtool would reject that is cheap to see: empty, unbalanced brackets, a
    counter or histogram series read as an instant vector (it needs rate/increase)."""
    if not expr.strip():
        return ["empty expression"]
    problems = []
    depth: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in _STRING.sub('""', expr):
        if char in "([{":
            depth.append(char)
        elif char in pairs and (not depth or depth.pop() != pairs[char]):
            problems.append(f"unbalanced {char!r}")
    problems += [f"unclosed {opened!r}" for opened in depth]
    types = {entry.name: entry.type for entry in catalogue()}
    for name, _, ranged in _SELECTOR.findall(_VARIABLE.sub("1m", expr)):
        cumulative = types.get(name) == "counter" or name.endswith(HISTOGRAM_SUFFIXES)
        if cumulative and not ranged:
            problems.append(f"{name} is cumulative: read it through rate() or increase()")
    return problems


def rules(path: Path = ALERTS) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def rule_problems(rule: dict[str, Any]) -> list[str]:
    """What a rule lacks that Prometheus or the on-call engineer needs."""
    problems = [f"no {key}" for key in ("alert", "expr", "for") if not rule.get(key)]
    severity = (rule.get("labels") or {}).get("severity")
    if severity not in SEVERITIES:
        problems.append(f"severity {severity!r} not in {sorted(SEVERITIES)}")
    if not (rule.get("annotations") or {}).get("summary"):
        problems.append("no annotations.summary")
    expr = str(rule.get("expr") or "")
    problems += syntax_problems(expr)
    problems += [f"{name} is not in docs/metrics.md" for name in sorted(unknown_metrics(expr))]
    return problems


def panels(path: Path = DASHBOARD) -> Iterator[dict[str, Any]]:
    """Every panel of the dashboard, those nested in a collapsed row included."""
    for panel in json.loads(path.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_problems(panel: dict[str, Any]) -> list[str]:
    if panel.get("type") == "row":
        return []
    problems = [] if panel.get("title") else ["no title"]
    targets = panel.get("targets") or []
    if not targets:
        problems.append("no target")
    for target in targets:
        expr = str(target.get("expr") or "")
        problems += syntax_problems(expr)
        problems += [f"{n} is not in docs/metrics.md" for n in sorted(unknown_metrics(expr))]
    return problems


def test_the_rule_file_has_one_rule_per_alert_the_issue_asks_for() -> None:
    names = [rule["alert"] for rule in rules()]
    # The service's seven, retention's two (behind, not running), bus intake's three
    # (lag growing, records refused, a request topic come back as a new log), the
    # circuit breaker's one (open) and the webhook sender's one (dead deliveries).
    assert len(names) == len(set(names)) == 14


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: str(rule.get("alert")))
def test_every_rule_is_complete_and_names_only_catalogued_metrics(rule: dict[str, Any]) -> None:
    assert rule_problems(rule) == []


def test_the_dashboard_has_a_datasource_variable_and_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert list(panels())


@pytest.mark.parametrize("panel", list(panels()), ids=lambda panel: str(panel.get("title")))
def test_every_panel_has_a_title_and_queries_catalogued_metrics(panel: dict[str, Any]) -> None:
    assert panel_problems(panel) == []


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("max(tool_dispatcher_calls)", set()),
        ("max(tool_dispatcher_call)", {"tool_dispatcher_call"}),
        ("rate(tool_dispatcher_dispatch_seconds_bucket[5m])", set()),
        # `_total` belongs to a counter's catalogued name; a gauge has no `_bucket`.
        ("rate(tool_dispatcher_transitions[5m])", {"tool_dispatcher_transitions"}),
        ("tool_dispatcher_calls_bucket", {"tool_dispatcher_calls_bucket"}),
        ('sum(up{job="x"}) == 0 or absent(up{job="x"})', set()),
        ('max(node_load1{a="tool_dispatcher_nope"})', {"node_load1"}),
        ("sum by (le) (rate(tool_dispatcher_dispatch_seconds_bucket[$__rate_interval]))", set()),
    ],
)
def test_the_metric_check_sees_every_name_and_only_names(expr: str, expected: set[str]) -> None:
    assert unknown_metrics(expr) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "max(tool_dispatcher_calls",
        "rate(tool_dispatcher_transitions_total[5m)",
        "sum(tool_dispatcher_transitions_total)",
        "histogram_quantile(0.9, sum by (le) (tool_dispatcher_dispatch_seconds_bucket))",
    ],
)
def test_the_syntax_check_rejects_broken_expressions(expr: str) -> None:
    assert syntax_problems(expr) != []
