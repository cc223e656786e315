"""A small PromQL reader: which metric names an expression uses.

The dashboards and alert rules must only query series the exporters really
emit (tests/integration/test_metrics_dashboards.py); this finds the names.
It is not a parser: it drops what cannot be a metric name (strings, label
matchers, ranges, grouping label lists, numbers and durations), then keeps
the identifiers that are not a function call or a keyword.
"""

from __future__ import annotations

import re

import pytest

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)",
                         re.IGNORECASE)
_IDENTIFIER = re.compile(r"(?<![\w.$:])([A-Za-z_:][\w:]*)(\s*\()?")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
            "and", "or", "unless", "atan2", "inf", "nan"}
# label_values(<expr>, <label>) and query_result(<expr>) in Grafana variables.
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.DOTALL)


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    return {match.group(1) for match in _IDENTIFIER.finditer(text)
            if match.group(2) is None and match.group(1).lower() not in KEYWORDS}


def variable_metric_names(query: str) -> set[str]:
    """The metric names a Grafana template variable's query uses."""
    for pattern in (_LABEL_VALUES, _QUERY_RESULT):
        found = pattern.match(query)
        if found:
            return metric_names(found.group(1))
    if query.strip().startswith(("label_values(", "label_names(", "metrics(")):
        return set()  # label_values(label): no metric
    return metric_names(query)


@pytest.mark.parametrize(("expr", "names"), [
    pytest.param("pai_jobs", {"pai_jobs"}, id="a bare name"),
    pytest.param('pai_jobs{state="RUNNING", vc=~"a|b"}', {"pai_jobs"}, id="label matchers"),
    pytest.param("sum by (state, vc) (pai_jobs)", {"pai_jobs"}, id="grouping labels"),
    pytest.param("sum(pai_jobs) without (vc)", {"pai_jobs"}, id="grouping after"),
    pytest.param("histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))",
                 {"x_bucket"}, id="functions and a Grafana range"),
    pytest.param("rate(a_total[5m] offset 1h)", {"a_total"}, id="offset and durations"),
    pytest.param("a * on (node, uuid) group_left(model) b", {"a", "b"}, id="vector matching"),
    pytest.param("a and ignoring(job) b or c unless d", {"a", "b", "c", "d"},
                 id="set operators"),
    pytest.param("time() - max(t_seconds) > 60 or absent(t_seconds) and on() up == 1",
                 {"t_seconds", "up"}, id="absent and an empty on()"),
    pytest.param("x > bool 1e3 and x < +Inf", {"x"}, id="numbers and bool"),
    pytest.param('ALERTS{alertstate="firing", alertname="sum(x)"}', {"ALERTS"},
                 id="function-like text inside a string"),
    pytest.param("max_over_time(a[1h:5m])", {"a"}, id="a subquery"),
    pytest.param("a:rate5m", {"a:rate5m"}, id="a recording rule name"),
])
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.parametrize(("query", "names"), [
    pytest.param("label_values(pai_node_up, node)", {"pai_node_up"}, id="label_values"),
    pytest.param('label_values(pai_task_cpu_percent{user="$user"}, job_name)',
                 {"pai_task_cpu_percent"}, id="label_values with a variable in a matcher"),
    pytest.param("label_values(node)", set(), id="label_values of any series"),
    pytest.param("query_result(topk(5, pai_jobs))", {"pai_jobs"}, id="query_result"),
])
def test_metric_names_of_a_grafana_variable(query: str, names: set[str]) -> None:
    assert variable_metric_names(query) == names
