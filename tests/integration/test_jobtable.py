"""The API process's job table (shared/state/jobtable.py) on a real Redis:
kept current through the feed of changes across every kind of write (new
jobs, moves, retries, jobs removed, compacted, a submit a millisecond behind
a newer one), loaded again when the feed was trimmed past it or the jobs do
not add up, and always answering what sorting the records themselves gives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain import jobsort
from shared.domain.models import Job
from shared.domain.states import JobState
from shared.state import jobfeed, keys
from shared.state.lifecycle import delete_job
from shared.state.retention import compact_job
from shared.state.store import Store
from tests.support.joblist import Jobs
from tests.support.redis_server import operator_url

NOW = 10**13  # a fixed clock for `duration`, later than every job's start


def expected_page(store: Store, *, sort: str, descending: bool, offset: int, limit: int,
                  username: str | None = None, vc: str | None = None,
                  state: str | None = None) -> tuple[list[str], int]:
    """The page as the records say it is: every job read whole, filtered,
    sorted by (the field, creation time, id), one direction."""
    ids = [str(i) for i in store.r.zrange(keys.JOBS, 0, -1)]
    records = store.read_jobs(ids)
    chosen = [j for j in records.values()
              if (not username or j.username == username)
              and (not vc or j.virtual_cluster == vc) and (not state or j.state == state)]

    def key(job: Job) -> tuple[object, ...]:
        return (jobsort.sort_key(sort, job.id, job.to_fields(), NOW), job.created_ms, job.id)

    ordered = sorted(chosen, key=key, reverse=descending)
    return [j.id for j in ordered[offset:offset + limit]], len(ordered)


def assert_current(store: Store, **filters: str) -> None:
    """Every sort, both ways, a first and a middle page, as the records say."""
    for sort in jobsort.SORTS[1:]:
        for descending in (False, True):
            for offset, limit in ((0, 5), (3, 4), (0, 1000)):
                got = store.table.page(sort=sort, descending=descending, offset=offset,
                                       limit=limit, now=NOW, **filters)
                assert got == expected_page(store, sort=sort, descending=descending,
                                            offset=offset, limit=limit, **filters), \
                    (sort, descending, offset, filters)


def _set(jobs: Jobs, job: Job, state: JobState | None = None, **changes: int | None) -> None:
    for field, value in changes.items():
        setattr(job, field, value)
    previous = jobs.store.bump(job, state)
    with jobs.store.r.pipeline() as pipe:
        jobs.store.write_job(pipe, job, previous)
        pipe.execute()


@pytest.fixture
def fresh(redis_server: str) -> Iterator[None]:
    with redis.Redis.from_url(operator_url(redis_server)) as operator:
        operator.flushdb()
    yield


_STATES = [JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED]
_steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["alice", "Bob", "carol"]),
              st.sampled_from(["MNIST", "bert", "gpt-2", "mnist"]),
              st.sampled_from(["default", "vision"]), st.integers(0, 8),
              st.integers(-3, 2)),  # creation time against the newest: behind it at times
    st.tuples(st.just("move"), st.integers(0, 50), st.sampled_from(_STATES),
              st.integers(0, 3)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("compact"), st.integers(0, 50)),
    st.tuples(st.just("look"),)), max_size=30)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps)
def test_a_table_kept_by_the_feed_answers_as_the_records(
        redis_server: str, redis_client: redis.Redis, steps: list[tuple[object, ...]]) -> None:
    with redis.Redis.from_url(operator_url(redis_server)) as operator:
        operator.flushdb()  # one database per example
    jobs = Jobs(Store(redis_client))
    live = Store(redis_client)  # its table loads once, then follows the feed
    live.table.refresh()
    made: list[Job] = []
    for n, step in enumerate(steps):
        kind = step[0]
        if kind == "add":
            _, user, name, vc, gpus, behind = step
            created = jobs.clock + 1000 * int(behind)  # type: ignore[call-overload]
            job = jobs.add(str(user), f"{name}-{n}", vc=str(vc), created_ms=created)
            jobs.clock = max(jobs.clock, created)
            _set(jobs, job, gpus=int(gpus))  # type: ignore[call-overload]
            made.append(job)
        elif made and kind == "move":
            job = made[int(step[1]) % len(made)]  # type: ignore[call-overload]
            target, retries = step[2], int(step[3])  # type: ignore[call-overload]
            current = jobs.store.get_job(job.id)
            if current is not None and not current.state.is_final:
                started = None if target == JobState.WAITING else current.created_ms + 10
                completed = current.created_ms + 500 * (retries + 1) \
                    if JobState(target).is_final else None
                _set(jobs, current, JobState(target), retries=retries, started_ms=started,
                     completed_ms=completed)
        elif made and kind in ("delete", "compact"):
            job = made[int(step[1]) % len(made)]  # type: ignore[call-overload]
            if kind == "delete":
                delete_job(jobs.store, job.id)
            else:
                compact_job(jobs.store, job.id, None)
        else:
            assert_current(live)
    assert_current(live)
    assert_current(live, username="alice")
    assert_current(live, vc="vision", state="SUCCEEDED")
    assert live.table.loads == 1  # all of it through the feed


def test_a_reader_left_behind_a_trimmed_feed_loads_again(
        fresh: None, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = Jobs(Store(redis_client))
    live = Store(redis_client)
    first = jobs.add("alice", "first", state=JobState.RUNNING)
    live.table.refresh()
    monkeypatch.setattr(jobfeed, "MAX_LEN", 10)  # Redis trims whole nodes of 100
    for n in range(400):
        _set(jobs, first, retries=n)
    jobs.add("bob", "second")
    assert redis_client.xlen(keys.JOB_CHANGES) < 400  # the entries it needed are gone
    assert_current(live)
    assert live.table.loads == 2


def test_jobs_that_do_not_add_up_load_again(fresh: None, redis_client: redis.Redis) -> None:
    """A job removed without the feed (by hand, say) is not missed for ever."""
    jobs = Jobs(Store(redis_client))
    live = Store(redis_client)
    gone = jobs.add("alice", "gone")
    jobs.add("alice", "kept")
    live.table.refresh()
    redis_client.zrem(keys.JOBS, gone.id)
    redis_client.delete(keys.job(gone.id))
    assert live.table.page(sort="name", descending=False, offset=0, limit=10,
                           now=NOW)[0] == ["alice~kept"]
    assert live.table.loads == 2


def test_dead_rows_are_dropped_and_the_order_kept(fresh: None,
                                                  redis_client: redis.Redis) -> None:
    jobs = Jobs(Store(redis_client))
    live = Store(redis_client)
    made = [jobs.add(f"user{n % 3}", f"job-{(n * 7) % 40:02d}-{n}", state=JobState.SUCCEEDED)
            for n in range(1500)]
    live.table.refresh()
    for job in made[:1200]:
        delete_job(jobs.store, job.id)
    assert_current(live)
    assert live.table.dead == 0 and live.table.size == 300  # compacted
    jobs.add("user1", "job-00-late")
    assert_current(live, username="user1")
    assert live.table.loads == 1


def test_a_submit_behind_the_newest_takes_its_place_in_submit_order(
        fresh: None, redis_client: redis.Redis) -> None:
    """Two API processes' clocks a millisecond apart: the older job's write
    can commit after the newer one's. Ties still go by creation time."""
    jobs = Jobs(Store(redis_client))
    live = Store(redis_client)
    newest = jobs.add("alice", "newest")
    live.table.refresh()
    jobs.add("bob", "older", created_ms=newest.created_ms - 1)
    jobs.add("carol", "same-ms", created_ms=newest.created_ms)  # "carol~" sorts after "alice~"
    live.table.refresh()
    jobs.add("dave", "oldest", created_ms=newest.created_ms - 5)
    assert live.table.page(sort="gpus", descending=False, offset=0, limit=10, now=NOW)[0] \
        == ["dave~oldest", "bob~older", "alice~newest", "carol~same-ms"]
    assert_current(live)
    assert live.table.loads == 1


def test_the_feed_stays_bounded(fresh: None, redis_client: redis.Redis,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobfeed, "MAX_LEN", 150)
    jobs = Jobs(Store(redis_client))
    job = jobs.add("alice", "busy", state=JobState.RUNNING)
    for n in range(1000):
        _set(jobs, job, retries=n)
    assert redis_client.xlen(keys.JOB_CHANGES) < 400
