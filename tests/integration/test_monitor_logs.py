"""Container output reaches the task's Redis stream: whole, in order, and once.

Real Redis and Docker. The restart cases stop one monitor part-way through a
container's output and let a new one carry on, as after a crash or upgrade.
Every case runs twice: the monitor reading the engine's json-file logs
itself (services/monitor/enginefiles.py), and following them through the
engine (PAI_LOG_ENGINE_FILES=off).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import docker
import pytest

from services.monitor import logs
from services.monitor.enginefiles import AUTO, OFF, EngineLogFiles
from services.monitor.loglines import MAX_LINE_BYTES
from services.monitor.logs import LogShipping, close_stream
from shared.domain.states import JobState
from shared.node.containers import TaskRef
from shared.state.store import Store
from tests.support.monitor_rig import GATE, Rig, release, rig
from tests.support.polling import wait_for
from tests.support.threads import wakeups

pytestmark = [pytest.mark.docker, pytest.mark.redis]
__all__ = ["rig"]  # the fixture, used by name

DRAIN_SECONDS = 30.0


@pytest.fixture(autouse=True, params=["engine files", "engine follow"])
def files(request: pytest.FixtureRequest, rig: Rig,
          docker_client: docker.DockerClient) -> EngineLogFiles | None:
    """The monitors of a case read the engine's log files, or follow through
    the engine; what a case's own LogShipping gets to the same end."""
    setting = AUTO if request.param == "engine files" else OFF
    rig.settings = dataclasses.replace(rig.settings, log_engine_files=setting)
    found = EngineLogFiles.discover(docker_client, setting)
    assert (found is not None) == (setting == AUTO), "the test engine's log files are readable"
    return found


def _numbers(first: int, last: int) -> list[str]:
    return [str(n) for n in range(first, last + 1)]


def test_a_restarted_monitor_carries_on_a_running_container_without_repeats(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 10")
    before = rig.monitor()
    wait_for(lambda: container.reload() or container.status == "running", "the container to run")
    assert before.handle_start(container)
    wait_for(lambda: rig.log(job_id) == _numbers(1, 5), "the first lines to be shipped")
    before.close()  # the monitor goes away; the container runs on

    after = rig.monitor()
    assert after.handle_start(container)  # the task is RUNNING already: resume its log
    release(container)
    wait_for(lambda: rig.log(job_id) == _numbers(1, 10), "the rest to be shipped")
    after.handle_exit(rig.exited(container))

    assert rig.log(job_id) == _numbers(1, 10)
    assert rig.job(job_id).state == JobState.SUCCEEDED


def test_a_monitor_that_comes_back_after_the_exit_ships_only_the_rest(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 10")
    before = rig.monitor()
    wait_for(lambda: container.reload() or container.status == "running", "the container to run")
    before.handle_start(container)
    wait_for(lambda: rig.log(job_id) == _numbers(1, 5), "the first lines to be shipped")
    before.close()

    release(container)
    rig.exited(container)
    rig.monitor().reconcile()

    assert rig.log(job_id) == _numbers(1, 10)
    assert rig.job(job_id).state == JobState.SUCCEEDED
    assert rig.gone(container)


def test_draining_the_same_container_twice_ships_it_once(
        rig: Rig, files: EngineLogFiles | None) -> None:
    job_id = rig.place()
    container = rig.exited(rig.run(job_id, "seq 1 50"))
    ref = TaskRef(job_id, 0, "main", 0)

    for _ in range(2):  # two monitors in turn, each with its own shippers
        shipping = LogShipping(rig.store, max_lines=1000, files=files)
        try:
            assert shipping.drain(container, ref, DRAIN_SECONDS)
        finally:
            shipping.close()

    assert rig.log(job_id) == _numbers(1, 50)


def test_long_lines_are_capped_and_line_endings_normalized(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place()
    rig.run(job_id, "head -c 40000 /dev/zero | tr '\\0' x; echo; printf 'crlf\\r\\n'; "
                    "echo; printf 'no newline at the end'")

    wait_for(lambda: rig.job(job_id).state.is_final, "the job to end")

    assert rig.log(job_id) == ["x" * MAX_LINE_BYTES, "crlf", "", "no newline at the end"]


def test_many_lines_arrive_in_order(rig: Rig) -> None:
    rig.watch(rig.monitor())
    job_id = rig.place()
    rig.run(job_id, "seq 1 3000")

    wait_for(lambda: rig.job(job_id).state.is_final, "the job to end")

    assert rig.log(job_id) == _numbers(1, 3000)


def test_the_log_stream_is_bounded(rig: Rig) -> None:
    rig.settings = dataclasses.replace(rig.settings, log_max_lines=100)
    rig.watch(rig.monitor())
    job_id = rig.place()
    rig.run(job_id, "seq 1 5000")

    wait_for(lambda: rig.job(job_id).state.is_final, "the job to end")

    kept, added = Store(rig.redis).log_extent(job_id, 0, "main", 0)
    assert added == 5000
    assert 100 <= kept < 100 + 500  # trimmed in whole entries, a batch of at most 500 each
    assert rig.log(job_id)[-1] == "5000"


def test_a_broken_log_stream_is_resumed_without_repeats(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 10")
    monitor = rig.monitor()
    wait_for(lambda: container.reload() or container.status == "running", "the container to run")
    monitor.handle_start(container)
    wait_for(lambda: rig.log(job_id) == _numbers(1, 5), "the first lines to be shipped")

    # White box: drop the shipper's connection, as an engine hiccup would.
    shipper = monitor.shipping.ensure(container, TaskRef(job_id, 0, "main", 0))
    close_stream(wait_for(lambda: shipper._stream, "the shipper to be reading"))
    release(container)
    wait_for(lambda: rig.log(job_id) == _numbers(1, 10), "the rest to be shipped")
    monitor.handle_exit(rig.exited(container))

    assert rig.log(job_id) == _numbers(1, 10)


def test_a_line_is_written_when_it_arrives_not_on_a_timer(
        rig: Rig, files: EngineLogFiles | None) -> None:
    """Followers see a line one Redis round trip after Docker hands it over: with
    the flusher's timer set to an hour, the running task's lines still arrive."""
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 7")
    wait_for(lambda: container.reload() or container.status == "running", "the container to run")
    ref = TaskRef(job_id, 0, "main", 0)
    shipping = LogShipping(rig.store, max_lines=1000, flush_seconds=3600, files=files)
    try:
        shipping.ensure(container, ref)
        wait_for(lambda: rig.log(job_id) == _numbers(1, 5), "the first lines, while it runs")
        assert container.reload() or container.status == "running"
        release(container)
        wait_for(lambda: rig.log(job_id) == _numbers(1, 7), "the lines after the gate")
        assert shipping.drain(container, ref, DRAIN_SECONDS)
    finally:
        shipping.close()

    assert rig.log(job_id) == _numbers(1, 7)


def test_a_write_failing_for_one_task_leaves_the_flusher_writing_the_others(
        rig: Rig, files: EngineLogFiles | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One task's write failing with an error that is not Redis's (a bug, a
    line no one foresaw) must not end the flusher every shipper shares: the
    other task's lines still arrive while it runs, and the failed lines wait
    for the next write instead of being lost."""
    job_id = rig.place(tasks=2)
    broken, healthy = TaskRef(job_id, 0, "main", 0), TaskRef(job_id, 0, "main", 1)
    real_append, failing, tried = logs.append_log_entries, [True], []

    def append(r: Any, ref: TaskRef, *args: Any, **kwargs: Any) -> None:
        if ref == broken and failing[0]:
            tried.append(ref)
            raise ValueError("a write no one foresaw")
        real_append(r, ref, *args, **kwargs)

    monkeypatch.setattr(logs, "append_log_entries", append)
    first = rig.run(job_id, f"seq 1 3; {GATE}; seq 4 5")
    second = rig.run(job_id, f"seq 1 2; {GATE}; seq 3 4", index=1)
    shipping = LogShipping(rig.store, max_lines=1000, flush_seconds=3600, files=files)
    try:
        shipping.ensure(first, broken)
        wait_for(lambda: bool(tried), "the flusher to try the broken task's lines")
        shipping.ensure(second, healthy)
        wait_for(lambda: rig.log(job_id, index=1) == _numbers(1, 2),
                 "the healthy task's lines, while it runs")
        failing[0] = False
        for container, ref in ((first, broken), (second, healthy)):
            release(container)
            rig.exited(container)
            assert shipping.drain(container, ref, DRAIN_SECONDS)
    finally:
        shipping.close()

    assert rig.log(job_id) == _numbers(1, 5)
    assert rig.log(job_id, index=1) == _numbers(1, 4)


def test_the_flusher_of_a_node_with_nothing_running_sleeps(
        rig: Rig, files: EngineLogFiles | None) -> None:
    """Once its last container's log is shipped, the flusher waits for lines
    instead of waking every `flush_seconds` (five times a second by default)
    to sweep nothing; the next container's lines still go at once."""
    job_id = rig.place(tasks=2)
    ref, later = TaskRef(job_id, 0, "main", 0), TaskRef(job_id, 0, "main", 1)
    container = rig.run(job_id, "seq 1 3")
    shipping = LogShipping(rig.store, max_lines=1000, flush_seconds=0.05, files=files)
    try:
        shipping.ensure(container, ref)
        rig.exited(container)
        assert shipping.drain(container, ref, DRAIN_SECONDS)
        flusher = shipping._flusher
        assert flusher is not None and flusher.native_id is not None
        before = wakeups(flusher.native_id)
        time.sleep(1.0)  # the window observed (20 sweeps at this flush_seconds), not a wait
        assert wakeups(flusher.native_id) - before <= 2

        second = rig.run(job_id, f"seq 1 2; {GATE}; seq 3 4", index=1)
        shipping.ensure(second, later)
        wait_for(lambda: rig.log(job_id, index=1) == _numbers(1, 2), "the next task's lines")
        release(second)
        rig.exited(second)
        assert shipping.drain(second, later, DRAIN_SECONDS)
    finally:
        shipping.close()
    assert rig.log(job_id) == _numbers(1, 3)
    assert rig.log(job_id, index=1) == _numbers(1, 4)
