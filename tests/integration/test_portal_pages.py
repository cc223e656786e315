"""The portal's pure parts (services/portal/pages.py): no IO, table-driven."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from services.portal import pages


@pytest.mark.parametrize(("target", "expected"), [
    ("/jobs?state=WAITING", "/jobs?state=WAITING"),
    ("/", "/"),
    (None, "/"),
    ("", "/"),
    ("jobs", "/"),
    ("//evil.example/x", "/"),
    ("/\\evil.example", "/"),
    ("https://evil.example/", "/"),
    ("/jobs\r\nSet-Cookie: x=1", "/"),
    ("/a\\b", "/"),
])
def test_local_target_stays_on_the_site(target: str | None, expected: str) -> None:
    assert pages.local_target(target) == expected


@given(st.text(max_size=40))
def test_local_target_never_names_a_host(target: str) -> None:
    shown = pages.local_target(target)
    assert shown.startswith("/") and not shown.startswith("//") and "\\" not in shown


@pytest.mark.parametrize(("args", "page", "size", "offset"), [
    ({}, 1, 20, 0),
    ({"page": "3", "size": "50"}, 3, 50, 100),
    ({"page": "0"}, 1, 20, 0),
    ({"page": "-4", "size": "0"}, 1, 1, 0),
    ({"page": "x", "size": "y"}, 1, 20, 0),
    ({"size": "100000"}, 1, 100, 0),
    ({"page": str(10**30)}, pages.MAX_PAGE, 20, (pages.MAX_PAGE - 1) * 20),
])
def test_paging_of_clamps_what_a_url_says(args: dict[str, str], page: int, size: int,
                                          offset: int) -> None:
    paging = pages.paging_of(args)
    assert (paging.page, paging.size, paging.offset) == (page, size, offset)


@pytest.mark.parametrize(("page", "total", "pages_", "previous", "next_"), [
    (1, 0, 1, False, False),
    (1, 20, 1, False, False),
    (1, 21, 2, False, True),
    (2, 21, 2, True, False),
])
def test_paging_counts_pages(page: int, total: int, pages_: int, previous: bool,
                             next_: bool) -> None:
    paging = pages.Paging(page, 20, total)
    assert (paging.pages, paging.has_previous, paging.has_next) == (pages_, previous, next_)


@pytest.mark.parametrize(("args", "expected"), [
    ({}, ("submitTime", True)),
    ({"sort": "name", "order": "asc"}, ("name", False)),
    ({"sort": "gpus"}, ("gpus", True)),
    ({"sort": "completedTime", "order": "desc"}, ("completedTime", True)),
    ({"sort": "created", "order": "asc"}, ("submitTime", False)),  # an older link's name
    ({"sort": "user"}, ("username", True)),
    ({"sort": "vc", "order": "asc"}, ("virtualCluster", False)),
    ({"sort": "nonsense", "order": "asc"}, ("submitTime", False)),
    ({"sort": "name", "order": "sideways"}, ("name", True)),
    ({"sort": "", "order": ""}, ("submitTime", True)),
])
def test_sort_of(args: dict[str, str], expected: tuple[str, bool]) -> None:
    assert pages.sort_of(args) == expected


def test_clone_renames_a_v1_job_as_json_and_a_v2_job_as_yaml() -> None:
    v1 = json.loads(pages.clone_text({"jobName": "mnist", "image": "b"}, "beef"))
    assert v1 == {"jobName": "mnist-beef", "image": "b"}
    v2 = yaml.safe_load(pages.clone_text({"protocolVersion": 2, "name": "ps"}, "beef"))
    assert v2 == {"protocolVersion": 2, "name": "ps-beef"}


@pytest.mark.parametrize(("body", "rows"), [
    ({"fields": {"b": ["x"], "a.0": ["y", "z"]}}, [("a.0", ["y", "z"]), ("b", ["x"])]),
    ({"fields": {"a": "one"}}, [("a", ["one"])]),
    ({"message": "m"}, []),
    ("text", []),
    (None, []),
])
def test_error_fields(body: Any, rows: list[tuple[str, list[str]]]) -> None:
    assert pages.error_fields(body) == rows


@pytest.mark.parametrize(("text", "ref"), [
    ("alice/job", ("alice", "job")),
    ("alice", None),
    ("/job", None),
    ("alice/", None),
    ("alice/a/b", None),
])
def test_job_ref(text: str, ref: tuple[str, str] | None) -> None:
    assert pages.job_ref(text) == ref


@pytest.mark.parametrize(("total", "count", "offset"), [(0, 5, 0), (3, 5, 0), (12, 5, 7)])
def test_oldest_offset(total: int, count: int, offset: int) -> None:
    assert pages.oldest_offset(total, count) == offset


def _sample(time: int, cpu: float | None = None, memory: int | None = None,
            gpus: tuple[float | None, ...] = ()) -> dict[str, Any]:
    return {"time": time, "cpuPercent": cpu, "memoryBytes": memory, "gpuPercent": list(gpus)}


@pytest.mark.parametrize(("samples", "points", "key", "expected"), [
    pytest.param({}, 4, "gpu", ((), ()), id="no-samples-no-lines"),
    pytest.param({"a[0]": [_sample(0, gpus=(10.0, 30.0))]}, 4, "gpu",
                 ((0,), (("a[0]", (20.0,)),)), id="one-sample-mean-of-gpus"),
    pytest.param({"a[0]": [_sample(0, cpu=10.0), _sample(100, cpu=30.0)]}, 2, "cpu",
                 ((0, 50), (("a[0]", (10.0, 30.0)),)), id="two-spans"),
    pytest.param({"a[0]": [_sample(0, cpu=10.0), _sample(10, cpu=30.0), _sample(100, cpu=5.0)]},
                 2, "cpu", ((0, 50), (("a[0]", (20.0, 5.0)),)), id="a-span-averages"),
    pytest.param({"a[0]": [_sample(0, cpu=1.0), _sample(100, cpu=3.0)],
                  "b[0]": [_sample(100, cpu=7.0)]}, 2, "cpu",
                 ((0, 50), (("a[0]", (1.0, 3.0)), ("b[0]", (None, 7.0)))),
                 id="a-task-without-samples-in-a-span-has-a-gap"),
    pytest.param({"a[0]": [_sample(0, gpus=(None,))]}, 4, "gpu",
                 ((0,), (("a[0]", (None,)),)), id="unknown-gpus-are-gaps"),
    pytest.param({"a[0]": [_sample(0, memory=2 * 1024 * 1024)]}, 4, "memory",
                 ((0,), (("a[0]", (2.0,)),)), id="memory-in-mib"),
])
def test_usage_charts(samples: dict[str, list[dict[str, Any]]], points: int, key: str,
                      expected: tuple[tuple[int, ...], tuple[tuple[str, tuple[Any, ...]], ...]]
                      ) -> None:
    chart = next(c for c in pages.usage_charts(samples, points) if c.key == key)
    times, lines = expected
    assert chart.times == times
    assert tuple((line.label, line.values) for line in chart.lines) == lines


@given(st.lists(st.tuples(st.integers(0, 10**6), st.floats(0, 1000)), min_size=1, max_size=50))
def test_every_point_is_inside_the_chart(rows: list[tuple[int, float]]) -> None:
    samples = {"a[0]": [_sample(t, cpu=c, gpus=(c,)) for t, c in sorted(rows)]}
    for chart in pages.usage_charts(samples):
        assert len(chart.times) <= pages.CHART_POINTS
        for line in chart.lines:
            for point in line.points.split():
                x, y = (float(v) for v in point.split(","))
                assert 0 <= x <= pages.CHART_WIDTH and 0 <= y <= pages.CHART_HEIGHT


DETAIL = {"name": "mnist", "taskRoles": {
    "worker": {"taskStatuses": [{"taskIndex": 0, "taskState": "RUNNING"},
                                {"taskIndex": 1, "taskState": "WAITING"}]},
    "ps": {"taskStatuses": [{"taskIndex": 0, "taskState": "RUNNING"}]}}}


@pytest.mark.parametrize(("viewer", "with_ssh", "rows"), [
    ("alice", False, [("worker[0]", "pai exec mnist worker 0 -- sh", None),
                      ("ps[0]", "pai exec mnist ps 0 -- sh", None)]),
    ("alice", True, [("worker[0]", "pai exec mnist worker 0 -- sh", "pai ssh mnist worker 0"),
                     ("ps[0]", "pai exec mnist ps 0 -- sh", "pai ssh mnist ps 0")]),
    ("root", True, [("worker[0]", "pai exec --user alice mnist worker 0 -- sh",
                     "pai ssh --user alice mnist worker 0"),
                    ("ps[0]", "pai exec --user alice mnist ps 0 -- sh",
                     "pai ssh --user alice mnist ps 0")]),
])
def test_debug_commands_for_running_tasks(viewer: str, with_ssh: bool,
                                          rows: list[tuple[str, str, str | None]]) -> None:
    found = pages.debug_commands(DETAIL, "alice", viewer, with_ssh)
    assert [(d.task, d.exec, d.ssh) for d in found] == rows


@pytest.mark.parametrize(("config", "asks"), [
    (None, False),
    ({"jobName": "a"}, False),
    ({"jobName": "a", "ssh": {"jobssh": True}}, True),
    ({"protocolVersion": 2, "extras": {"com.microsoft.pai.runtimeplugin": [
        {"plugin": "ssh", "parameters": {"jobssh": True}}]}}, True),
    ({"protocolVersion": "2", "extras": {"com.microsoft.pai.runtimeplugin": [
        {"plugin": "ssh"}]}}, False),
    ({"protocolVersion": 2, "extras": {"com.microsoft.pai.runtimeplugin": [
        {"plugin": "ssh", "parameters": {"jobssh": "maybe"}}]}}, False),
])
def test_asks_for_ssh_reads_both_protocols(config: dict[str, Any] | None, asks: bool) -> None:
    assert pages.asks_for_ssh(config) is asks

def _metrics(source: str, reason: str | None = None, final: bool = False) -> dict[str, Any]:
    sample = {"time": 1000, "cpuPercent": 10.0, "memoryBytes": 1024, "gpuPercent": [5.0],
              "gpuMemoryBytes": 2 * 1024 * 1024 if source == "prometheus" else None}
    return {"source": source, "fallbackReason": reason, "final": final, "stepSeconds": 15,
            "tasks": [{"taskRole": "w", "taskIndex": i, "samples": [sample] if i else []}
                      for i in range(10)]}


@pytest.mark.parametrize(("answer", "sentence", "keys", "final"), [
    (_metrics("prometheus"), "From Prometheus, a point every 15 s.",
     ["gpu", "cpu", "memory", "gpumemory"], False),
    (_metrics("samples"), "From the monitor's samples (one every 15 s): Prometheus is not "
     "configured.", ["gpu", "cpu", "memory"], False),
    (_metrics("samples", "Prometheus failed: unreachable (ConnectionError)", final=True),
     "From the monitor's samples (one every 15 s): Prometheus failed: unreachable "
     "(ConnectionError).", ["gpu", "cpu", "memory"], True),
])
def test_usage_of_a_metrics_answer(answer: dict[str, Any], sentence: str, keys: list[str],
                                   final: bool) -> None:
    usage = pages.usage_of(answer)
    assert (usage.source, [c.key for c in usage.charts], usage.final) == (sentence, keys, final)
    # tasks without samples are left out; at most CHART_TASKS of the first tasks
    assert [line.label for line in usage.charts[0].lines] == [
        f"w[{i}]" for i in range(1, pages.CHART_TASKS)]


@pytest.mark.parametrize(("row", "text"), [
    ({"startedTime": None, "completedTime": None}, ""),  # waiting
    ({"startedTime": 1_000, "completedTime": 6_000}, "5s"),
    ({"startedTime": 1_000, "completedTime": 1_000 + 125_000}, "2m 05s"),
    ({"startedTime": 1_000, "completedTime": None}, "1h 00m"),  # running: to now
    ({"startedTime": 1_000, "completedTime": 1_000 + 90_061_000}, "25h 01m"),
    ({"startedTime": 5_000, "completedTime": 1_000}, "0s"),  # clocks apart: never negative
])
def test_run_time(row: dict[str, Any], text: str) -> None:
    assert pages.run_time(row, 1_000 + 3_600_000) == text
