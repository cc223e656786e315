"""`GET /api/v1/jobs?sort=<field>&order=asc|desc` on a real Redis: the whole
filtered set sorted (not a page), ties in submit-time order, filters and
paging kept, compacted jobs sorted by their archived record, and a clear 400
for a field the list cannot sort by."""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain import jobsort
from shared.domain.models import Job
from shared.domain.states import JobState
from shared.state import keys
from shared.state.retention import compact_job
from shared.state.store import Store
from tests.support.api import AuthedClient, error_of
from tests.support.joblist import Jobs, jobs, mixed, names
from tests.support.redis_server import operator_url

__all__ = ["jobs", "mixed"]  # the fixtures, shared with test_api_list.py


def _set(jobs: Jobs, job: Job, **changes: int | None) -> None:
    """Write changed numbers into a job's record, as the services' CAS writes do."""
    for field, value in changes.items():
        setattr(job, field, value)
    with jobs.store.r.pipeline() as pipe:
        jobs.store.write_job(pipe, job, job.state)
        pipe.execute()


# mixed, oldest first: mnist-1 alice default SUCCEEDED, resnet-1 bob vision FAILED,
# MNIST-2 alice vision RUNNING, bert-1 bob default WAITING, resnet-2 alice vision
# WAITING, mnist-3 bob vision STOPPED, bert-2 alice default RUNNING, gpt-1 bob default
# SUCCEEDED
@pytest.mark.parametrize(("query", "expected"), [
    ("?sort=name&order=asc", ["bert-1", "bert-2", "gpt-1", "mnist-1", "MNIST-2", "mnist-3",
                              "resnet-1", "resnet-2"]),
    ("?sort=name", ["resnet-2", "resnet-1", "mnist-3", "MNIST-2", "mnist-1", "gpt-1",
                    "bert-2", "bert-1"]),
    ("?sort=username&order=asc", ["mnist-1", "MNIST-2", "resnet-2", "bert-2",
                                  "resnet-1", "bert-1", "mnist-3", "gpt-1"]),
    ("?sort=username&order=desc", ["gpt-1", "mnist-3", "bert-1", "resnet-1",
                                   "bert-2", "resnet-2", "MNIST-2", "mnist-1"]),
    ("?sort=state&order=asc", ["resnet-1", "MNIST-2", "bert-2", "mnist-3", "mnist-1",
                               "gpt-1", "bert-1", "resnet-2"]),
    ("?sort=virtualCluster&order=asc", ["mnist-1", "bert-1", "bert-2", "gpt-1",
                                        "resnet-1", "MNIST-2", "resnet-2", "mnist-3"]),
    ("?sort=submitTime&order=asc", ["mnist-1", "resnet-1", "MNIST-2", "bert-1", "resnet-2",
                                    "mnist-3", "bert-2", "gpt-1"]),
    ("?username=alice&sort=state&order=asc", ["MNIST-2", "bert-2", "mnist-1", "resnet-2"]),
    ("?keyword=mnist&sort=name&order=desc", ["mnist-3", "MNIST-2", "mnist-1"]),
    ("?vc=vision&state=WAITING&sort=name", ["resnet-2"]),
    ("?username=bob&vc=default&sort=state&order=asc", ["gpt-1", "bert-1"]),
    ("?sort=name&order=asc&offset=2&limit=3", ["gpt-1", "mnist-1", "MNIST-2"]),
    ("?sort=name&order=asc&offset=8", []),
    ("?username=carol&sort=name", []),
], ids=["name up", "name down", "user up (ties oldest first)", "user down (ties newest first)",
        "state", "vc", "submit time named", "user filter", "keyword", "two filters",
        "user+vc", "a middle page", "past the end", "nothing matches"])
def test_sorted_lists(alice: AuthedClient, mixed: Jobs, query: str,
                      expected: list[str]) -> None:
    assert names(alice, query) == expected


def test_numbers_sort_with_a_missing_value_largest(alice: AuthedClient, jobs: Jobs) -> None:
    """GPUs, retries, completed time and duration; a job not completed (or not
    started) has no value: last going up, first going down."""
    a = jobs.add("alice", "a", state=JobState.SUCCEEDED)
    b = jobs.add("alice", "b", state=JobState.RUNNING)
    c = jobs.add("alice", "c", state=JobState.FAILED)
    d = jobs.add("alice", "d")
    _set(jobs, a, gpus=4, retries=0, started_ms=1_000, completed_ms=9_000)  # 8 s
    _set(jobs, b, gpus=1, retries=2, started_ms=5_000, completed_ms=None)  # still running
    _set(jobs, c, gpus=8, retries=1, started_ms=2_000, completed_ms=3_000)  # 1 s
    _set(jobs, d, gpus=1, retries=0, started_ms=None, completed_ms=None)  # waiting
    assert names(alice, "?sort=gpus&order=asc") == ["b", "d", "a", "c"]
    assert names(alice, "?sort=gpus") == ["c", "a", "d", "b"]
    assert names(alice, "?sort=retries") == ["b", "c", "d", "a"]
    assert names(alice, "?sort=completedTime&order=asc") == ["c", "a", "b", "d"]
    assert names(alice, "?sort=completedTime") == ["d", "b", "a", "c"]
    # b has run since 5 s after the epoch: longest; d never started
    assert names(alice, "?sort=duration&order=asc") == ["c", "a", "b", "d"]


def test_the_total_counts_the_whole_filtered_set(alice: AuthedClient, mixed: Jobs) -> None:
    page = alice.get("/api/v1/jobs?sort=name&order=asc&limit=2&withTotalCount=true&vc=vision")
    assert page.status_code == 200
    assert page.json == {"totalCount": 4, "data": page.json["data"]}
    assert [row["name"] for row in page.json["data"]] == ["MNIST-2", "mnist-3"]


def test_a_compacted_job_sorts_by_its_archived_record(alice: AuthedClient, jobs: Jobs,
                                                     redis_client: redis.Redis) -> None:
    old = jobs.add("alice", "old", state=JobState.SUCCEEDED)
    _set(jobs, old, gpus=8)
    jobs.add("alice", "new", state=JobState.RUNNING)
    assert compact_job(jobs.store, old.id, None)
    assert not redis_client.exists(keys.job(old.id))  # its archive is all that is left
    assert redis_client.exists(keys.job_archive(old.id))
    assert names(alice, "?sort=gpus") == ["old", "new"]
    assert names(alice, "?sort=state&order=asc") == ["new", "old"]


@pytest.mark.parametrize("sort", ["created", "NAME", "user", "gpu", "id", "name;", "config"])
def test_an_unknown_sort_field_is_400(alice: AuthedClient, sort: str) -> None:
    resp = alice.get(f"/api/v1/jobs?sort={sort}")
    assert error_of(resp, 400) == "BadRequestError"
    assert "sort" in resp.json["fields"]  # type: ignore[index]


def test_an_empty_sort_is_submit_time(alice: AuthedClient, mixed: Jobs) -> None:
    assert names(alice, "?sort=") == names(alice)


_rows = st.lists(st.tuples(st.sampled_from(["alice", "bob", "Carol"]),
                           st.sampled_from(["default", "vision"]),
                           st.integers(min_value=0, max_value=3),
                           st.sampled_from([JobState.WAITING, JobState.RUNNING,
                                            JobState.SUCCEEDED])),
                 min_size=0, max_size=12)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_rows, sort=st.sampled_from(jobsort.SORTS), ascending=st.booleans(),
       size=st.integers(min_value=1, max_value=5), vc=st.sampled_from(["", "vision"]))
def test_pages_put_together_are_the_whole_sorted_list(
        redis_server: str, redis_client: redis.Redis,
        rows: list[tuple[str, str, int, JobState]], sort: str, ascending: bool,
        size: int, vc: str) -> None:
    with redis.Redis.from_url(operator_url(redis_server)) as operator:
        operator.flushdb()  # one database per example
    jobs = Jobs(Store(redis_client))
    for n, (user, cluster, gpus, state) in enumerate(rows):
        job = jobs.add(user, f"job-{n % 4}-{n}", vc=cluster, state=state,
                       created_ms=jobs.clock + 1000 * (n // 3))  # some share a millisecond
        _set(jobs, job, gpus=gpus)
    store = Store(redis_client)
    whole, total = store.list_jobs(vc=vc or None, sort=sort, oldest_first=ascending,
                                   limit=1000)
    pages: list[str] = []
    for offset in range(0, len(rows) + size, size):
        page, page_total = store.list_jobs(vc=vc or None, sort=sort, oldest_first=ascending,
                                           offset=offset, limit=size)
        assert page_total == total
        pages.extend(j.id for j in page)
    assert pages == [j.id for j in whole]
    assert total == len(whole) == sum(1 for r in rows if not vc or r[1] == vc)
    # sorted by the field, ties by submit time then id, all in the one direction
    key = {j.id: (jobsort.sort_key(sort, j.id, j.to_fields(), 0), j.created_ms, j.id)
           for j in whole}
    expected = sorted(key, key=key.__getitem__, reverse=not ascending)
    if sort != "duration":  # the only field read against the clock
        assert [j.id for j in whole] == expected


def test_the_columns_read_in_chunks_are_those_read_at_once(mixed: Jobs) -> None:
    store = mixed.store
    hashes = [keys.job(str(i)) for i in store.r.zrange(keys.JOBS, 0, -1)] + ["pai:job:gone"]
    fields = (("state", "-"), ("gpus", "0"), ("completed_ms", "-1"))
    whole = store.read_columns(hashes, fields)
    states = whole[0].split(" ")
    assert len(states) == len(hashes) and states[-1] == "-"  # a hash gone: the default
    assert set(states[:-1]) <= {s.value for s in JobState}
    for chunk in (1, 3, 7):
        assert store.read_columns(hashes, fields, chunk=chunk) == whole
