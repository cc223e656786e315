"""Job and task lifecycles through `shared.state.lifecycle`, on a real throwaway Redis.

Each transition is a compare-and-set: the concurrency tests run two writers,
each with its own connection, against the same job at the same moment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import redis

from shared.domain.completion import NON_RETRYABLE_PREFIX
from shared.domain.models import (
    Gpu,
    Job,
    Node,
    TaskPlacement,
    attempt_task_key,
    parse_attempt_task_key,
)
from shared.domain.states import JobState, TaskState
from shared.state import keys, lifecycle, passwake
from shared.state.lifecycle import (
    ModeChange,
    delete_job,
    mark_preempted,
    mark_task_running,
    request_stop,
    set_modes,
    set_waiting,
    submit_job,
)
from shared.state.placing import commit_placement
from shared.state.store import Store
from shared.state.taskexits import ExitReport, record_task_exit
from tests.support.interleave import Hook, with_hooks
from tests.support.lifecycle import DEADLINE_MS, ROUNDS, job_of, place, placements, race
from tests.support.roundtrips import counting_client

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    for name in ("n1", "n2"):
        store.register_node(Node(name, "10.0.0.1", cpus=1024, memory_mb=1 << 30,
                                 gpus=[Gpu(i) for i in range(1024)]))
    return store


def role(name: str, number: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "taskNumber": number, "cpuNumber": 1, "memoryMB": 512,
            "gpuNumber": 1, "command": "python train.py", **extra}


def config(name: str = "mnist", roles: list[dict[str, Any]] | None = None,
           **extra: Any) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox",
            "taskRoles": roles or [role("main", 1)], **extra}


def start_all(store: Store, job_id: str) -> None:
    """Place the current attempt's tasks and mark every one running."""
    place(store, job_id)
    job = job_of(store, job_id)
    for task in store.get_tasks(job_id, job.attempt):
        assert mark_task_running(store, job_id, job.attempt, task.role, task.index,
                                 f"c-{task.role}-{task.index}")


def exit_task(store: Store, job_id: str, role_name: str, index: int, code: int,
              **kwargs: Any) -> ExitReport:
    job = job_of(store, job_id)
    report = record_task_exit(store, job_id, job.attempt, role_name, index, exit_code=code,
                              **kwargs)
    assert report is not None
    return report


def task_states(store: Store, job_id: str, attempt: int) -> dict[str, TaskState]:
    return {t.key: t.state for t in store.get_tasks(job_id, attempt)}


def event_kinds(store: Store, job_id: str) -> list[str]:
    return [e["kind"] for e in store.get_events(job_id)]


def assert_state_index_consistent(redis_client: redis.Redis, job: Job) -> None:
    """The job is listed under its own state and no other."""
    for state in JobState:
        listed = redis_client.zscore(keys.state_jobs(state), job.id) is not None
        assert listed == (state == job.state), (state, job.state)


# ------------------------------------------------------------ the happy path


def test_submit_place_run_exit_zero_succeeds(store: Store, redis_client: redis.Redis) -> None:
    job = submit_job(store, "alice", config())

    assert commit_placement(store, job.id, version=job.version, attempt=0,
                            placements=placements(store, job.id), launch_deadline_ms=DEADLINE_MS)
    placed = job_of(store, job.id)
    assert placed.state == JobState.WAITING
    assert placed.version == job.version + 1
    [task] = store.get_tasks(job.id, 0)
    assert (task.state, task.node, task.gpus, task.ports) == (
        TaskState.LAUNCHING, "n1", [0], {"default": [20000]})
    assert task.launched_ms is not None
    assert store.queued_job_ids() == []
    member = attempt_task_key(job.id, 0, "main", 0)
    assert member == "alice~mnist:0:main:0"
    assert parse_attempt_task_key(member) == ("alice~mnist", 0, "main", 0)
    assert redis_client.zscore(keys.LAUNCHING, member) == DEADLINE_MS
    allocs = store.get_allocations(redis_client, "n1")
    assert list(allocs) == [member]
    assert (allocs[member].gpus, allocs[member].ports) == ((0,), (20000,))

    assert mark_task_running(store, job.id, 0, "main", 0, "container-1")
    running = job_of(store, job.id)
    assert running.state == JobState.RUNNING
    [task] = store.get_tasks(job.id, 0)
    assert (task.state, task.container_id) == (TaskState.RUNNING, "container-1")
    assert redis_client.zscore(keys.LAUNCHING, member) is None
    assert store.get_attempts(job.id)[0].started_ms == task.started_ms

    report = record_task_exit(store, job.id, 0, "main", 0, exit_code=0)
    assert report == ExitReport(task_state=TaskState.SUCCEEDED, job_state=JobState.SUCCEEDED,
                                attempt_ended=True, retried=False, node="n1")
    done = job_of(store, job.id)
    assert done.state == JobState.SUCCEEDED
    assert done.exit_code == 0
    assert done.completed_ms is not None
    [attempt] = store.get_attempts(job.id)
    assert (attempt.state, attempt.exit_code) == ("SUCCEEDED", 0)
    assert attempt.completed_ms is not None
    assert event_kinds(store, job.id) == [
        "submitted", "placed", "task-running", "task-exit", "attempt-end"]
    assert_state_index_consistent(redis_client, done)


def test_a_job_read_before_its_retry_is_shown_with_the_tasks_of_its_new_attempt(
        store: Store) -> None:
    """What a job's detail shows (`Store.job_with_tasks`): the record and the
    tasks of the attempt it names, read together, though the record the
    caller holds named the attempt before."""
    job = submit_job(store, "alice", config(retryCount=1))
    start_all(store, job.id)
    before = job_of(store, job.id)
    exit_task(store, job.id, "main", 0, 1)  # a retry: attempt 1, its task waiting

    shown, tasks = store.job_with_tasks(before)

    assert (before.attempt, shown.attempt, shown.state) == (0, 1, JobState.WAITING)
    assert [(t.key, t.state) for t in tasks] == [("main:0", TaskState.WAITING)]
    start_all(store, job.id)
    shown, tasks = store.job_with_tasks(shown)
    assert (shown.state, [t.state for t in tasks]) == (JobState.RUNNING, [TaskState.RUNNING])


def test_every_transition_bumps_the_version(store: Store) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)]))
    versions = [job.version]
    place(store, job.id)
    versions.append(job_of(store, job.id).version)
    mark_task_running(store, job.id, 0, "main", 0, "c0")
    versions.append(job_of(store, job.id).version)
    mark_task_running(store, job.id, 0, "main", 1, "c1")
    versions.append(job_of(store, job.id).version)
    exit_task(store, job.id, "main", 0, 0)
    versions.append(job_of(store, job.id).version)
    exit_task(store, job.id, "main", 1, 0)
    versions.append(job_of(store, job.id).version)
    assert versions == sorted(set(versions))


def test_exit_from_launching_counts(store: Store) -> None:
    """A container that ran and exited before its start was seen still settles."""
    job = submit_job(store, "alice", config())
    place(store, job.id)
    report = exit_task(store, job.id, "main", 0, 0)
    assert (report.task_state, report.job_state) == (TaskState.SUCCEEDED, JobState.SUCCEEDED)


def test_kill_all_on_completed_ends_the_attempt_with_ps_still_running(
    store: Store, redis_client: redis.Redis,
) -> None:
    job = submit_job(store, "alice", config(
        roles=[role("ps_server", 2), role("worker", 2)], killAllOnCompletedTaskNumber=2))
    start_all(store, job.id)
    assert not exit_task(store, job.id, "worker", 0, 0).attempt_ended
    report = exit_task(store, job.id, "worker", 1, 0)
    assert report.attempt_ended
    assert job_of(store, job.id).state == JobState.SUCCEEDED
    # The platform then stops the tasks still running: they end STOPPED.
    late = exit_task(store, job.id, "ps_server", 0, 137)
    assert (late.task_state, late.job_state, late.attempt_ended) == (
        TaskState.STOPPED, JobState.SUCCEEDED, False)
    assert task_states(store, job.id, 0)["ps_server:0"] == TaskState.STOPPED
    assert_state_index_consistent(redis_client, job_of(store, job.id))


def test_one_failure_fails_a_job_without_retries(store: Store) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)]))
    start_all(store, job.id)
    report = exit_task(store, job.id, "main", 1, 42, diagnostics="boom")
    assert (report.job_state, report.attempt_ended, report.retried) == (
        JobState.FAILED, True, False)
    done = job_of(store, job.id)
    assert done.exit_code == 42
    assert "main[1]" in done.exit_diagnostics
    assert task_states(store, job.id, 0) == {"main:0": TaskState.RUNNING,
                                             "main:1": TaskState.FAILED}


# ---------------------------------------------------------------- placement


def test_commit_placement_refuses_a_stale_version(store: Store, redis_client: redis.Redis) -> None:
    job = submit_job(store, "alice", config())
    snapshot = job_of(store, job.id)
    set_waiting(store, job.id, "no node has 1 free GPU")  # not a state change
    assert job_of(store, job.id).version == snapshot.version
    stale = snapshot.version - 1
    assert not commit_placement(store, job.id, version=stale, attempt=0,
                                placements=placements(store, job.id),
                                launch_deadline_ms=DEADLINE_MS)
    assert job_of(store, job.id) == replace(snapshot, waiting_reason="no node has 1 free GPU")
    assert task_states(store, job.id, 0) == {"main:0": TaskState.WAITING}
    assert store.get_allocations(redis_client, "n1") == {}
    assert store.queued_job_ids() == [job.id]


def test_commit_placement_twice_with_one_snapshot_binds_once(
    store: Store, redis_client: redis.Redis,
) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)]))
    plan = placements(store, job.id)
    assert commit_placement(store, job.id, version=job.version, attempt=0, placements=plan,
                            launch_deadline_ms=DEADLINE_MS)
    again = plan[::-1]
    assert not commit_placement(store, job.id, version=job.version, attempt=0,
                                placements=again, launch_deadline_ms=DEADLINE_MS)
    assert len(store.get_allocations(redis_client, "n1")) == 2
    assert event_kinds(store, job.id).count("placed") == 1


def test_commit_placement_refuses_another_attempt(store: Store) -> None:
    job = submit_job(store, "alice", config())
    assert not commit_placement(store, job.id, version=job.version, attempt=1,
                                placements=placements(store, job.id),
                                launch_deadline_ms=DEADLINE_MS)
    assert task_states(store, job.id, 0) == {"main:0": TaskState.WAITING}


def test_commit_placement_refuses_a_stopped_job(store: Store) -> None:
    job = submit_job(store, "alice", config())
    plan = placements(store, job.id)
    stopped = request_stop(store, job.id)
    assert not commit_placement(store, job.id, version=stopped.version, attempt=0,
                                placements=plan, launch_deadline_ms=DEADLINE_MS)


def test_commit_placement_of_an_unknown_job_is_refused(store: Store) -> None:
    assert not commit_placement(store, "nobody~x", version=1, attempt=0, placements=[],
                                launch_deadline_ms=DEADLINE_MS)


def test_set_waiting_is_shown(store: Store) -> None:
    job = submit_job(store, "alice", config())
    set_waiting(store, job.id, "no node has 1 free GPU")
    assert job_of(store, job.id).waiting_reason == "no node has 1 free GPU"
    set_waiting(store, "nobody~x", "whatever")  # a job that is gone: no record made
    assert store.get_job("nobody~x") is None


def test_a_waiting_reason_for_an_older_version_is_not_written(store: Store) -> None:
    job = submit_job(store, "alice", config())
    place(store, job.id)  # the job moved on: placed, its reason cleared
    assert not set_waiting(store, job.id, "no node has 1 free GPU",
                                  version=job.version)
    assert job_of(store, job.id).waiting_reason == ""


def test_a_waiting_reason_racing_a_delete_leaves_no_record(
        store: Store, redis_server: str, redis_client: redis.Redis) -> None:
    """Threat (a record brought back): the scheduler worked out why a job waits;
    before it wrote the reason, the user stopped and deleted the job. A plain
    write would bring back a record holding only a reason (every later read of
    it a 500); the write is conditional on the job, so nothing comes back."""
    job = submit_job(store, "alice", config())
    other = Store.from_url(redis_server)

    def stop_and_delete() -> None:
        assert request_stop(other, job.id).state == JobState.STOPPED
        assert delete_job(other, job.id)

    hook = Hook("before-write", keys.job(job.id), stop_and_delete)
    racing = Store(with_hooks(redis_client, hook))

    assert not set_waiting(racing, job.id, "no node has 1 free GPU",
                                  version=job.version)
    assert hook.fired
    other.r.close()
    assert not redis_client.exists(keys.job(job.id))
    assert store.list_jobs() == ([], 0)


def test_commit_placement_refuses_a_gpu_another_job_holds(store: Store) -> None:
    first = submit_job(store, "alice", config("first"))
    second = submit_job(store, "alice", config("second"))
    taken = placements(store, first.id)  # GPU 0 of n1
    place(store, first.id)
    clash = [TaskPlacement(role="main", index=0, node="n1", ip="10.0.0.1", gpus=(0,), cpus=1,
                           memory_mb=512, ports={"default": [30000]})]
    assert taken[0].gpus == (0,)
    assert not commit_placement(store, second.id, version=second.version, attempt=0,
                                placements=clash, launch_deadline_ms=DEADLINE_MS)
    port_clash = [TaskPlacement(role="main", index=0, node="n1", ip="10.0.0.1", gpus=(5,),
                                cpus=1, memory_mb=512, ports=taken[0].ports)]
    assert not commit_placement(store, second.id, version=second.version, attempt=0,
                                placements=port_clash, launch_deadline_ms=DEADLINE_MS)
    partial_gang = placements(store, second.id)[:0]
    assert not commit_placement(store, second.id, version=second.version, attempt=0,
                                placements=partial_gang, launch_deadline_ms=DEADLINE_MS)


# -------------------------------------------------------------------- retry


def test_retries_until_retry_count_then_fails(store: Store, redis_client: redis.Redis) -> None:
    job = submit_job(store, "alice", config(retryCount=2))
    reports = []
    for attempt in range(3):
        assert job_of(store, job.id).attempt == attempt
        start_all(store, job.id)
        reports.append(exit_task(store, job.id, "main", 0, 3))
        if attempt < 2:
            requeued = job_of(store, job.id)
            assert requeued.state == JobState.WAITING
            assert store.queued_job_ids() == [job.id]
            assert requeued.queue_seq == job.queue_seq  # keeps its place in the queue
            assert task_states(store, job.id, attempt + 1) == {"main:0": TaskState.WAITING}

    assert [(r.attempt_ended, r.retried) for r in reports] == [
        (True, True), (True, True), (True, False)]
    done = job_of(store, job.id)
    assert (done.state, done.exit_code, done.retries, done.attempt) == (
        JobState.FAILED, 3, 2, 2)
    assert done.platform_retries == 0
    attempts = store.get_attempts(job.id)
    assert [(a.index, a.state, a.exit_code) for a in attempts] == [
        (0, "FAILED", 3), (1, "FAILED", 3), (2, "FAILED", 3)]
    assert all(a.completed_ms is not None for a in attempts)
    assert store.queued_job_ids() == []
    assert_state_index_consistent(redis_client, done)


def test_a_retry_then_success(store: Store) -> None:
    job = submit_job(store, "alice", config(retryCount=1))
    start_all(store, job.id)
    exit_task(store, job.id, "main", 0, 1)
    start_all(store, job.id)
    report = exit_task(store, job.id, "main", 0, 0)
    assert report.job_state == JobState.SUCCEEDED
    done = job_of(store, job.id)
    assert (done.attempt, done.retries, done.exit_code) == (1, 1, 0)


def test_platform_failure_retries_without_counting(store: Store) -> None:
    job = submit_job(store, "alice", config(retryCount=0))
    start_all(store, job.id)
    report = exit_task(store, job.id, "main", 0, 137, diagnostics="node lost",
                       platform_failure=True)
    assert (report.retried, report.job_state) == (True, JobState.WAITING)
    retried = job_of(store, job.id)
    assert (retried.attempt, retried.retries, retried.platform_retries) == (1, 0, 1)
    assert store.get_attempts(job.id)[0].platform_failure
    start_all(store, job.id)
    assert exit_task(store, job.id, "main", 0, 0).job_state == JobState.SUCCEEDED


def test_non_retryable_failure_fails_at_once(store: Store) -> None:
    job = submit_job(store, "alice", config(retryCount=3))
    place(store, job.id)
    report = exit_task(store, job.id, "main", 0, 125,
                       diagnostics=f"{NON_RETRYABLE_PREFIX} image busybox cannot be pulled")
    assert (report.retried, report.job_state) == (False, JobState.FAILED)
    assert job_of(store, job.id).retries == 0


def test_old_attempt_reports_only_stop_its_own_tasks(store: Store) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)], retryCount=1))
    start_all(store, job.id)
    exit_task(store, job.id, "main", 0, 1)  # attempt 0 fails, attempt 1 queued
    before = job_of(store, job.id)
    late = record_task_exit(store, job.id, 0, "main", 1, exit_code=0)
    assert late is not None
    assert (late.task_state, late.attempt_ended, late.retried) == (
        TaskState.STOPPED, False, False)
    after = job_of(store, job.id)
    assert (after.state, after.attempt, after.retries) == (
        before.state, before.attempt, before.retries)
    assert task_states(store, job.id, 1) == {"main:0": TaskState.WAITING,
                                             "main:1": TaskState.WAITING}


def test_mark_task_running_for_a_stale_attempt_is_refused(store: Store) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)], retryCount=1))
    place(store, job.id)
    assert mark_task_running(store, job.id, 0, "main", 0, "c0")
    exit_task(store, job.id, "main", 0, 1)  # attempt 0 fails, attempt 1 queued
    before = job_of(store, job.id)
    # main:1 of attempt 0 was LAUNCHING; its container starts only now.
    assert not mark_task_running(store, job.id, 0, "main", 1, "late")
    assert job_of(store, job.id) == before
    assert task_states(store, job.id, 0)["main:1"] == TaskState.LAUNCHING


def test_a_container_of_an_earlier_submission_of_the_name_settles_nothing(
        store: Store) -> None:
    """The attack: job `reuse` runs on a node that is then cut off; it ends,
    is deleted and submitted again under the same name. The old submission's
    container, still running, reports a start and an exit: neither touches
    the new submission's task."""
    old = submit_job(store, "alice", config("reuse"))
    start_all(store, old.id)
    assert request_stop(store, old.id).state == JobState.STOPPING
    exit_task(store, old.id, "main", 0, 143)
    assert job_of(store, old.id).state == JobState.STOPPED
    assert delete_job(store, old.id)
    new = submit_job(store, "alice", config("reuse"))
    assert (new.id, new.attempt) == (old.id, 0) and new.submission != old.submission
    place(store, new.id)

    assert not mark_task_running(store, new.id, 0, "main", 0, "stale",
                                 submission=old.submission)
    assert record_task_exit(store, new.id, 0, "main", 0, exit_code=1,
                            submission=old.submission) is None
    assert task_states(store, new.id, 0) == {"main:0": TaskState.LAUNCHING}
    assert mark_task_running(store, new.id, 0, "main", 0, "fresh", submission=new.submission)
    assert task_states(store, new.id, 0) == {"main:0": TaskState.RUNNING}


@pytest.mark.parametrize("situation", ["unplaced task", "unknown task", "unknown job"])
def test_mark_task_running_without_a_live_launching_task_is_refused(
    store: Store, situation: str,
) -> None:
    job = submit_job(store, "alice", config())
    job_id, task_role = (job.id, "main")
    if situation == "unknown task":
        task_role = "nope"
    if situation == "unknown job":
        job_id = "nobody~x"
    assert not mark_task_running(store, job_id, 0, task_role, 0, "c0")
    assert job_of(store, job.id) == job


def test_mark_task_running_twice_changes_nothing_the_second_time(store: Store) -> None:
    job = submit_job(store, "alice", config())
    place(store, job.id)
    assert mark_task_running(store, job.id, 0, "main", 0, "c0")
    before, events = job_of(store, job.id), event_kinds(store, job.id)
    assert mark_task_running(store, job.id, 0, "main", 0, "c0")
    assert job_of(store, job.id) == before
    assert event_kinds(store, job.id) == events


# ---------------------------------------------------------------- stopping


def test_stop_a_waiting_job_stops_it_at_once(store: Store, redis_client: redis.Redis) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)], retryCount=3))
    stopped = request_stop(store, job.id)
    assert stopped.state == JobState.STOPPED
    assert stopped.execution_type == "STOP"
    assert stopped.completed_ms is not None
    assert job_of(store, job.id) == stopped
    assert set(task_states(store, job.id, 0).values()) == {TaskState.STOPPED}
    assert store.queued_job_ids() == []
    [attempt] = store.get_attempts(job.id)
    assert attempt.state == "STOPPED"
    assert event_kinds(store, job.id)[-1] == "stop-requested"
    assert_state_index_consistent(redis_client, stopped)


def test_stop_a_running_job_waits_for_its_tasks(store: Store, redis_client: redis.Redis) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)], retryCount=3))
    start_all(store, job.id)
    stopping = request_stop(store, job.id)
    assert stopping.state == JobState.STOPPING
    assert job_of(store, job.id).state == JobState.STOPPING
    assert_state_index_consistent(redis_client, stopping)

    first = exit_task(store, job.id, "main", 0, 137)
    assert (first.task_state, first.job_state, first.attempt_ended) == (
        TaskState.STOPPED, JobState.STOPPING, False)
    last = exit_task(store, job.id, "main", 1, 0)  # even a clean exit is a stop now
    assert (last.task_state, last.job_state, last.attempt_ended, last.retried) == (
        TaskState.STOPPED, JobState.STOPPED, True, False)

    done = job_of(store, job.id)
    assert (done.state, done.attempt, done.retries) == (JobState.STOPPED, 0, 0)
    assert done.completed_ms is not None
    assert [a.state for a in store.get_attempts(job.id)] == ["STOPPED"]
    assert_state_index_consistent(redis_client, done)


def test_stop_a_placed_job_stops_launching_tasks_through_their_exits(store: Store) -> None:
    job = submit_job(store, "alice", config())
    place(store, job.id)
    assert request_stop(store, job.id).state == JobState.STOPPING
    assert not mark_task_running(store, job.id, 0, "main", 0, "c0")  # too late to start
    assert exit_task(store, job.id, "main", 0, 137).job_state == JobState.STOPPED


@pytest.mark.parametrize("final", [JobState.SUCCEEDED, JobState.STOPPED])
def test_stop_a_finished_job_changes_nothing(store: Store, final: JobState) -> None:
    job = submit_job(store, "alice", config())
    if final == JobState.SUCCEEDED:
        start_all(store, job.id)
        exit_task(store, job.id, "main", 0, 0)
    else:
        request_stop(store, job.id)
    before, events = job_of(store, job.id), event_kinds(store, job.id)
    assert request_stop(store, job.id) == before
    assert job_of(store, job.id) == before
    assert event_kinds(store, job.id) == events


# ------------------------------------------------------------- idempotence


def test_repeated_exit_report_returns_none_and_changes_nothing(
    store: Store, redis_client: redis.Redis,
) -> None:
    job = submit_job(store, "alice", config(roles=[role("main", 2)]))
    start_all(store, job.id)
    assert record_task_exit(store, job.id, 0, "main", 0, exit_code=0) is not None
    before = (job_of(store, job.id), store.get_tasks(job.id, 0), store.get_attempts(job.id),
              len(store.get_events(job.id)))
    for code in (0, 1):
        assert record_task_exit(store, job.id, 0, "main", 0, exit_code=code) is None
    after = (job_of(store, job.id), store.get_tasks(job.id, 0), store.get_attempts(job.id),
             len(store.get_events(job.id)))
    assert after == before


def test_a_start_and_an_exit_read_what_they_decide_on_in_one_round_trip(
        store: Store, redis_server: str) -> None:
    """Under WATCH a pipeline's reads go one by one; the job, its tasks, its
    attempt's record and its config come in one script call instead. The
    first task running: WATCH, that read, MULTI/EXEC. The last exit: the
    same, and the allocation its usage is counted from. Both wrote what they
    decided (the attempt's record read with the rest)."""
    job = submit_job(store, "alice", config())
    place(store, job.id)
    client, counter = counting_client(redis_server)
    counted = Store(client)
    client.ping()  # the connection's own setup (AUTH, its name) is not counted
    counter.sent = 0
    assert mark_task_running(counted, job.id, 0, "main", 0, "c-main-0")
    assert counter.sent == 3
    started = store.get_attempts(job.id)[0].started_ms
    assert started is not None and started == job_of(store, job.id).started_ms

    counter.sent = 0
    report = record_task_exit(counted, job.id, 0, "main", 0, exit_code=0)
    assert report is not None and report.job_state == JobState.SUCCEEDED
    assert counter.sent == 4
    attempt = store.get_attempts(job.id)[0]
    assert (attempt.state, attempt.exit_code, attempt.started_ms) == (
        JobState.SUCCEEDED, 0, started)
    client.close()


@pytest.mark.parametrize("ring", [True, False])
def test_an_exit_rings_for_its_pass_in_its_own_transaction(
        store: Store, redis_server: str, redis_client: redis.Redis, ring: bool) -> None:
    """The ring for the pass a freed allocation asks for costs no round trip
    of its own, nor does the allocation on the reporter's node (read with the
    records): the exit's count is the same with the ring or without, and the
    doorbell holds it only when asked."""
    job = submit_job(store, "alice", config())
    place(store, job.id)
    assert mark_task_running(store, job.id, 0, "main", 0, "c-main-0")
    redis_client.delete(passwake.KEY)
    client, counter = counting_client(redis_server)
    client.ping()
    counter.sent = 0
    report = record_task_exit(Store(client), job.id, 0, "main", 0, exit_code=0, ring=ring,
                              node="n1")
    assert report is not None and report.job_state == JobState.SUCCEEDED
    assert counter.sent == 3  # WATCH, the read (the allocation on n1 with it), MULTI/EXEC
    assert redis_client.lrange(passwake.KEY, 0, -1) == ([passwake.CAPACITY] if ring else [])
    client.close()


def test_an_exit_that_leaves_tasks_to_stop_does_not_ring(
        store: Store, redis_client: redis.Redis) -> None:
    """One failed task ends the attempt while another runs: the scheduler is
    told to stop it (the caller's message), and the pass waits for that."""
    job = submit_job(store, "alice", config(roles=[role("main", 2)]))
    place(store, job.id)
    for index in range(2):
        assert mark_task_running(store, job.id, 0, "main", index, f"c-main-{index}")
    redis_client.delete(passwake.KEY)
    report = record_task_exit(store, job.id, 0, "main", 0, exit_code=3, ring=True)
    assert report is not None and report.attempt_ended and report.live_left
    assert redis_client.llen(passwake.KEY) == 0


def test_exit_of_an_unknown_task_or_job_is_none(store: Store) -> None:
    job = submit_job(store, "alice", config())
    assert record_task_exit(store, job.id, 0, "main", 5, exit_code=0) is None
    assert record_task_exit(store, job.id, 7, "main", 0, exit_code=0) is None
    assert record_task_exit(store, "nobody~x", 0, "main", 0, exit_code=0) is None
    assert job_of(store, job.id) == job


# ------------------------------------------------------------- concurrency


def exit_in(store: Store, job_id: str, index: int, code: int) -> ExitReport | None:
    return record_task_exit(store, job_id, 0, "main", index, exit_code=code)


def commit_in(store: Store, job: Job, plan: list[TaskPlacement]) -> bool:
    return commit_placement(store, job.id, version=job.version, attempt=job.attempt,
                            placements=plan, launch_deadline_ms=DEADLINE_MS)


@pytest.fixture
def fresh_jobs(store: Store) -> Iterator[Callable[..., Job]]:
    counter = iter(range(10_000))

    def make(**extra: Any) -> Job:
        return submit_job(store, "alice", config(f"race-{next(counter)}", **extra))

    yield make


def test_two_tasks_exiting_at_once_end_the_attempt_exactly_once(
    store: Store, redis_server: str, redis_client: redis.Redis,
    fresh_jobs: Callable[..., Job],
) -> None:
    for _ in range(ROUNDS):
        job = fresh_jobs(roles=[role("main", 2)])
        start_all(store, job.id)
        reports = race(
            redis_server,
            partial(exit_in, job_id=job.id, index=0, code=0),
            partial(exit_in, job_id=job.id, index=1, code=0),
        )
        assert all(r is not None for r in reports)
        assert sum(r.attempt_ended for r in reports if r is not None) == 1
        done = job_of(store, job.id)
        assert done.state == JobState.SUCCEEDED
        assert task_states(store, job.id, 0) == {"main:0": TaskState.SUCCEEDED,
                                                 "main:1": TaskState.SUCCEEDED}
        assert event_kinds(store, job.id).count("attempt-end") == 1
        assert_state_index_consistent(redis_client, done)


def test_two_failures_at_once_retry_exactly_once(
    store: Store, redis_server: str, fresh_jobs: Callable[..., Job],
) -> None:
    for _ in range(ROUNDS):
        job = fresh_jobs(roles=[role("main", 2)], retryCount=5)
        start_all(store, job.id)
        reports = race(
            redis_server,
            partial(exit_in, job_id=job.id, index=0, code=1),
            partial(exit_in, job_id=job.id, index=1, code=2),
        )
        assert sum(r.retried for r in reports if r is not None) == 1
        after = job_of(store, job.id)
        assert (after.state, after.attempt, after.retries) == (JobState.WAITING, 1, 1)
        assert len(store.get_attempts(job.id)) == 2


def test_concurrent_commits_of_one_snapshot_bind_exactly_once(
    store: Store, redis_server: str, redis_client: redis.Redis,
    fresh_jobs: Callable[..., Job],
) -> None:
    for round_no in range(ROUNDS):
        job = fresh_jobs(roles=[role("main", 2)])
        # Two schedulers computed placements from the same snapshot, on different nodes.
        plan_a = placements(store, job.id, node=f"a{round_no}")
        plan_b = placements(store, job.id, node=f"b{round_no}")
        results = race(
            redis_server,
            partial(commit_in, job=job, plan=plan_a),
            partial(commit_in, job=job, plan=plan_b),
        )
        assert sorted(results) == [False, True]
        winner = f"a{round_no}" if results[0] else f"b{round_no}"
        loser = f"b{round_no}" if results[0] else f"a{round_no}"
        assert len(store.get_allocations(redis_client, winner)) == 2
        assert store.get_allocations(redis_client, loser) == {}
        assert {t.node for t in store.get_tasks(job.id, 0)} == {winner}
        assert job_of(store, job.id).version == job.version + 1


def test_stop_racing_the_last_exit_ends_in_one_consistent_final_state(
    store: Store, redis_server: str, redis_client: redis.Redis,
    fresh_jobs: Callable[..., Job],
) -> None:
    for _ in range(ROUNDS):
        job = fresh_jobs()
        start_all(store, job.id)
        stopped, report = race(
            redis_server,
            partial(request_stop, job_id=job.id),
            partial(exit_in, job_id=job.id, index=0, code=0),
        )
        assert report is not None and report.attempt_ended
        done = job_of(store, job.id)
        assert done.state in (JobState.SUCCEEDED, JobState.STOPPED)
        # The stop either came first (and saw the job STOPPING) or found it finished.
        assert stopped.state == (JobState.SUCCEEDED if done.state == JobState.SUCCEEDED
                                 else JobState.STOPPING)
        [task] = store.get_tasks(job.id, 0)
        assert task.state == (TaskState.SUCCEEDED if done.state == JobState.SUCCEEDED
                              else TaskState.STOPPED)
        assert_state_index_consistent(redis_client, done)


def test_stop_racing_a_commit_never_leaves_a_stopped_job_holding_nodes(
    store: Store, redis_server: str, redis_client: redis.Redis,
    fresh_jobs: Callable[..., Job],
) -> None:
    for round_no in range(ROUNDS):
        job = fresh_jobs()
        node = f"n{round_no}"
        committed, _ = race(
            redis_server,
            partial(commit_in, job=job, plan=placements(store, job.id, node=node)),
            partial(request_stop, job_id=job.id),
        )
        done = job_of(store, job.id)
        [task] = store.get_tasks(job.id, 0)
        if committed:  # placed first: the stop must wait for the launching task
            assert (done.state, task.state) == (JobState.STOPPING, TaskState.LAUNCHING)
            assert len(store.get_allocations(redis_client, node)) == 1
        else:  # stopped first: nothing was bound
            assert (done.state, task.state) == (JobState.STOPPED, TaskState.STOPPED)
            assert store.get_allocations(redis_client, node) == {}
        assert store.queued_job_ids() == []
        assert_state_index_consistent(redis_client, done)


def test_start_and_exit_reported_at_once_settle_the_task_once(
    store: Store, redis_server: str, fresh_jobs: Callable[..., Job],
) -> None:
    for _ in range(ROUNDS):
        job = fresh_jobs()
        place(store, job.id)
        started, report = race(
            redis_server,
            partial(mark_task_running, job_id=job.id, attempt=0, role="main", index=0,
                    container_id="c0"),
            partial(exit_in, job_id=job.id, index=0, code=0),
        )
        assert report is not None and report.attempt_ended
        assert job_of(store, job.id).state == JobState.SUCCEEDED
        [task] = store.get_tasks(job.id, 0)
        assert task.state == TaskState.SUCCEEDED
        # A start seen after the exit is refused, so its launcher stops nothing live.
        assert started == (task.container_id == "c0")


# ------------------------------------------------------------ preemption


def preempt(store: Store, job_id: str, by: str = "bob~owner") -> Job | None:
    return mark_preempted(store, job_id, attempt=job_of(store, job_id).attempt, by=by,
                          deadline_ms=DEADLINE_MS)


def test_a_preempted_job_goes_back_to_its_place_uncharged(
        store: Store, redis_client: redis.Redis) -> None:
    earlier = submit_job(store, "alice", config("earlier"))
    job = submit_job(store, "alice", config("victim", roles=[role("main", 2)], retryCount=0))
    later = submit_job(store, "alice", config("later"))
    start_all(store, job.id)
    assert preempt(store, job.id) is not None

    first = exit_task(store, job.id, "main", 0, 143)  # SIGTERM: not the job's failure
    assert (first.attempt_ended, first.job_state) == (False, JobState.RUNNING)
    second = exit_task(store, job.id, "main", 1, 137)
    assert (second.attempt_ended, second.retried) == (True, True)

    after = job_of(store, job.id)
    assert (after.state, after.attempt, after.retries, after.platform_retries,
            after.preemptions) == (JobState.WAITING, 1, 0, 0, 1)
    assert (after.preempted_by, after.mode, after.queue_seq) == ("", "", job.queue_seq)
    closed = store.get_attempts(job.id)[0]
    assert (closed.reason, closed.preempted_by) == ("Preempted by bob~owner", "bob~owner")
    assert task_states(store, job.id, 0) == {"main:0": TaskState.STOPPED,
                                             "main:1": TaskState.STOPPED}
    # back between the jobs submitted before and after it
    assert redis_client.zrange(keys.vc_queue("default"), 0, -1) == [earlier.id, job.id,
                                                                    later.id]
    assert "preempted" in event_kinds(store, job.id)
    assert_state_index_consistent(redis_client, after)


def test_a_job_that_succeeds_in_its_grace_period_succeeds(store: Store) -> None:
    job = submit_job(store, "alice", config("quick"))
    start_all(store, job.id)
    assert preempt(store, job.id) is not None
    exit_task(store, job.id, "main", 0, 0)
    assert job_of(store, job.id).state == JobState.SUCCEEDED


def test_a_job_is_preempted_once_per_attempt(store: Store) -> None:
    job = submit_job(store, "alice", config("once"))
    start_all(store, job.id)
    assert preempt(store, job.id, by="bob~first") is not None
    assert preempt(store, job.id, by="bob~second") is None
    assert job_of(store, job.id).preempted_by == "bob~first"


def test_a_waiting_or_finished_job_is_never_marked_preempted(store: Store) -> None:
    queued = submit_job(store, "alice", config("queued"))
    assert preempt(store, queued.id) is None
    done = submit_job(store, "alice", config("done"))
    start_all(store, done.id)
    exit_task(store, done.id, "main", 0, 0)
    assert preempt(store, done.id) is None


def test_a_stop_wins_over_a_preemption(store: Store) -> None:
    job = submit_job(store, "alice", config("stopped", retryCount=3))
    start_all(store, job.id)
    assert preempt(store, job.id) is not None
    request_stop(store, job.id)
    exit_task(store, job.id, "main", 0, 143)
    after = job_of(store, job.id)
    assert (after.state, after.preemptions) == (JobState.STOPPED, 0)


def test_tasks_exiting_at_once_under_preemption_requeue_exactly_once(
    store: Store, redis_server: str, redis_client: redis.Redis,
    fresh_jobs: Callable[..., Job],
) -> None:
    for _ in range(ROUNDS):
        job = fresh_jobs(roles=[role("main", 2)])
        start_all(store, job.id)
        assert preempt(store, job.id) is not None
        reports = race(
            redis_server,
            partial(exit_in, job_id=job.id, index=0, code=143),
            partial(exit_in, job_id=job.id, index=1, code=143),
        )
        assert sum(r.retried for r in reports if r is not None) == 1
        after = job_of(store, job.id)
        assert (after.state, after.attempt, after.preemptions, after.retries) == \
            (JobState.WAITING, 1, 1, 0)
        assert redis_client.zscore(keys.QUEUE, job.id) == after.queue_seq
        assert event_kinds(store, job.id).count("attempt-end") == 1


def test_set_modes_changes_only_placed_jobs_still_on_that_attempt(store: Store) -> None:
    waiting = submit_job(store, "alice", config("mode-waiting"))
    placed = [submit_job(store, "alice", config(f"mode-placed-{i}")) for i in range(4)]
    for job in placed:
        place(store, job.id, mode="guaranteed")
    stopped = placed[3]
    assert request_stop(store, stopped.id).state == JobState.STOPPING
    changes = [ModeChange(waiting.id, 0, "borrowed"),      # not placed: no mode
               ModeChange(placed[0].id, 0, "borrowed"),    # changes
               ModeChange(placed[1].id, 1, "borrowed"),    # another attempt
               ModeChange(placed[2].id, 0, "guaranteed"),  # already so
               ModeChange(stopped.id, 0, "borrowed")]      # no longer live
    assert set_modes(store, changes) == [placed[0].id]
    assert [job_of(store, j.id).mode for j in [waiting, *placed]] == \
        ["", "borrowed", "guaranteed", "guaranteed", "guaranteed"]
    mode_events = [e for e in store.get_events(placed[0].id) if e["kind"] == "mode"]
    assert [(e["attempt"], e["mode"]) for e in mode_events] == [(0, "borrowed")]
    assert set_modes(store, changes) == []  # again: nothing left to change
    assert not [e for e in store.get_events(placed[2].id) if e["kind"] == "mode"]


def test_set_modes_batches_a_mass_demotion(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "SET_MODES_BATCH", 2)  # five jobs: three script calls
    jobs = [submit_job(store, "alice", config(f"mass-{i}")) for i in range(5)]
    for job in jobs:
        place(store, job.id, mode="guaranteed")
    assert set_modes(store, [ModeChange(j.id, 0, "borrowed") for j in jobs]) == \
        [j.id for j in jobs]
    assert {job_of(store, j.id).mode for j in jobs} == {"borrowed"}


