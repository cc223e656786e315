"""The monitor drives tasks from what its node's containers do (real Redis, real Docker).

Each test places a job on a node of its own (so no other test's containers
are seen), starts the task's container itself as the launcher would, and
lets a Monitor observe it: through Docker events (a watcher thread), or
through reconcile alone (a monitor that was down).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import pytest
from docker.models.containers import Container

from services.monitor.fence import FencedContainer, FenceJournal
from services.monitor.logs import close_stream
from services.monitor.observations import ContainerEvent, EventKind
from services.monitor.service import Monitor, ReconcileSummary
from shared.domain.models import Job, attempt_task_key
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.messaging import ATTEMPT_ENDED
from shared.node.containers import TaskRef
from shared.state.taskexits import record_task_exit
from tests.support.monitor_rig import GATE, Rig, release
from tests.support.monitor_rig import rig as rig  # the fixture
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.redis]

T = TypeVar("T")


def _final_job(rig: Rig, job_id: str) -> Job:
    wait_for(lambda: rig.job(job_id).state.is_final, f"job {job_id} to end")
    return rig.job(job_id)


# ---------------------------------------------------------------- via events


def test_a_task_that_exits_0_succeeds_with_its_log(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place()
    container = rig.run(job_id, "echo one; echo two; echo three")

    job = _final_job(rig, job_id)

    assert job.state == JobState.SUCCEEDED
    task = rig.task(job_id)
    assert (task.state, task.exit_code) == (TaskState.SUCCEEDED, 0)
    assert rig.log(job_id) == ["one", "two", "three"]  # shipped before the task settled
    wait_for(lambda: rig.gone(container), "the container to be removed")
    # The exit's own transaction freed the task's allocation: the scheduler
    # is asked for a pass, nothing more.
    assert rig.store.get_allocations(rig.store.r, rig.node) == {}
    assert rig.rang()
    assert rig.messages() == []


def test_a_task_that_exits_3_fails_with_exit_code_3(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place()
    container = rig.run(job_id, "echo failing >&2; exit 3")  # stderr is shipped too

    job = _final_job(rig, job_id)

    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    task = rig.task(job_id)
    assert (task.state, task.exit_code, task.diagnostics) == (TaskState.FAILED, 3, "exit code 3")
    assert rig.log(job_id) == ["failing"]
    wait_for(lambda: rig.gone(container), "the container to be removed")


def test_a_started_container_makes_its_task_and_job_running(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place()
    container = rig.run(job_id, f"echo started; {GATE}; echo finished")

    wait_for(lambda: rig.task(job_id).state == TaskState.RUNNING, "the task to run")
    assert rig.job(job_id).state == JobState.RUNNING
    assert rig.task(job_id).container_id == container.id
    wait_for(lambda: rig.log(job_id) == ["started"], "the log to be shipped while it runs")

    release(container)

    assert _final_job(rig, job_id).state == JobState.SUCCEEDED
    assert rig.log(job_id) == ["started", "finished"]


def test_an_oom_killed_task_fails_and_says_why(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place(memory_mb=16)
    rig.run(job_id, "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived",
            mem_limit="16m", memswap_limit="16m")

    job = _final_job(rig, job_id)

    task = rig.task(job_id)
    assert (job.state, task.state, task.exit_code) == (JobState.FAILED, TaskState.FAILED, 137)
    assert task.diagnostics == "OOMKilled: exceeded memoryMB (16 MB)"


# ---------------------------------------------------------------- reconcile


def test_reconcile_settles_an_exit_that_happened_while_no_monitor_ran(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.exited(rig.run(job_id, "echo while nobody watched"))
    assert rig.task(job_id).state == TaskState.LAUNCHING

    summary = rig.monitor().reconcile()

    assert (summary.exited, summary.vanished) == (1, 0)
    assert rig.job(job_id).state == JobState.SUCCEEDED
    assert (rig.task(job_id).state, rig.task(job_id).exit_code) == (TaskState.SUCCEEDED, 0)
    assert rig.log(job_id) == ["while nobody watched"]
    assert rig.gone(container)
    assert rig.rang()
    assert rig.messages() == []


def test_reconcile_marks_a_running_container_running(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.run(job_id, GATE)
    wait_for(lambda: _status(container) == "running", "the container to run")
    monitor = rig.monitor()

    assert monitor.reconcile().running == 1
    assert rig.task(job_id).state == TaskState.RUNNING
    assert monitor.reconcile().running == 1  # again: nothing changes
    assert rig.task(job_id).state == TaskState.RUNNING
    assert rig.messages() == []
    assert not rig.rang()


def _status(container: Container) -> str:
    container.reload()
    return str(container.status)


def test_a_second_handling_of_the_same_exit_changes_nothing(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.exited(rig.run(job_id, "echo once; exit 3"))
    monitor = rig.monitor()

    first = monitor.handle_exit(container)
    assert first is not None and first.attempt_ended
    assert rig.rang()
    before = (rig.job(job_id), rig.store.get_tasks(job_id, 0), rig.store.get_attempts(job_id),
              rig.store.get_events(job_id), rig.log(job_id))

    assert monitor.handle_exit(container) is None  # removed now; its last state still says exited

    after = (rig.job(job_id), rig.store.get_tasks(job_id, 0), rig.store.get_attempts(job_id),
             rig.store.get_events(job_id), rig.log(job_id))
    assert after == before
    assert rig.log(job_id) == ["once"]
    assert rig.rang()  # asked again: the first monitor may have died before it asked
    assert rig.messages() == []


def test_an_exit_settled_by_a_monitor_that_died_before_removing_is_cleaned_up(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.exited(rig.run(job_id, "exit 0"))
    # The previous monitor settled the task, then died before it told anyone.
    assert record_task_exit(rig.store, job_id, 0, "main", 0, exit_code=0) is not None
    before = (rig.job(job_id), rig.store.get_tasks(job_id, 0))

    rig.monitor().reconcile()

    assert (rig.job(job_id), rig.store.get_tasks(job_id, 0)) == before
    assert rig.gone(container)
    # the settle freed the allocation; a pass is asked for (the first
    # monitor may have died before it asked)
    assert rig.store.get_allocations(rig.store.r, rig.node) == {}
    assert rig.rang()
    assert rig.messages() == []


def test_an_orphan_container_is_stopped(rig: Rig) -> None:
    job_id = rig.place()
    assert record_task_exit(rig.store, job_id, 0, "main", 0, exit_code=0) is not None
    assert rig.job(job_id).state == JobState.SUCCEEDED
    # A late launch of a task that already ended; it would run forever.
    container = rig.run(job_id, "trap 'exit 143' TERM; while :; do sleep 0.1; done")
    wait_for(lambda: _status(container) == "running", "the orphan to run")
    monitor = rig.monitor()

    assert monitor.handle_start(container) is False

    assert _status(container) == "exited"
    assert rig.task(job_id).state == TaskState.SUCCEEDED
    monitor.reconcile()  # its exit: nothing to settle, the container goes
    assert rig.gone(container)
    assert rig.job(job_id).state == JobState.SUCCEEDED


def test_a_container_created_for_a_settled_task_and_never_started_is_removed(
        rig: Rig) -> None:
    """A launcher killed between create and start, whose task then failed
    elsewhere (its node declared lost while it restarted): nothing will start
    the container, and it must not stay behind."""
    job_id = rig.place()
    settled = rig.create(job_id)
    assert record_task_exit(rig.store, job_id, 0, "main", 0, exit_code=-1,
                            platform_failure=True) is not None
    rig.store.release_allocation(rig.node, attempt_task_key(job_id, 0, "main", 0))
    launching_id = rig.place()
    launching = rig.create(launching_id)  # its launch is still under way

    rig.monitor().reconcile()

    assert rig.gone(settled)
    assert not rig.gone(launching)
    assert rig.task(launching_id).state == TaskState.LAUNCHING


def test_an_orphan_is_stopped_and_removed_through_events(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place()
    assert record_task_exit(rig.store, job_id, 0, "main", 0, exit_code=0) is not None
    container = rig.run(job_id, "trap 'exit 143' TERM; while :; do sleep 0.1; done")

    wait_for(lambda: rig.gone(container), "the orphan to be stopped and removed")
    assert rig.job(job_id).state == JobState.SUCCEEDED


def test_an_exit_the_nodes_fence_caused_is_a_platform_failure_even_after_a_restart(
        rig: Rig, tmp_path: Path) -> None:
    """The node lost the control plane and fenced: it journaled the container
    and stopped it (services/monitor/fence.py). Back in contact, a monitor
    (here a new one, reading the journal from disk) records that exit as the
    platform's: retried, not charged, whatever code SIGTERM left."""
    job_id = rig.place(retry_count=0)
    container = rig.run(job_id, GATE)
    wait_for(lambda: _status(container) == "running", "the container to run")
    assert rig.monitor().handle_start(container) is True
    journal = FenceJournal(str(tmp_path), rig.node)
    journal.add([FencedContainer(str(container.id), "node lost the control plane for 31 s",
                                 now_ms())])
    container.stop(timeout=1)

    monitor = Monitor(rig.settings, rig.store, rig.messenger, rig.docker, rig.node,
                      FenceJournal(str(tmp_path), rig.node))
    monitor.reconcile()

    task = rig.task(job_id)
    assert (task.state, task.platform_failure) == (TaskState.FAILED, True)
    assert task.diagnostics == "fenced: node lost the control plane for 31 s"
    job = rig.job(job_id)
    assert (job.state, job.attempt, job.retries, job.platform_retries) == \
        (JobState.WAITING, 1, 0, 1)


def test_a_running_task_whose_container_vanished_is_a_platform_failure(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.run(job_id, GATE)
    monitor = rig.monitor()
    wait_for(lambda: _status(container) == "running", "the container to run")
    assert monitor.handle_start(container) is True
    assert monitor.reconcile().vanished == 0  # its container is there: nothing to do

    container.remove(force=True)  # behind the monitor's back
    summary = monitor.reconcile()

    assert summary.vanished == 1
    task = rig.task(job_id)
    assert (task.state, task.exit_code, task.platform_failure) == (TaskState.FAILED, -1, True)
    assert task.diagnostics == f"container vanished from node {rig.node}"
    # Not the user's fault: a fresh attempt, not counted against retryCount.
    job = rig.job(job_id)
    assert (job.state, job.attempt, job.retries, job.platform_retries) == \
        (JobState.WAITING, 1, 0, 1)
    assert rig.store.get_attempts(job_id)[0].platform_failure
    assert rig.rang()
    assert rig.messages() == []
    assert monitor.reconcile().vanished == 0  # settled once


def test_tasks_of_another_node_are_left_alone(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.exited(rig.run(job_id, "exit 0"))
    other = Monitor(rig.settings, rig.store, rig.messenger, rig.docker, rig.node + "-other")
    try:
        assert other.reconcile() == ReconcileSummary(running=0, exited=0, vanished=0)
    finally:
        other.close()
    assert rig.task(job_id).state == TaskState.LAUNCHING
    assert not rig.gone(container)


def test_a_multi_task_job_succeeds_when_every_task_has(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place(tasks=3)
    for index in range(3):
        rig.run(job_id, f"echo task {index}", index=index)

    assert _final_job(rig, job_id).state == JobState.SUCCEEDED
    for index in range(3):
        assert rig.task(job_id, index).state == TaskState.SUCCEEDED
        assert rig.log(job_id, index) == [f"task {index}"]
    # each exit freed its own task's allocation, so the attempt's end has
    # nothing left to stop: a pass is asked for (the doorbell folds the
    # three rings into one), and nothing more
    wait_for(rig.rang, "a pass request")
    assert rig.messages() == []
    assert rig.store.get_allocations(rig.store.r, rig.node) == {}


def test_an_exit_that_ends_the_attempt_under_running_tasks_asks_for_their_stop(rig: Rig) -> None:
    """The first task's failure ends the attempt (one failed task fails it)
    while the second still runs: the scheduler is told the attempt ended,
    to stop the second; the first's allocation is freed already."""
    job_id = rig.place(tasks=2)
    failed = rig.exited(rig.run(job_id, "exit 3", index=0))
    rig.run(job_id, "sleep 300", index=1)

    report = rig.monitor().handle_exit(failed)

    assert report is not None and report.attempt_ended and report.live_left
    assert rig.messages() == [(ATTEMPT_ENDED, [job_id, 0])]
    assert not rig.rang()
    assert set(rig.store.get_allocations(rig.store.r, rig.node)) == {f"{job_id}:0:main:1"}


def test_the_watcher_carries_on_after_the_event_stream_breaks(rig: Rig) -> None:
    monitor = rig.monitor()
    rig.watch(monitor)
    # White box: drop the event stream, as an engine restart would.
    close_stream(wait_for(lambda: monitor._events_stream, "the watcher to follow events"))
    job_id = rig.place()
    container = rig.run(job_id, "echo after the break")

    assert _final_job(rig, job_id).state == JobState.SUCCEEDED
    assert rig.log(job_id) == ["after the break"]
    wait_for(lambda: rig.gone(container), "the container to be removed")


def test_the_start_of_an_earlier_submissions_container_does_not_run_the_task(rig: Rig) -> None:
    """A job deleted and submitted again under its name while a launch of
    the old submission was on its way: that container's start event names
    the same task, but not the job's submission, so it must not make the new
    submission's task RUNNING (nor give it the old container, which an exec
    would then enter)."""
    job_id = rig.place()
    ref = TaskRef(job_id, 0, "main", 0, submission="an-earlier-submission")
    event = ContainerEvent(EventKind.START, "0" * 64, ref, None, int(now_ms() / 1000))

    assert rig.monitor()._on_start(event) is False
    task = rig.task(job_id)
    assert task.state == TaskState.LAUNCHING and task.container_id is None

    current = TaskRef(job_id, 0, "main", 0, submission=rig.job(job_id).submission)
    assert rig.monitor()._on_start(ContainerEvent(EventKind.START, "1" * 64, current, None,
                                                  int(now_ms() / 1000))) is True
    assert rig.task(job_id).container_id == "1" * 64
