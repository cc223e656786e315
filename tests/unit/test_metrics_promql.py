"""The PromQL reader of tests/support/promql.py: which metric names an expression uses."""

from __future__ import annotations

import pytest

from tests.support.promql import metric_names, variable_metric_names


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
