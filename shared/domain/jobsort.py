"""The job list's sort orders: which fields, what each reads, how rows compare.

`GET /api/v1/jobs?sort=<field>&order=asc|desc` sorts the whole filtered set,
not a page. Submit time is the indexes' own order (every index is a sorted
set scored by creation time), so it costs a range. Any other field sorts the
filtered ids in this process (shared/state/store.py `list_jobs`): the ids arrive in
submit-time order, the fields a sort needs come in one pipelined HMGET (none
for the name and the user, which the id holds), and Python's stable sort
leaves jobs with equal values in submit-time order, the same direction as the
sort, ties at one millisecond by id (the sorted sets' own tie order). A value
a job does not have yet (completed time, duration before it started) sorts
as the largest: last going up, first going down (SQL's default).

Pure: no IO, table-tested in tests/unit/test_jobsort.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SUBMIT_TIME = "submitTime"


def _int(raw: str | None) -> int | None:
    return int(raw) if raw not in (None, "", "None") else None


def _text(value: str) -> tuple[str, str]:
    """Names compare ignoring case first (bert, MNIST-2, mnist-3), then exactly."""
    return (value.casefold(), value)


def _duration(fields: Mapping[str, str | None], now_ms: int) -> int | None:
    started = _int(fields.get("started_ms"))
    if started is None:
        return None
    completed = _int(fields.get("completed_ms"))
    return (completed if completed is not None else now_ms) - started


@dataclass(frozen=True)
class SortField:
    """A sortable field: the job hash fields it reads, and its value from them."""

    reads: tuple[str, ...]  # job hash fields; () when the id holds the value
    value: Callable[[str, Mapping[str, str | None], int], Any]  # (id, fields, now ms)


SORT_FIELDS: dict[str, SortField] = {
    SUBMIT_TIME: SortField(("created_ms",), lambda i, f, now: _int(f.get("created_ms"))),
    "name": SortField((), lambda i, f, now: _text(i.partition("~")[2])),
    "username": SortField((), lambda i, f, now: _text(i.partition("~")[0])),
    "virtualCluster": SortField(("virtual_cluster",),
                                lambda i, f, now: f.get("virtual_cluster") or "default"),
    "state": SortField(("state",), lambda i, f, now: f.get("state") or ""),
    "gpus": SortField(("gpus",), lambda i, f, now: _int(f.get("gpus")) or 0),
    "retries": SortField(("retries",), lambda i, f, now: _int(f.get("retries")) or 0),
    "completedTime": SortField(("completed_ms",),
                               lambda i, f, now: _int(f.get("completed_ms"))),
    "duration": SortField(("started_ms", "completed_ms"),
                          lambda i, f, now: _duration(f, now)),
}
SORTS = tuple(SORT_FIELDS)


def sort_key(sort: str, job_id: str, fields: Mapping[str, str | None],
             now_ms: int) -> tuple[bool, Any]:
    """What a row compares by: a missing value after every present one."""
    value = SORT_FIELDS[sort].value(job_id, fields, now_ms)
    return (value is None, value if value is not None else 0)


def sorted_ids(ids: Sequence[str], sort: str, values: Mapping[str, Mapping[str, str | None]],
               *, descending: bool, now_ms: int) -> list[str]:
    """`ids` (in submit-time order, the same direction as `descending`) by
    `sort`; jobs with equal values keep their submit-time order."""
    if sort == SUBMIT_TIME:
        return list(ids)
    empty: dict[str, str | None] = {}
    return sorted(ids, key=lambda i: sort_key(sort, i, values.get(i, empty), now_ms),
                  reverse=descending)
