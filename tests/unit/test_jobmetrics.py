"""The metrics endpoint's pure parts (services/api/jobmetrics.py): the
PromQL a job's identifiers make, hostile ones included, the step, and
Prometheus' matrices as the samples endpoint's rows."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.api import jobmetrics

_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"')
_GO_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n", "\\r": "\r", "\\t": "\t"}


def decoded(literal: str) -> str:
    """A PromQL double-quoted literal's value (the escapes string_literal writes)."""
    assert literal.startswith('"') and literal.endswith('"')
    return re.sub(r'\\x[0-9a-f]{2}|\\.',
                  lambda m: chr(int(m.group()[2:], 16)) if m.group().startswith("\\x")
                  else _GO_ESCAPES[m.group()], literal[1:-1])


HOSTILE = [
    'a"} or vector(1) or {x="',
    'x\\"} or on() vector(1)#',
    "line\nbreak",
    "tab\there\rand\x00nul\x1f\x7f",
    "ends with a backslash\\",
    '"',
    "\\",
    "ünïcode-名前",
    "{job_name=~\".*\"}",
    "`backtick`",
    "",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_name_stays_inside_its_literal(name: str) -> None:
    sel = jobmetrics.selector("alice", name, 3)
    literals = _LITERAL.findall(sel)
    assert [decoded(x) for x in literals] == ["alice", name, "3"]
    # take the literals out: only the three exact matchers are left
    assert _LITERAL.sub("S", sel) == "{user=S,job_name=S,attempt=S}"


@given(st.text(max_size=40), st.text(max_size=40))
def test_every_name_round_trips(user: str, name: str) -> None:
    sel = jobmetrics.selector(user, name, 0)
    assert _LITERAL.sub("S", sel) == "{user=S,job_name=S,attempt=S}"
    assert [decoded(x) for x in _LITERAL.findall(sel)] == [user, name, "0"]


def test_each_query_selects_only_the_jobs_series() -> None:
    built = jobmetrics.queries("alice", 'a"b', 1)
    assert set(built) == {"cpuPercent", "memoryBytes", "gpuPercent", "gpuMemoryBytes"}
    sel = '{user="alice",job_name="a\\"b",attempt="1"}'
    assert built["cpuPercent"] == f"max by (role, index) (pai_task_cpu_percent{sel})"
    assert built["memoryBytes"] == f"max by (role, index) (pai_task_memory_bytes{sel})"
    assert built["gpuPercent"] == \
        f"max by (role, index, gpu) (pai_task_gpu_utilization_percent{sel})"
    assert built["gpuMemoryBytes"] == (
        "sum by (role, index) (pai_gpu_memory_used_bytes * on (node, uuid) group_left "
        f"(role, index) (0 * pai_task_gpu_utilization_percent{sel} + 1))")
    for expression in built.values():  # every selector in it is the job's
        assert all(m == sel for m in re.findall(r"\{[^{}]*\}", expression))


@pytest.mark.parametrize(("span_s", "asked", "step"), [
    (240, None, 1.0),           # the span in 240 points, at least 1 s
    (24_000, None, 100.0),
    (3600, 15, 15.0),           # as asked
    (3600, 0.5, 4.0),           # held to 1,000 points
    (86_400 * 30, 60, 2592.0),  # a month: 1,000 points
    (0, None, 1.0),
    (100, 2.5, 3.0),            # whole seconds, rounded up
])
def test_step(span_s: int, asked: float | None, step: float) -> None:
    assert jobmetrics.span(0, span_s * 1000, asked) == step


def test_matrices_become_the_samples_rows() -> None:
    results = {
        "cpuPercent": [{"metric": {"role": "worker", "index": "1"},
                        "values": [[100, "50"], [101.5, "NaN"]]},
                       {"metric": {"role": "ps", "index": "0"}, "values": [[100, "5"]]}],
        "memoryBytes": [{"metric": {"role": "worker", "index": "1"},
                         "values": [[100, "1048576"]]}],
        "gpuPercent": [{"metric": {"role": "worker", "index": "1", "gpu": "3"},
                        "values": [[100, "30"]]},
                       {"metric": {"role": "worker", "index": "1", "gpu": "1"},
                        "values": [[100, "10"]]}],
        "gpuMemoryBytes": [{"metric": {"role": "worker", "index": "1"},
                            "values": [[101.5, "2e9"]]},
                           {"metric": {"role": "bad"}, "values": [[100, "1"]]}],  # no index
    }
    assert jobmetrics.task_samples(results) == [
        {"taskRole": "ps", "taskIndex": 0, "samples": [
            {"time": 100_000, "cpuPercent": 5.0, "memoryBytes": None, "gpuPercent": [],
             "gpuMemoryBytes": None}]},
        {"taskRole": "worker", "taskIndex": 1, "samples": [
            {"time": 100_000, "cpuPercent": 50.0, "memoryBytes": 1048576,
             "gpuPercent": [10.0, 30.0], "gpuMemoryBytes": None},
            {"time": 101_500, "cpuPercent": None, "memoryBytes": None, "gpuPercent": [],
             "gpuMemoryBytes": 2_000_000_000}]},
    ]


def test_no_series_is_no_task() -> None:
    assert jobmetrics.task_samples({"cpuPercent": []}) == []
