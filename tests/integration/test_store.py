"""The Redis store on a real throwaway Redis (no mocks): records, indexes, logs."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain.jobspec import MAX_TOTAL_TASKS
from shared.domain.models import Allocation, Attempt, Gpu, Job, Node, Task, job_id_of
from shared.domain.priority import PriorityClass, queue_order
from shared.domain.states import JobState, TaskState
from shared.state import keys
from shared.state.lifecycle import request_stop, submit_job
from shared.state.store import (
    MAX_TRANSACTION_RETRIES,
    Contention,
    Expect,
    ExpectationFailed,
    JobConflict,
    Pipe,
    Store,
)
from tests.support.texts import AWKWARD_TEXTS

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


def config(name: str = "mnist", *, vc: str | None = None, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "jobName": name,
        "image": "busybox",
        "taskRoles": [
            {"name": "ps", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 512,
             "gpuNumber": 0, "command": "sleep 1"},
            {"name": "worker", "taskNumber": 2, "cpuNumber": 2, "memoryMB": 1024,
             "gpuNumber": 1, "command": "python train.py"},
        ],
        **extra,
    }
    if vc is not None:
        cfg["virtualCluster"] = vc
    return cfg


# ------------------------------------------------------------------ jobs


def test_submit_stores_a_waiting_queued_job(store: Store, redis_client: redis.Redis) -> None:
    job = submit_job(store, "alice", config())
    assert job.id == "alice~mnist"
    stored = store.get_job(job.id)
    assert stored is not None
    assert stored == job
    assert stored.state == JobState.WAITING
    assert (stored.username, stored.name, stored.virtual_cluster) == ("alice", "mnist", "default")
    assert (stored.attempt, stored.retries, stored.platform_retries) == (0, 0, 0)
    assert stored.queue_seq >= 1
    assert store.queued_job_ids() == [job.id]
    assert redis_client.zscore(keys.QUEUE, job.id) == stored.queue_seq
    assert redis_client.zscore(keys.JOBS, job.id) == job.created_ms
    assert redis_client.zscore(keys.user_jobs("alice"), job.id) == job.created_ms
    assert redis_client.zscore(keys.vc_jobs("default"), job.id) == job.created_ms
    assert redis_client.zscore(keys.state_jobs("WAITING"), job.id) == job.created_ms


def test_each_submission_gets_a_later_queue_place(store: Store) -> None:
    first = submit_job(store, "alice", config("a"))
    second = submit_job(store, "alice", config("b"))
    assert second.queue_seq > first.queue_seq
    assert store.queued_job_ids() == [first.id, second.id]


def test_duplicate_submission_conflicts_and_changes_nothing(
    store: Store, redis_client: redis.Redis,
) -> None:
    job = submit_job(store, "alice", config())
    before = {k: redis_client.type(k) for k in redis_client.scan_iter("*") if k != keys.QUEUE_SEQ}
    with pytest.raises(JobConflict, match="mnist"):
        submit_job(store, "alice", config() | {"image": "other"})
    assert store.get_job(job.id) == job
    assert store.get_config(job.id) == config()
    after = {k: redis_client.type(k) for k in redis_client.scan_iter("*") if k != keys.QUEUE_SEQ}
    assert after == before
    assert len(store.get_events(job.id)) == 1


def test_same_name_for_another_user_is_another_job(store: Store) -> None:
    a = submit_job(store, "alice", config())
    b = submit_job(store, "bob", config())
    assert a.id != b.id
    assert store.get_job(b.id) is not None


def test_get_missing_job_is_none(store: Store) -> None:
    assert store.get_job("nobody~nothing") is None
    assert store.get_config("nobody~nothing") is None
    assert store.get_tasks("nobody~nothing", 0) == []
    assert store.get_attempts("nobody~nothing") == []
    assert store.get_events("nobody~nothing") == []


def test_config_round_trips(store: Store) -> None:
    cfg = config(jobEnvs={"LR": 0.1, "DEBUG": True, "NAME": "x"}, extras={"a": [1, 2]},
                 retryCount=2)
    job = submit_job(store, "alice", cfg)
    assert store.get_config(job.id) == cfg


def test_tasks_of_attempt_zero_are_all_waiting_sorted(store: Store) -> None:
    job = submit_job(store, "alice", config())
    tasks = store.get_tasks(job.id, 0)
    assert [(t.role, t.index) for t in tasks] == [("ps", 0), ("worker", 0), ("worker", 1)]
    assert all(t.state == TaskState.WAITING for t in tasks)
    assert all(t.node is None and t.gpus == [] and t.exit_code is None for t in tasks)
    assert store.get_tasks(job.id, 1) == []


def test_task_round_trips_every_field(store: Store, redis_client: redis.Redis) -> None:
    task = Task(role="worker", index=1, state=TaskState.RUNNING, node="n1", ip="10.0.0.1",
                gpus=[2, 3], ports={"default": [15000], "ssh": [15001, 15002]},
                container_id="abc", exit_code=None, diagnostics="d", platform_failure=True,
                launched_ms=1, started_ms=2, completed_ms=None)
    with redis_client.pipeline() as pipe:
        store.write_tasks(pipe, "alice~x", 3, [task])
        pipe.execute()
    assert store.get_tasks("alice~x", 3) == [task]
    assert store.get_tasks("alice~x", 3)[0].default_port == 15000


def test_the_first_attempt_is_recorded(store: Store) -> None:
    job = submit_job(store, "alice", config())
    attempts = store.get_attempts(job.id)
    assert len(attempts) == 1
    assert attempts[0].index == 0
    assert attempts[0].state == "RUNNING"
    assert attempts[0].created_ms == job.created_ms
    assert attempts[0].completed_ms is None


def test_attempts_come_back_in_index_order(store: Store, redis_client: redis.Redis) -> None:
    with redis_client.pipeline() as pipe:
        for index in (10, 2, 0, 1):
            store.write_attempt(pipe, "alice~x", Attempt(index=index, exit_code=index))
        pipe.execute()
    assert [a.index for a in store.get_attempts("alice~x")] == [0, 1, 2, 10]
    assert store.read_attempt(redis_client, "alice~x", 2) == Attempt(index=2, exit_code=2)
    assert store.read_attempt(redis_client, "alice~x", 3) is None


def test_submission_event_is_recorded(store: Store) -> None:
    job = submit_job(store, "alice", config())
    events = store.get_events(job.id)
    assert [e["kind"] for e in events] == ["submitted"]
    assert events[0]["attempt"] == 0
    assert isinstance(events[0]["time"], int)


def test_job_record_round_trips_optional_fields(store: Store, redis_client: redis.Redis) -> None:
    job = Job(id="alice~x", username="alice", name="x", virtual_cluster="vc1",
              state=JobState.FAILED, version=7, created_ms=5, completed_ms=9, attempt=2,
              retries=2, platform_retries=1, execution_type="START", exit_code=3,
              exit_diagnostics="boom", waiting_reason="", queue_seq=4)
    with redis_client.pipeline() as pipe:
        store.write_job(pipe, job, previous_state=None)
        pipe.execute()
    assert store.get_job(job.id) == job
    assert redis_client.zscore(keys.state_jobs("FAILED"), job.id) == 5


# ------------------------------------------- the one-round-trip create


def _new_job(name: str, *, created_ms: int = 1_000, priority: str = "test",
             vc: str = "default") -> tuple[Job, dict[str, Any], list[Task], Attempt]:
    cfg = config(name, vc=vc)
    job = Job(id=job_id_of("alice", name), username="alice", name=name, virtual_cluster=vc,
              created_ms=created_ms, version=1, gpus=2, user_id="uid-1", priority=priority)
    tasks = [Task(role="ps", index=0), Task(role="worker", index=0),
             Task(role="worker", index=1)]
    return job, cfg, tasks, Attempt(index=0, created_ms=created_ms)


@pytest.mark.parametrize("priority", ["prod", "test", "oppo"])
def test_insert_job_writes_the_record_indexes_queue_places_and_event(
        store: Store, redis_client: redis.Redis, priority: str) -> None:
    """The script writes what `write_job`, `enqueue` and `add_event` write:
    read back through the store's own readers, not the script's keys."""
    submit_job(store, "bob", config("earlier"))  # the sequence is shared
    job, cfg, tasks, attempt = _new_job("one", priority=priority, vc="research")
    stored, claimed = store.insert_job(job, cfg, tasks, attempt)
    assert not claimed and redis_client.get(keys.PASS_REQUESTED) is None
    assert stored.queue_seq == 2
    assert store.get_job(job.id) == stored
    assert store.get_config(job.id) == cfg
    assert store.get_tasks(job.id, 0) == sorted(tasks, key=lambda t: (t.role, t.index))
    assert store.get_attempts(job.id) == [attempt]
    for index in (keys.JOBS, keys.user_jobs("alice"), keys.vc_jobs("research"),
                  keys.state_jobs("WAITING")):
        assert redis_client.zscore(index, job.id) == 1_000, index
    assert redis_client.zscore(keys.QUEUE, job.id) == 2
    assert redis_client.zscore(keys.vc_queue("research"), job.id) == \
        queue_order(PriorityClass.parse(priority), 2)
    events = store.get_events(job.id)
    assert [(e["kind"], e["attempt"]) for e in events] == [("submitted", 0)]
    assert isinstance(events[0]["time"], int)


def test_insert_job_of_the_most_tasks_a_job_may_have(store: Store) -> None:
    """MAX_TOTAL_TASKS tasks: more fields than one Lua call can unpack."""
    job, cfg, _tasks, attempt = _new_job("wide")
    tasks = [Task(role="worker", index=i) for i in range(MAX_TOTAL_TASKS)]
    stored, _claimed = store.insert_job(job, cfg, tasks, attempt)
    assert len(store.get_tasks(stored.id, 0)) == MAX_TOTAL_TASKS


def test_insert_job_claims_the_pass_flag_only_when_nobody_holds_it(
        store: Store, redis_client: redis.Redis) -> None:
    first = store.insert_job(*_new_job("a"), pass_request_ms=5_000)
    second = store.insert_job(*_new_job("b"), pass_request_ms=5_000)
    assert (first[1], second[1]) == (True, False)
    assert 0 < redis_client.pttl(keys.PASS_REQUESTED) <= 5_000
    redis_client.delete(keys.PASS_REQUESTED)  # the scheduler's pass took it
    assert store.insert_job(*_new_job("c"), pass_request_ms=5_000)[1] is True


def test_insert_job_replayed_finds_its_own_job_and_writes_nothing_twice(
        store: Store, redis_client: redis.Redis) -> None:
    """A submit sent again after its reply was lost: its own job back, with
    its queue place, and still one event, one queue entry, one sequence."""
    job, cfg, tasks, attempt = _new_job("replayed")
    first, _ = store.insert_job(dataclasses.replace(job), cfg, tasks, attempt)
    redis_client.delete(keys.PASS_REQUESTED)
    again, claimed = store.insert_job(dataclasses.replace(job), cfg, tasks, attempt,
                                      pass_request_ms=1_000)
    assert again == first and claimed  # the lost reply's wake-up is sent now
    assert int(redis_client.get(keys.QUEUE_SEQ)) == first.queue_seq
    assert len(store.get_events(job.id)) == 1
    assert store.queued_job_ids() == [job.id]


# Texts the script's one JSON array must carry as they are (AWKWARD_TEXTS)
_TEXT_JOBS = itertools.count()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.sampled_from(AWKWARD_TEXTS)
                      | st.text(st.characters(blacklist_categories=("Cs",))),
                      min_size=3, max_size=3))
def test_insert_job_stores_every_field_byte_for_byte(
        store: Store, redis_client: redis.Redis, redis_server: str, texts: list[str]) -> None:
    """The fields and expectations travel as one JSON array: what Redis
    holds is what the fields are, encoded as UTF-8, and an expectation on
    such a text holds."""
    diagnostics, user_id, expected = texts
    redis_client.hset("pai:test:expected", "field", expected)
    job, cfg, _tasks, attempt = _new_job(f"text-{next(_TEXT_JOBS)}")
    job = dataclasses.replace(job, user_id=user_id, exit_diagnostics=diagnostics)
    tasks = [Task(role="worker", index=0, diagnostics=diagnostics)]
    stored, _ = store.insert_job(
        job, cfg, tasks, attempt,
        expectations=[Expect.field_equals("pai:test:expected", "field", expected)])
    with redis.Redis.from_url(redis_server) as raw_client:
        raw = raw_client.hgetall(keys.job(job.id))
    assert raw[b"user_id"] == user_id.encode()
    assert raw[b"exit_diagnostics"] == diagnostics.encode()
    assert store.get_job(job.id) == stored
    assert store.get_tasks(job.id, 0) == tasks
    with pytest.raises(ExpectationFailed):
        store.insert_job(
            dataclasses.replace(job, id=job.id + "x", name=job.name + "x"), cfg, tasks,
            attempt,
            expectations=[Expect.field_equals("pai:test:expected", "field", expected + "!")])


@pytest.mark.parametrize("change", ["another config", "another submit time"])
def test_insert_job_of_a_taken_name_is_a_conflict_that_changes_nothing(
        store: Store, redis_client: redis.Redis, change: str) -> None:
    job, cfg, tasks, attempt = _new_job("taken")
    first, _ = store.insert_job(dataclasses.replace(job), cfg, tasks, attempt)
    if change == "another config":
        cfg = {**cfg, "jobEnvs": {"X": "1"}}
    else:
        job = dataclasses.replace(job, created_ms=job.created_ms + 1)
    with pytest.raises(JobConflict):
        store.insert_job(job, cfg, [Task(role="other", index=0)], attempt,
                         pass_request_ms=1_000)
    assert store.get_job(first.id) == first
    assert store.get_config(first.id) == config("taken", vc="default")
    assert [t.role for t in store.get_tasks(first.id, 0)] == ["ps", "worker", "worker"]
    assert int(redis_client.get(keys.QUEUE_SEQ)) == first.queue_seq
    assert len(store.get_events(first.id)) == 1
    assert redis_client.get(keys.PASS_REQUESTED) is None


# ------------------------------------------------------------- listing


def add_job(store: Store, user: str, name: str, created_ms: int, vc: str = "default") -> Job:
    """A job with a chosen creation time, so newest-first order is exact."""
    job = Job(id=job_id_of(user, name), username=user, name=name, virtual_cluster=vc,
              created_ms=created_ms, version=1)
    cfg = config(name, vc=vc)
    tasks = [Task(role="ps", index=0), Task(role="worker", index=0),
             Task(role="worker", index=1)]
    return store.create_job(job, cfg, tasks, Attempt(index=0, created_ms=created_ms))


@pytest.fixture
def listed(store: Store) -> dict[str, Job]:
    """Seven jobs: alice and bob, in vcs default and research; one stopped."""
    jobs = [
        add_job(store, "alice", "a1", 1000),
        add_job(store, "bob", "b1", 2000),
        add_job(store, "alice", "a2", 3000, vc="research"),
        add_job(store, "alice", "a3", 4000),
        add_job(store, "bob", "b2", 5000, vc="research"),
        add_job(store, "alice", "a4", 6000),
        add_job(store, "bob", "b3", 7000),
    ]
    request_stop(store, "alice~a3")  # nothing placed: straight to STOPPED
    return {j.name: j for j in jobs}


def names(jobs: list[Job]) -> list[str]:
    return [j.name for j in jobs]


@pytest.mark.parametrize(("filters", "expected"), [
    pytest.param({}, ["b3", "a4", "b2", "a3", "a2", "b1", "a1"], id="all, newest first"),
    pytest.param({"username": "alice"}, ["a4", "a3", "a2", "a1"], id="by user"),
    pytest.param({"vc": "research"}, ["b2", "a2"], id="by vc"),
    pytest.param({"state": "STOPPED"}, ["a3"], id="by state STOPPED"),
    pytest.param({"state": "WAITING"}, ["b3", "a4", "b2", "a2", "b1", "a1"],
                 id="by state WAITING"),
    pytest.param({"username": "alice", "vc": "default"}, ["a4", "a3", "a1"],
                 id="by user and vc"),
    pytest.param({"username": "alice", "state": "WAITING"}, ["a4", "a2", "a1"],
                 id="by user and state"),
    pytest.param({"username": "bob", "vc": "research", "state": "WAITING"}, ["b2"],
                 id="by user, vc and state"),
    pytest.param({"username": "carol"}, [], id="unknown user"),
    pytest.param({"username": "bob", "state": "STOPPED"}, [], id="no match in the intersection"),
])
def test_list_jobs_filters_newest_first(
    store: Store, listed: dict[str, Job], filters: dict[str, Any], expected: list[str],
) -> None:
    jobs, total = store.list_jobs(**filters)
    assert names(jobs) == expected
    assert total == len(expected)


@pytest.mark.parametrize("filters", [
    pytest.param({}, id="one index"),
    pytest.param({"username": "alice", "state": "WAITING"}, id="intersection"),
])
@pytest.mark.parametrize("limit", [1, 2, 3, 10])
def test_list_jobs_pages_cover_the_list_once(
    store: Store, listed: dict[str, Job], filters: dict[str, Any], limit: int,
) -> None:
    everything, total = store.list_jobs(**filters)
    paged: list[Job] = []
    for offset in range(0, total + limit, limit):
        page, page_total = store.list_jobs(offset=offset, limit=limit, **filters)
        assert page_total == total
        assert len(page) <= limit
        paged.extend(page)
    assert names(paged) == names(everything)


def test_list_jobs_page_in_the_middle(store: Store, listed: dict[str, Job]) -> None:
    jobs, total = store.list_jobs(offset=2, limit=3)
    assert names(jobs) == ["b2", "a3", "a2"]
    assert total == 7


def test_list_jobs_past_the_end_is_empty_with_the_total(
    store: Store, listed: dict[str, Job],
) -> None:
    assert store.list_jobs(offset=100, limit=10) == ([], 7)


def test_list_jobs_returns_current_records(store: Store, listed: dict[str, Job]) -> None:
    jobs, _ = store.list_jobs(state="STOPPED")
    assert jobs[0].state == JobState.STOPPED
    assert jobs[0] == store.get_job("alice~a3")


def test_state_index_holds_each_job_once(store: Store, listed: dict[str, Job],
                                         redis_client: redis.Redis) -> None:
    seen: list[str] = []
    for state in JobState:
        members: list[str] = redis_client.zrange(keys.state_jobs(state), 0, -1)  # type: ignore[assignment]
        seen.extend(members)
    assert sorted(seen) == sorted(j.id for j in listed.values())


# ------------------------------------------------------------ transactions


def test_transact_reruns_on_a_conflicting_write(store: Store, redis_server: str) -> None:
    other = redis.Redis.from_url(redis_server, decode_responses=True)
    store.r.set("pai:test:counter", "0")
    calls: list[str] = []

    def bump(pipe: Pipe) -> int:
        value = int(pipe.get("pai:test:counter"))
        calls.append(str(value))
        if len(calls) == 1:
            other.set("pai:test:counter", "10")  # someone else wins the race once
        pipe.multi()
        pipe.set("pai:test:counter", str(value + 1))
        return value + 1

    try:
        assert store.transact(bump, "pai:test:counter") == 11
    finally:
        other.close()
    assert calls == ["0", "10"]
    assert store.r.get("pai:test:counter") == "11"


def test_transact_gives_up_with_contention(store: Store, redis_server: str) -> None:
    other = redis.Redis.from_url(redis_server, decode_responses=True)
    calls = 0

    def always_loses(pipe: Pipe) -> None:
        nonlocal calls
        calls += 1
        pipe.get("pai:test:hot")
        other.incr("pai:test:hot")
        pipe.multi()
        pipe.set("pai:test:mine", "written")

    try:
        with pytest.raises(Contention):
            store.transact(always_loses, "pai:test:hot")
    finally:
        other.close()
    assert calls == MAX_TRANSACTION_RETRIES
    assert store.r.get("pai:test:mine") is None


def test_transact_without_writes_returns_its_answer(store: Store) -> None:
    assert store.transact(lambda pipe: pipe.exists("pai:nothing"), "pai:nothing") == 0


# ------------------------------------------------------------------ nodes


def node(name: str = "gpu-01") -> Node:
    return Node(name=name, ip="10.0.0.1", cpus=16, memory_mb=64_000,
                gpus=[Gpu(index=0, uuid="GPU-a", model="V100", memory_mb=16_000),
                      Gpu(index=1, uuid="GPU-b", model="V100", memory_mb=16_000)],
                port_range=(20000, 30000), real_cpus=8, nvidia_runtime=True)


def test_registered_node_round_trips(store: Store) -> None:
    registered = node()
    store.register_node(registered)
    assert registered.heartbeat_ms > 0
    assert store.get_nodes() == [registered]
    assert store.node_heartbeats() == {"gpu-01": registered.heartbeat_ms}


def test_no_nodes(store: Store) -> None:
    assert store.get_nodes() == []
    assert store.node_heartbeats() == {}


def test_heartbeat_renews_the_lease(store: Store, redis_client: redis.Redis) -> None:
    store.register_node(node())
    redis_client.zadd(keys.NODES, {"gpu-01": 1})  # an old lease
    store.heartbeat("gpu-01")
    beat = store.node_heartbeats()["gpu-01"]
    assert beat > 1
    [again] = store.get_nodes()
    assert again.heartbeat_ms == beat
    assert again.gpus == node().gpus


def test_reregistering_updates_the_inventory(store: Store) -> None:
    store.register_node(node())
    changed = node()
    changed.gpus = changed.gpus[:1]
    store.register_node(changed)
    [stored] = store.get_nodes()
    assert len(stored.gpus) == 1


def test_heartbeat_of_an_unregistered_node_lists_no_node(store: Store) -> None:
    store.register_node(node("gpu-01"))
    store.heartbeat("ghost")
    assert [n.name for n in store.get_nodes()] == ["gpu-01"]
    assert set(store.node_heartbeats()) == {"gpu-01", "ghost"}


def test_allocations_write_read_release(store: Store, redis_client: redis.Redis) -> None:
    alloc = Allocation(job_id="alice~x", attempt=0, role="worker", index=1, node="gpu-01",
                       gpus=(0, 1), cpus=2, memory_mb=1024, ports=(20000, 20001))
    with redis_client.pipeline() as pipe:
        store.write_allocation(pipe, alloc)
        pipe.execute()
    assert store.get_allocations(redis_client, "gpu-01") == {"alice~x:0:worker:1": alloc}
    assert store.release_allocation("gpu-01", alloc.key) is True
    assert store.release_allocation("gpu-01", alloc.key) is False
    assert store.get_allocations(redis_client, "gpu-01") == {}


# ------------------------------------------------------------------- logs

JOB = "alice~mnist"


def test_log_lines_read_back_in_order(store: Store) -> None:
    store.append_log(JOB, 0, "worker", 0, ["one", "two"], max_lines=100)
    store.append_log(JOB, 0, "worker", 0, ["three"], max_lines=100)
    assert [line for _, line in store.read_log(JOB, 0, "worker", 0)] == ["one", "two", "three"]


def test_logs_are_kept_per_task_and_attempt(store: Store) -> None:
    store.append_log(JOB, 0, "worker", 0, ["a0"], max_lines=100)
    store.append_log(JOB, 0, "worker", 1, ["b0"], max_lines=100)
    store.append_log(JOB, 1, "worker", 0, ["a1"], max_lines=100)
    assert [line for _, line in store.read_log(JOB, 0, "worker", 0)] == ["a0"]
    assert [line for _, line in store.read_log(JOB, 0, "worker", 1)] == ["b0"]
    assert [line for _, line in store.read_log(JOB, 1, "worker", 0)] == ["a1"]


def test_log_tail(store: Store) -> None:
    store.append_log(JOB, 0, "worker", 0, [f"line {i}" for i in range(10)], max_lines=100)
    assert [line for _, line in store.read_log(JOB, 0, "worker", 0, tail=3)] == [
        "line 7", "line 8", "line 9"]
    assert len(store.read_log(JOB, 0, "worker", 0, tail=50)) == 10


def test_log_after_an_id_returns_only_later_lines(store: Store) -> None:
    store.append_log(JOB, 0, "worker", 0, ["a", "b", "c", "d"], max_lines=100)
    entries = store.read_log(JOB, 0, "worker", 0)
    after_b = store.read_log(JOB, 0, "worker", 0, after=entries[1][0])
    assert [line for _, line in after_b] == ["c", "d"]
    assert store.read_log(JOB, 0, "worker", 0, after=entries[-1][0]) == []
    store.append_log(JOB, 0, "worker", 0, ["e"], max_lines=100)
    assert [line for _, line in store.read_log(JOB, 0, "worker", 0, after=entries[-1][0])] == [
        "e"]


def test_log_ids_increase(store: Store) -> None:
    store.append_log(JOB, 0, "worker", 0, [str(i) for i in range(20)], max_lines=100)
    ids = [entry_id for entry_id, _ in store.read_log(JOB, 0, "worker", 0)]
    as_pairs = [tuple(int(part) for part in i.split("-")) for i in ids]
    assert as_pairs == sorted(as_pairs)
    assert len(set(ids)) == 20


def test_empty_log_append_is_a_no_op(store: Store, redis_client: redis.Redis) -> None:
    store.append_log(JOB, 0, "worker", 0, [], max_lines=100)
    assert not redis_client.exists(keys.task_log(JOB, 0, "worker", 0))
    assert store.read_log(JOB, 0, "worker", 0) == []
    assert store.read_log(JOB, 0, "worker", 0, tail=5) == []


def test_unusual_log_lines_survive(store: Store) -> None:
    lines = ["", "  indented", "ünïcødé ✓", "tab\there", "x" * 10_000]
    store.append_log(JOB, 0, "worker", 0, lines, max_lines=100)
    assert [line for _, line in store.read_log(JOB, 0, "worker", 0)] == lines


@pytest.mark.parametrize("max_lines", [100, 500])
def test_log_is_bounded_about_max_lines(
    store: Store, redis_client: redis.Redis, max_lines: int,
) -> None:
    written = [f"line {i}" for i in range(max_lines * 10)]
    for start in range(0, len(written), 250):
        store.append_log(JOB, 0, "worker", 0, written[start:start + 250], max_lines=max_lines)
    kept, added = store.log_extent(JOB, 0, "worker", 0)
    assert added == len(written)
    assert max_lines <= kept < max_lines + 250  # whole entries go, 250 lines each here
    read = [line for _, line in store.read_log(JOB, 0, "worker", 0)]
    assert read == written[-kept:]  # the newest lines are the ones kept, and counted


@pytest.mark.parametrize("tail", [0, 1, 99, 100, 101, 550, 1234, 5000])
def test_a_tail_as_text_is_the_last_lines_read_one_by_one(store: Store, tail: int) -> None:
    written = [f"line {i}" for i in range(1, 1235)]
    for start in range(0, len(written), 100):
        store.append_log(JOB, 0, "worker", 0, written[start:start + 100], max_lines=100_000)
    lines = [line for _, line in store.read_log(JOB, 0, "worker", 0, tail=tail)]
    assert lines == (written[-tail:] if tail else [])
    assert store.tail_text(JOB, 0, "worker", 0, tail) == "".join(f"{line}\n" for line in lines)


def test_a_tail_of_a_legacy_stream_reads_its_entry_a_line(
        store: Store, redis_client: redis.Redis) -> None:
    for n in range(1, 6):
        redis_client.xadd(keys.task_log(JOB, 0, "worker", 0), {"l": f"old {n}"})
    assert store.tail_text(JOB, 0, "worker", 0, 2) == "old 4\nold 5\n"
    assert [line for _, line in store.read_log(JOB, 0, "worker", 0, tail=2)] == ["old 4", "old 5"]
    assert store.log_extent(JOB, 0, "worker", 0) == (5, 5)


def test_a_follows_read_brings_about_a_thousand_lines_whatever_the_format(
        store: Store, redis_client: redis.Redis) -> None:
    written = [str(n) for n in range(1, 2501)]
    store.append_log(JOB, 0, "worker", 0, written, max_lines=100_000)  # five entries of 500
    got = store.follow_log(JOB, 0, "worker", 0, after="0-0", block_ms=0)
    assert [line for _, line in got] == written[:1000]
    got = store.follow_log(JOB, 0, "worker", 0, after=got[-1][0], block_ms=0)
    assert [line for _, line in got] == written[1000:2000]

    for n in range(1, 1501):
        redis_client.xadd(keys.task_log(JOB, 1, "worker", 0), {"l": f"old {n}"})
    first = store.follow_log(JOB, 1, "worker", 0, after="0-0", block_ms=0)  # its format unknown
    assert [line for _, line in first] == ["old 1", "old 2"]
    legacy = store.follow_log(JOB, 1, "worker", 0, after=first[-1][0], block_ms=0)
    assert [line for _, line in legacy] == [f"old {n}" for n in range(3, 1003)]
