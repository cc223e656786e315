"""The job list's sort keys and order (shared/domain/jobsort.py), without Redis."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain import jobsort

NOW = 100_000


@pytest.mark.parametrize(("sort", "job_id", "fields", "value"), [
    ("name", "alice~MNIST-2", {}, ("mnist-2", "MNIST-2")),
    ("username", "alice~x", {}, ("alice", "alice")),
    ("virtualCluster", "a~x", {"virtual_cluster": "vision"}, "vision"),
    ("virtualCluster", "a~x", {}, "default"),  # a compacted record leaves the default out
    ("state", "a~x", {"state": "RUNNING"}, "RUNNING"),
    ("gpus", "a~x", {"gpus": "4"}, 4),
    ("gpus", "a~x", {}, 0),
    ("retries", "a~x", {"retries": "2"}, 2),
    ("completedTime", "a~x", {"completed_ms": "5"}, 5),
    ("completedTime", "a~x", {"completed_ms": ""}, None),
    ("completedTime", "a~x", {"completed_ms": "None"}, None),
    ("duration", "a~x", {"started_ms": "10", "completed_ms": "40"}, 30),
    ("duration", "a~x", {"started_ms": "10", "completed_ms": ""}, NOW - 10),  # running
    ("duration", "a~x", {"started_ms": "", "completed_ms": "40"}, None),  # never started
    ("submitTime", "a~x", {"created_ms": "7"}, 7),
], ids=lambda v: str(v)[:20])
def test_sort_values(sort: str, job_id: str, fields: dict[str, str], value: Any) -> None:
    assert jobsort.SORT_FIELDS[sort].value(job_id, fields, NOW) == value
    assert jobsort.sort_key(sort, job_id, fields, NOW) == (
        value is None, 0 if value is None else value)


def test_every_read_field_is_a_job_field() -> None:
    from shared.domain.models import Job
    known = set(Job(id="a~b", username="a", name="b", virtual_cluster="default").to_fields())
    assert all(set(f.reads) <= known for f in jobsort.SORT_FIELDS.values())
    assert jobsort.SORTS[0] == jobsort.SUBMIT_TIME  # the default, first in the API's list


def test_a_missing_value_is_last_going_up_and_first_going_down() -> None:
    values = {"a~1": {"completed_ms": "5"}, "a~2": {"completed_ms": ""},
              "a~3": {"completed_ms": "1"}}
    ids = ["a~1", "a~2", "a~3"]
    assert jobsort.sorted_ids(ids, "completedTime", values, descending=False,
                              now_ms=NOW) == ["a~3", "a~1", "a~2"]
    assert jobsort.sorted_ids(ids, "completedTime", values, descending=True,
                              now_ms=NOW) == ["a~2", "a~1", "a~3"]


@given(st.lists(st.tuples(st.sampled_from(["alice", "bob"]), st.integers(0, 3)),
                max_size=30),
       st.sampled_from(jobsort.SORTS), st.booleans())
def test_sorted_and_ties_keep_their_submit_order(rows: list[tuple[str, int]], sort: str,
                                                 descending: bool) -> None:
    ids = [f"{user}~job-{n}" for n, (user, _) in enumerate(rows)]  # in submit order
    values = {i: {"gpus": str(g), "retries": str(g), "state": "RUNNING",
                  "created_ms": str(n), "completed_ms": str(g) if g else "",
                  "started_ms": "0", "virtual_cluster": "default"}
              for n, (i, (_, g)) in enumerate(zip(ids, rows, strict=True))}
    if descending:  # the ids come in submit-time order the way the list goes
        ids.reverse()
    got = jobsort.sorted_ids(ids, sort, values, descending=descending, now_ms=NOW)
    assert sorted(got) == sorted(ids)
    keys = [jobsort.sort_key(sort, i, values[i], NOW) for i in got]
    assert keys == sorted(keys, reverse=descending)
    for a, b in itertools.pairwise(got):  # equal keys: the order they came in
        if jobsort.sort_key(sort, a, values[a], NOW) == jobsort.sort_key(sort, b, values[b], NOW):
            assert ids.index(a) < ids.index(b)


_VALUES = st.lists(st.sampled_from([0, 1, 2, 7, jobsort.MISSING]) | st.integers(-50, 50),
                   max_size=3000)


@given(_VALUES, st.integers(0, 3100), st.integers(0, 80), st.booleans())
def test_a_page_is_that_page_of_the_whole_sorted_column(
        values: list[int], offset: int, limit: int, descending: bool) -> None:
    """Ties by position (submit order), going down the exact reverse."""
    column = np.asarray(values, dtype=np.int64)
    whole = sorted(range(len(values)), key=lambda n: (values[n], n), reverse=descending)
    got = jobsort.page_positions(column, offset, limit, descending=descending)
    assert got.tolist() == whole[offset:offset + limit]


def test_a_large_column_takes_the_partition_path() -> None:
    rng = np.random.default_rng(7)
    column = rng.integers(0, 5, 50_000).astype(np.int64)  # a few values, huge ties
    whole = np.argsort(column, kind="stable")
    for start in (0, 9_999, 10_000, 49_990):
        assert jobsort.ranked_window(column, start, start + 50).tolist() == \
            whole[start:start + 50].tolist()


@pytest.mark.parametrize(("total", "offset", "limit", "descending", "rows"), [
    (10, 0, 3, True, [9, 8, 7]),
    (10, 8, 5, True, [1, 0]),
    (10, 12, 5, True, []),
    (10, 8, 5, False, [8, 9]),
    (0, 0, 5, True, []),
], ids=["newest", "the oldest two", "past the end", "up", "none"])
def test_a_range_page_in_submit_order(total: int, offset: int, limit: int, descending: bool,
                                      rows: list[int]) -> None:
    assert jobsort.range_page(total, offset, limit, descending=descending).tolist() == rows


def test_the_columns_compare_as_sort_key_does() -> None:
    missing = jobsort.MISSING
    started = np.array([10, 10, missing], dtype=np.int64)
    completed = np.array([40, missing, 40], dtype=np.int64)
    assert jobsort.durations(started, completed, NOW).tolist() == [30, NOW - 10, missing]
    texts = ["bob", "Alice", "alice", "carol"]
    ranks = jobsort.text_ranks(texts, ignore_case=True)
    assert sorted(texts, key=lambda t: int(ranks[texts.index(t)])) == \
        sorted(texts, key=jobsort.text_key)
    assert jobsort.text_ranks(["vision", "default"], ignore_case=False).tolist() == [1, 0]
    states = sorted(jobsort.STATE_CODES, key=jobsort.STATE_CODES.__getitem__)
    assert states == sorted(states)  # comparing codes compares the states' names
