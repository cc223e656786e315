"""Usage arithmetic (shared/state/usage.py): day splits, roll-ups and reports, exact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.models import Allocation, Task
from shared.domain.states import TaskState
from shared.state.usage import (
    DAY_MS,
    DayUsage,
    Filter,
    Interval,
    day_of,
    day_rows,
    day_start_ms,
    days_between,
    merge_rows,
    report,
    running_intervals,
    split_by_day,
    task_interval,
)

MIDNIGHT = day_start_ms("2026-11-25")  # a Wednesday, 00:00 UTC
HOUR = 3600 * 1000
EVERYTHING = Filter("1970-01-01", "9999-12-31")


def interval(start: int, end: int, *, user: str = "alice", vc: str = "default",
             job: str = "alice~a", gpus: int = 2, cpus: int = 4, memory_mb: int = 1000,
             attempt: int = 0, index: int = 0) -> Interval:
    return Interval(job_id=job, attempt=attempt, role="main", index=index, user=user, vc=vc,
                    start_ms=start, end_ms=end, gpus=gpus, cpus=cpus, memory_mb=memory_mb)


@pytest.mark.parametrize(("start", "end", "parts"), [
    pytest.param(MIDNIGHT, MIDNIGHT + HOUR, [("2026-11-25", HOUR)], id="within one day"),
    pytest.param(MIDNIGHT - HOUR, MIDNIGHT + 2 * HOUR,
                 [("2026-11-24", HOUR), ("2026-11-25", 2 * HOUR)], id="across midnight"),
    pytest.param(MIDNIGHT - 1, MIDNIGHT, [("2026-11-24", 1)],
                 id="the last millisecond before midnight"),
    pytest.param(MIDNIGHT, MIDNIGHT + DAY_MS, [("2026-11-25", DAY_MS)],
                 id="exactly one whole day"),
    pytest.param(MIDNIGHT - 1, MIDNIGHT + DAY_MS + 1,
                 [("2026-11-24", 1), ("2026-11-25", DAY_MS), ("2026-11-26", 1)],
                 id="a whole day between two slivers"),
    pytest.param(MIDNIGHT, MIDNIGHT, [], id="empty"),
    pytest.param(MIDNIGHT + HOUR, MIDNIGHT, [], id="ends before it starts: nothing"),
])
def test_split_by_day(start: int, end: int, parts: list[tuple[str, int]]) -> None:
    assert split_by_day(start, end) == parts


def test_days_are_utc_and_inclusive() -> None:
    assert day_of(MIDNIGHT) == "2026-11-25" and day_of(MIDNIGHT - 1) == "2026-11-24"
    assert days_between("2026-11-30", "2026-12-02") == ["2026-11-30", "2026-12-01",
                                                        "2026-12-02"]
    assert days_between("2026-12-02", "2026-11-30") == []


def test_day_rows_weigh_time_by_what_the_allocation_holds() -> None:
    rows = day_rows([interval(MIDNIGHT - HOUR, MIDNIGHT + HOUR)])
    assert rows == [DayUsage("2026-11-24", "alice", "default", "alice~a", 2 * HOUR, 4 * HOUR,
                             1000 * HOUR),
                    DayUsage("2026-11-25", "alice", "default", "alice~a", 2 * HOUR, 4 * HOUR,
                             1000 * HOUR)]


def test_report_groups_filters_and_gives_seconds() -> None:
    rows = day_rows([
        interval(MIDNIGHT, MIDNIGHT + 10_000, user="alice", vc="default", job="alice~a"),
        interval(MIDNIGHT, MIDNIGHT + 5_000, user="bob", vc="research", job="bob~b", gpus=1),
        interval(MIDNIGHT + DAY_MS, MIDNIGHT + DAY_MS + 1_000, user="alice", vc="research",
                 job="alice~c", gpus=4),
    ])
    assert report(rows, ["user"], EVERYTHING) == [
        {"user": "alice", "gpuSeconds": 24.0, "cpuSeconds": 44.0, "memoryMbSeconds": 11000.0},
        {"user": "bob", "gpuSeconds": 5.0, "cpuSeconds": 20.0, "memoryMbSeconds": 5000.0}]
    assert [(r["vc"], r["gpuSeconds"]) for r in report(rows, ["vc"], EVERYTHING)] == [
        ("default", 20.0), ("research", 9.0)]
    assert [(r["day"], r["user"], r["gpuSeconds"])
            for r in report(rows, ["user", "day"], EVERYTHING)] == [
        ("2026-11-25", "alice", 20.0), ("2026-11-25", "bob", 5.0), ("2026-11-26", "alice", 4.0)]
    only_day_one = Filter("2026-11-25", "2026-11-25", vc="research")
    assert report(rows, [], only_day_one) == [
        {"gpuSeconds": 5.0, "cpuSeconds": 20.0, "memoryMbSeconds": 5000.0}]
    assert report(rows, ["job"], Filter("2026-11-25", "2026-11-26", user="nobody")) == []
    with pytest.raises(ValueError, match="cannot group by"):
        report(rows, ["node"], EVERYTHING)


def test_running_tasks_count_until_now_and_settled_ones_not_again() -> None:
    alloc = Allocation(job_id="alice~a", attempt=1, role="main", index=0, node="n1",
                       gpus=(0, 1), cpus=2, memory_mb=512, ports=(), vc="research")
    running = Task("main", 0, TaskState.RUNNING, node="n1", launched_ms=MIDNIGHT)
    settled = Task("main", 0, TaskState.SUCCEEDED, node="n1", launched_ms=MIDNIGHT,
                   completed_ms=MIDNIGHT + 10)
    now = MIDNIGHT + 7_000
    assert running_intervals([(alloc, running), (alloc, settled), (alloc, None)], now) == [
        Interval("alice~a", 1, "main", 0, "alice", "research", MIDNIGHT, now, 2, 2, 512)]
    # a clock stepped back never makes usage negative
    assert task_interval(alloc, running, MIDNIGHT - 5).duration_ms == 0


@pytest.mark.parametrize(("placed", "launched", "start"), [
    pytest.param(MIDNIGHT, MIDNIGHT, MIDNIGHT, id="never relaunched"),
    pytest.param(MIDNIGHT, MIDNIGHT + HOUR, MIDNIGHT, id="relaunched: from the placement"),
    pytest.param(None, MIDNIGHT + HOUR, MIDNIGHT + HOUR, id="bound before placed_ms: launch"),
    pytest.param(None, None, MIDNIGHT + 2 * HOUR, id="never bound: nothing"),
])
def test_a_task_is_charged_from_its_placement(placed: int | None, launched: int | None,
                                              start: int) -> None:
    alloc = Allocation(job_id="alice~a", attempt=0, role="main", index=0, node="n1",
                       gpus=(0,), cpus=1, memory_mb=100, ports=())
    task = Task("main", 0, TaskState.SUCCEEDED, node="n1", placed_ms=placed,
                launched_ms=launched)
    assert task_interval(alloc, task, MIDNIGHT + 2 * HOUR).start_ms == start


def test_an_interval_key_tells_a_resubmitted_job_from_the_deleted_one() -> None:
    first, again = interval(MIDNIGHT, MIDNIGHT + 1), interval(MIDNIGHT + 5, MIDNIGHT + 9)
    assert first.key == "alice~a:0:main:0@" + str(MIDNIGHT) and first.key != again.key


# ------------------------------------------------------------- properties

instants = st.integers(min_value=MIDNIGHT - 40 * DAY_MS, max_value=MIDNIGHT + 40 * DAY_MS)
intervals = st.builds(
    lambda start, length, user, vc, gpus, cpus, memory, index: interval(
        start, start + length, user=user, vc=vc, job=f"{user}~j{index % 3}", gpus=gpus,
        cpus=cpus, memory_mb=memory, index=index),
    instants, st.integers(min_value=-DAY_MS, max_value=5 * DAY_MS),
    st.sampled_from(["alice", "bob"]), st.sampled_from(["default", "research"]),
    st.integers(0, 8), st.integers(0, 64), st.integers(0, 500_000), st.integers(0, 5))


@given(instants, st.integers(min_value=-DAY_MS, max_value=10 * DAY_MS))
def test_a_split_covers_the_interval_exactly_one_day_at_a_time(start: int, length: int) -> None:
    parts = split_by_day(start, start + length)
    assert sum(ms for _, ms in parts) == max(0, length)
    assert all(0 < ms <= DAY_MS for _, ms in parts)
    days = [day for day, _ in parts]
    assert days == sorted(set(days))  # each day once, in order, consecutive
    assert days == (days_between(days[0], days[-1]) if days else [])


@given(st.lists(intervals, max_size=12))
def test_totals_equal_the_sum_of_the_parts(spans: list[Interval]) -> None:
    rows = day_rows(spans)
    assert all(min(r.amounts()) >= 0 for r in rows)
    gpu_ms = sum(s.duration_ms * s.gpus for s in spans)
    cpu_ms = sum(s.duration_ms * s.cpus for s in spans)
    memory_ms = sum(s.duration_ms * s.memory_mb for s in spans)
    assert (sum(r.gpu_ms for r in rows), sum(r.cpu_ms for r in rows),
            sum(r.memory_ms for r in rows)) == (gpu_ms, cpu_ms, memory_ms)
    # every grouping of the same rows has the same grand total
    whole = report(rows, [], EVERYTHING)
    for by in (["user"], ["vc"], ["day"], ["job"], ["day", "user", "vc"]):
        grouped = report(rows, by, EVERYTHING)
        assert sum(r["gpuSeconds"] for r in grouped) == pytest.approx(
            whole[0]["gpuSeconds"] if whole else 0)
    if whole:
        assert whole[0]["gpuSeconds"] == gpu_ms / 1000


@given(st.lists(intervals, max_size=8), st.lists(intervals, max_size=8))
def test_merging_rows_is_adding_their_intervals(first: list[Interval],
                                                second: list[Interval]) -> None:
    assert merge_rows(day_rows(first), day_rows(second)) == day_rows(first + second)


@given(st.lists(st.tuples(st.sampled_from(list(TaskState)), instants,
                          st.integers(-HOUR, DAY_MS)), max_size=10), instants)
def test_each_placed_task_counts_once_recorded_or_running_never_negative(
        tasks: list[tuple[TaskState, int, int]], now: int) -> None:
    """A report adds the recorded intervals (settled tasks) to the running
    ones: a task is in exactly one of them, and no interval is negative,
    even when a clock stepped back between placement and exit or now."""
    held, recorded = [], []
    for index, (state, launched, length) in enumerate(tasks):
        alloc = Allocation(job_id="alice~a", attempt=0, role="main", index=index, node="n1",
                           gpus=(0,), cpus=1, memory_mb=100, ports=())
        task = Task("main", index, state, node="n1", launched_ms=launched,
                    completed_ms=launched + length if state.is_final else None)
        held.append((alloc, task))
        if state.is_final and task.completed_ms is not None:
            recorded.append(task_interval(alloc, task, task.completed_ms))
    running = running_intervals(held, now)
    counted = [s.index for s in recorded + running]
    assert sorted(counted) == list(range(len(tasks)))
    assert all(s.duration_ms >= 0 and s.end_ms >= s.start_ms for s in recorded + running)
