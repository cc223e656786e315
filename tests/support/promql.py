"""A small PromQL reader: which metric names an expression uses.

The dashboards and alert rules must only query series the exporters really
emit (tests/integration/test_metrics_dashboards.py); this finds the names.
It is not a parser: it drops what cannot be a metric name (strings, label
matchers, ranges, grouping label lists, numbers and durations), then keeps
the identifiers that are not a function call or a keyword.
"""

from __future__ import annotations

import re

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
