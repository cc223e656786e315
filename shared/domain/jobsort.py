"""The job list's sort orders: which fields, what each reads, how rows compare.

`GET /api/v1/jobs?sort=<field>&order=asc|desc` sorts the whole filtered set,
not a page. Submit time is the indexes' own order (every index is a sorted
set scored by creation time), so it costs a range. Any other field is
answered from a table of every job's sort fields kept in the API process
(shared/state/jobtable.py): each field is a column of integers (`MISSING` for
a value a job does not have yet), the filters are masks over the columns, and
`page_positions` picks the page's rows out of the filtered ones in C
(numpy's partition), without sorting them all: O(jobs) at a few nanoseconds a
job, not O(jobs log jobs) in Python.

The order is the one `sort_key` and `sorted_ids` define (the reference the
tests hold the table to): names and users compare ignoring case first, then
exactly; VCs and states as their text; a value a job does not have yet
(completed time, duration before it started) sorts as the largest: last going
up, first going down (SQL's default). Jobs with equal values keep their
submit-time order (creation time, then id: the sorted sets' own tie order),
in the same direction as the sort.

Pure: no IO, table-tested in tests/unit/test_jobsort.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.domain.states import JobState

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


# -- the table's columns ---------------------------------------------------

Ints = npt.NDArray[np.int64]
Positions = npt.NDArray[np.intp]
# A value a job does not have: larger than every value it could have.
MISSING = int(np.iinfo(np.int64).max)
# Each state's code in the table: its place among the states' names, so
# that comparing codes compares the names, as `sort_key` does.
STATE_CODES: dict[str, int] = {s: n for n, s in enumerate(sorted(s.value for s in JobState))}


def text_key(text: str) -> tuple[str, str]:
    """How names and user names compare: `_text`'s order."""
    return _text(text)


def name_key(job_id: str) -> tuple[str, str]:
    """The order of a job's name, from its id (`user~name`)."""
    return _text(job_id.partition("~")[2])


def text_ranks(texts: Sequence[str], *, ignore_case: bool) -> Ints:
    """Each text's rank among `texts` (equal texts the same rank): a column
    of codes into `texts` becomes comparable as `ranks[codes]`."""
    order = sorted(range(len(texts)),
                   key=(lambda n: _text(texts[n])) if ignore_case else texts.__getitem__)
    ranks = np.empty(len(texts), dtype=np.int64)
    ranks[np.asarray(order, dtype=np.intp)] = np.arange(len(texts), dtype=np.int64)
    return ranks


def durations(started: Ints, completed: Ints, now: int) -> Ints:
    """`duration`'s values: completed (or now, still running) minus started;
    MISSING for a job that never started."""
    end = np.where(completed == MISSING, np.int64(now), completed)
    return np.where(started == MISSING, np.int64(MISSING), end - started)


def ranked_window(values: Ints, start: int, stop: int) -> Positions:
    """The positions of `values` ranked `start` .. `stop`-1 going up, ties by
    position (the rows are in submit-time order, so position is the tie
    order).

    Not a sort of all of them: a partition finds the values at the two ends
    of the window, the rows equal to an end value come in position order
    from a scan, and only the rows strictly between the ends (fewer than the
    window holds) are sorted. Linear in len(values), whatever the offset."""
    stop = min(stop, len(values))
    if start >= stop:
        return np.empty(0, dtype=np.intp)
    if len(values) <= _SORT_WHOLE:
        return np.argsort(values, kind="stable")[start:stop]
    ends = np.partition(values, (start, stop - 1))
    low, high = ends[start], ends[stop - 1]
    below = int(np.count_nonzero(values < low))
    first = np.flatnonzero(values == low)[start - below:stop - below]
    if low == high:
        return first
    between = np.flatnonzero((values > low) & (values < high))
    between = between[np.argsort(values[between], kind="stable")]
    rest = (stop - start) - len(first) - len(between)
    return np.concatenate((first, between, np.flatnonzero(values == high)[:rest]))


_SORT_WHOLE = 2048  # below this many rows a stable sort of them all is as quick


def page_positions(values: Ints, offset: int, limit: int, *, descending: bool) -> Positions:
    """The page `offset` .. `offset + limit` of `values` sorted by (value,
    position), going up or down; going down is the exact reverse of going
    up, so ties come newest first then, as `sorted_ids` orders them."""
    if not descending:
        return ranked_window(values, offset, offset + limit)
    total = len(values)
    stop = total - offset
    if stop <= 0 or limit <= 0:
        return np.empty(0, dtype=np.intp)
    return ranked_window(values, max(0, stop - limit), stop)[::-1]


def range_page(total: int, offset: int, limit: int, *, descending: bool) -> Positions:
    """The page `offset` .. `offset + limit` of `total` rows already in
    order (submit time), going up or down."""
    if descending:
        stop = total - offset
        return np.arange(stop - 1, max(0, stop - limit) - 1, -1, dtype=np.intp)
    return np.arange(offset, min(total, offset + limit), dtype=np.intp)
