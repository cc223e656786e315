"""Pass requests that arrive together cost one pass, on a real Redis and real
Celery messages; and a pass never places a job by a spec it remembered from
another job of the same name.

The scheduler's worker takes one message at a time (solo pool, prefetch 1),
so the messages behind the one it handles wait in the broker's list. These
tests hand the worker's own handlers (`create_scheduler_app`) the messages in
that list one by one, as the worker would, and count the passes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis

from services.scheduler import reading, service
from services.scheduler.gate import DIRTY
from services.scheduler.run import wake_loop
from services.scheduler.service import PassStats, Scheduler
from services.scheduler.worker import create_scheduler_app
from shared.domain.models import Gpu, Node
from shared.domain.states import JobState, TaskState
from shared.infra import messaging
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys, passwake
from shared.state.lifecycle import delete_job, mark_task_running, request_stop, submit_job
from shared.state.store import Store
from shared.state.store.jobs import ASK_FIELD
from shared.state.taskexits import record_task_exit
from tests.support.polling import WAIT_SECONDS, wait_for
from tests.support.threads import looping

GPUS = 4


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def settings(redis_server: str) -> Settings:
    return Settings(redis_url=redis_server, node_lost_seconds=30)


class Worker:
    """The scheduler worker's handlers over its broker queue, and its passes."""

    def __init__(self, settings: Settings) -> None:
        self.app, self.scheduler = create_scheduler_app(settings)
        self.passes = 0
        run_pass = self.scheduler.run_pass

        def counted() -> PassStats:
            self.passes += 1
            return run_pass()

        self.scheduler.run_pass = counted  # type: ignore[method-assign]

    def handle_one(self, r: redis.Redis) -> bool:
        """Take the oldest waiting message and handle it; False if none waits."""
        raw = r.rpop(messaging.broker_queue_key(messaging.SCHEDULER_QUEUE))
        if raw is None:
            return False
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        self.app.tasks[message["headers"]["task"]](*args)
        return True

    def drain(self, r: redis.Redis, bound: int = 1000) -> int:
        handled = 0
        while handled < bound and self.handle_one(r):
            handled += 1
        return handled


@pytest.fixture
def worker(settings: Settings, redis_client: redis.Redis) -> Iterator[Worker]:
    worker = Worker(settings)
    yield worker
    worker.scheduler.store.r.close()


def add_node(store: Store, gpus: int = GPUS) -> None:
    store.register_node(Node("n1", "127.0.0.1", cpus=64, memory_mb=64_000,
                             gpus=[Gpu(i) for i in range(gpus)], port_range=(20000, 20100)))


def config(name: str, gpus: int = 1) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox",
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": gpus, "command": "true"}]}


def task_state(store: Store, job_id: str) -> TaskState:
    return store.get_tasks(job_id, 0)[0].state


def fill_and_queue(store: Store, worker: Worker, queued: int) -> tuple[list[str], list[str]]:
    """GPUS one-GPU jobs running on the node, `queued` more waiting for them."""
    add_node(store)
    running = [submit_job(store, "alice", config(f"run-{i}")).id for i in range(GPUS)]
    worker.scheduler.request_pass()
    for job_id in running:
        assert mark_task_running(store, job_id, 0, "main", 0, f"c-{job_id}")
    waiting = [submit_job(store, "alice", config(f"wait-{i}")).id for i in range(queued)]
    worker.scheduler.request_pass()
    assert all(task_state(store, j) == TaskState.WAITING for j in waiting)
    return running, waiting


@pytest.mark.parametrize("exits", [1, 2, GPUS])
def test_exits_that_arrive_together_cost_one_pass(store: Store, worker: Worker,
                                                  redis_client: redis.Redis,
                                                  exits: int) -> None:
    running, waiting = fill_and_queue(store, worker, GPUS)
    messenger = Messenger(make_celery(worker.scheduler.settings))
    for job_id in running[:exits]:  # the monitor's report of each exit
        record_task_exit(store, job_id, 0, "main", 0, exit_code=0)
        messenger.task_ended(job_id, 0, "main", 0)
        messenger.attempt_ended(job_id, 0)
    before = worker.passes

    assert worker.drain(redis_client) == 2 * exits

    assert worker.passes - before == 1
    assert [task_state(store, j) for j in waiting[:exits]] == [TaskState.LAUNCHING] * exits
    assert all(task_state(store, j) == TaskState.WAITING for j in waiting[exits:])
    assert redis_client.get(DIRTY) is None
    assert store.get_allocations(store.r, "n1").keys() == {
        f"{j}:0:main:0" for j in running[exits:] + waiting[:exits]}


def test_a_lone_exit_passes_at_once(store: Store, worker: Worker,
                                    redis_client: redis.Redis) -> None:
    """Nothing waits behind it: its own message runs the pass (no added latency)."""
    running, waiting = fill_and_queue(store, worker, 1)
    record_task_exit(store, running[0], 0, "main", 0, exit_code=0)
    Messenger(make_celery(worker.scheduler.settings)).task_ended(running[0], 0, "main", 0)
    before = worker.passes

    assert worker.handle_one(redis_client)

    assert worker.passes - before == 1
    assert task_state(store, waiting[0]) == TaskState.LAUNCHING


def test_a_message_that_asks_no_pass_runs_the_one_left_to_it(
        store: Store, worker: Worker, redis_client: redis.Redis) -> None:
    """The deferred pass runs after the last message, whatever that one is."""
    running, waiting = fill_and_queue(store, worker, 1)
    record_task_exit(store, running[0], 0, "main", 0, exit_code=0)
    messenger = Messenger(make_celery(worker.scheduler.settings))
    messenger.task_ended(running[0], 0, "main", 0)
    messenger.stop_job(running[1])  # still RUNNING: it asks for nothing
    before = worker.passes

    assert worker.handle_one(redis_client)
    assert (worker.passes - before, task_state(store, waiting[0])) == (0, TaskState.WAITING)
    assert worker.handle_one(redis_client)

    assert worker.passes - before == 1
    assert task_state(store, waiting[0]) == TaskState.LAUNCHING


def test_a_queue_that_never_empties_still_gets_its_passes(
        store: Store, worker: Worker, redis_client: redis.Redis) -> None:
    add_node(store)
    submit_job(store, "alice", config("a"))
    # one message always waits behind the one being handled
    redis_client.lpush(messaging.broker_queue_key(messaging.SCHEDULER_QUEUE), "{}")
    handler = worker.app.tasks[messaging.SCHEDULE]

    for _ in range(service.MAX_DEFERRED):
        handler()
    assert worker.passes == 0
    handler()

    assert worker.passes == 1
    assert task_state(store, "alice~a") == TaskState.LAUNCHING


def test_requests_during_a_pass_cost_one_pass_after_it(store: Store, settings: Settings,
                                                       redis_server: str) -> None:
    """Another replica's (or the repair loop's) requests while a pass holds
    the lock only mark the work: the holder passes once more for them all."""
    add_node(store)
    other = Scheduler(settings, Store.from_url(redis_server),
                      Messenger(make_celery(settings)))
    holder = Scheduler(settings, store, Messenger(make_celery(settings)))
    passes: list[str] = []
    run_pass = holder.run_pass

    def pass_with_requests() -> PassStats:
        passes.append("holder")
        stats = run_pass()
        if len(passes) == 1:  # before the first pass ends, jobs come and ask
            for i in range(GPUS):
                submit_job(store, "alice", config(f"late-{i}"))
                other.request_pass()
            assert all(task_state(store, f"alice~late-{i}") == TaskState.WAITING
                       for i in range(GPUS))
        return stats

    holder.run_pass = pass_with_requests  # type: ignore[method-assign]
    other_passes = 0
    other_run = other.run_pass

    def counted() -> PassStats:
        nonlocal other_passes
        other_passes += 1
        return other_run()

    other.run_pass = counted  # type: ignore[method-assign]

    holder.request_pass()

    assert (passes, other_passes) == (["holder", "holder"], 0)
    assert all(task_state(store, f"alice~late-{i}") == TaskState.LAUNCHING for i in range(GPUS))
    assert store.r.exists(keys.SCHEDULER_LOCK, DIRTY) == 0
    other.store.r.close()


def test_a_failed_pass_lets_the_lock_go(store: Store, settings: Settings) -> None:
    add_node(store)
    scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))

    def broken() -> PassStats:
        store.r.set(DIRTY, "1")  # asked again meanwhile
        raise RuntimeError("the pass broke")

    scheduler.run_pass = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        scheduler.request_pass()

    assert not store.r.exists(keys.SCHEDULER_LOCK)
    assert store.r.get(DIRTY) == "1"  # the next request passes


def test_a_name_submitted_again_is_placed_by_its_new_spec(store: Store,
                                                          worker: Worker) -> None:
    """The scheduler keeps what it parsed of a queued job between passes: a
    job deleted and submitted again under the same name is a new submission,
    never placed by the old one's spec."""
    add_node(store)
    old = submit_job(store, "alice", config("same", gpus=GPUS + 1))  # never fits
    worker.scheduler.request_pass()
    assert task_state(store, old.id) == TaskState.WAITING
    request_stop(store, old.id)
    assert (store.get_job(old.id) or pytest.fail()).state == JobState.STOPPED
    assert delete_job(store, old.id)

    new = submit_job(store, "alice", config("same", gpus=2))
    assert new.id == old.id
    worker.scheduler.request_pass()

    [alloc] = store.get_allocations(store.r, "n1").values()
    assert (alloc.job_id, len(alloc.gpus)) == (new.id, 2)
    assert task_state(store, new.id) == TaskState.LAUNCHING


def test_the_caches_keep_only_what_is_queued_or_placed(
        store: Store, worker: Worker, redis_client: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a pass remembers of jobs (the specs of those whose records do
    not say what they ask, the asks, their allocations' parsed records)
    goes once they are gone, so a scheduler that runs for months holds about
    what its cluster and queue hold."""
    monkeypatch.setattr(reading, "PRUNE_SLACK", 0)
    monkeypatch.setattr("shared.state.store.nodes.MAX_GONE_ALLOCATIONS", 0)
    add_node(store)
    scheduler = worker.scheduler
    running = [submit_job(store, "alice", config(f"run-{i}")).id for i in range(GPUS)]
    for job_id in running[:2]:  # records written before the ask: their configs say it
        redis_client.hdel(keys.job(job_id), ASK_FIELD)
    scheduler.request_pass()
    for job_id in running:
        assert mark_task_running(store, job_id, 0, "main", 0, f"c-{job_id}")
    waiting = [submit_job(store, "alice", config(f"wait-{i}")).id for i in range(2)]
    scheduler.request_pass()
    assert {job_id for job_id, _ in scheduler.reader.specs} == set(running[:2])
    asked = redis_client.hget(keys.job(waiting[0]), ASK_FIELD)
    assert list(scheduler.reader.asks) == [asked]  # the jobs ask alike
    for job_id in running:
        record_task_exit(store, job_id, 0, "main", 0, exit_code=0)
        scheduler.task_ended(job_id, 0, "main", 0)
        assert delete_job(store, job_id)
    scheduler.request_pass()  # places the waiting jobs
    scheduler.request_pass()  # nothing changed since: only forgets

    assert scheduler.reader.specs == {}
    assert list(scheduler.reader.asks) == [asked]  # the placed jobs' own
    live = set(waiting)  # both placed now, nothing queued
    assert {a.job_id for a in scheduler.reader.allocations.values()} == live
    assert {a.job_id for a in store.get_allocations(store.r, "n1").values()} == live


def test_a_lock_that_expired_and_was_taken_is_left_to_its_new_holder(
        store: Store, settings: Settings) -> None:
    """A pass that outlived its lock (LOCK_SECONDS) while another replica took
    it neither frees the other's lock nor passes again beside it: the work
    asked for meanwhile is the new holder's."""
    add_node(store)
    scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
    passes = 0
    run_pass = scheduler.run_pass

    def outlived() -> PassStats:
        nonlocal passes
        passes += 1
        store.r.set(keys.SCHEDULER_LOCK, "another replica's token")
        store.r.set(DIRTY, "1")
        return run_pass()

    scheduler.run_pass = outlived  # type: ignore[method-assign]
    scheduler.request_pass()

    assert passes == 1
    assert store.r.get(keys.SCHEDULER_LOCK) == "another replica's token"
    assert store.r.get(DIRTY) == "1"


# ------------------------------------------------------------- the doorbell


def answering(scheduler: Scheduler) -> AbstractContextManager[threading.Event]:
    """The scheduler's wake thread (services/scheduler/run.py), for the block."""
    return looping(lambda stop: wake_loop(scheduler, stop, 0.1))


def test_rings_before_a_pass_cost_one_pass(store: Store, worker: Worker,
                                           redis_client: redis.Redis) -> None:
    running, waiting = fill_and_queue(store, worker, GPUS)
    for job_id in running[:3]:  # the monitor's report of each exit
        record_task_exit(store, job_id, 0, "main", 0, exit_code=0)
        passwake.ring_now(redis_client)
    assert redis_client.llen(passwake.KEY) == 1  # the doorbell holds one ring
    before = worker.passes

    with answering(worker.scheduler):
        wait_for(lambda: all(task_state(store, j) == TaskState.LAUNCHING
                             for j in waiting[:3]), "the freed GPUs taken")

    assert worker.passes - before == 1
    assert redis_client.llen(passwake.KEY) == 0
    assert all(task_state(store, j) == TaskState.WAITING for j in waiting[3:])


def test_a_pass_takes_the_rings_made_before_it(store: Store, worker: Worker,
                                               redis_client: redis.Redis) -> None:
    running, waiting = fill_and_queue(store, worker, 2)
    for job_id in running[:2]:
        record_task_exit(store, job_id, 0, "main", 0, exit_code=0)
        passwake.ring_now(redis_client)  # the second comes after the wake thread took the first
    worker.scheduler.request_pass()
    assert all(task_state(store, j) == TaskState.LAUNCHING for j in waiting)
    assert redis_client.llen(passwake.KEY) == 0  # no pass left to find nothing


def test_a_ring_during_a_pass_gets_a_pass_after_it(store: Store, worker: Worker,
                                                   redis_client: redis.Redis) -> None:
    running, waiting = fill_and_queue(store, worker, 1)
    passes: list[int] = []
    run_pass = worker.scheduler.run_pass

    def exit_during_the_first() -> PassStats:
        stats = run_pass()
        if not passes:  # after this pass read the cluster, a task exits
            record_task_exit(store, running[0], 0, "main", 0, exit_code=0)
            passwake.ring_now(redis_client)
        passes.append(1)
        return stats

    worker.scheduler.run_pass = exit_during_the_first  # type: ignore[method-assign]
    passwake.ring_now(redis_client)

    with answering(worker.scheduler):
        wait_for(lambda: task_state(store, waiting[0]) == TaskState.LAUNCHING,
                 "the GPU freed during the first pass taken by a second")

    assert len(passes) == 2


@pytest.mark.parametrize("rings", [
    pytest.param((passwake.CAPACITY, passwake.NEW_WORK), id="capacity-then-new-work"),
    pytest.param((passwake.NEW_WORK, passwake.CAPACITY), id="new-work-then-capacity"),
    pytest.param((passwake.NEW_WORK, passwake.NEW_WORK), id="new-work-only"),
])
def test_the_doorbell_keeps_a_capacity_ring_over_new_work(
        redis_client: redis.Redis, rings: tuple[str, str]) -> None:
    for ring in rings:
        passwake.ring_now(redis_client, new_work=ring == passwake.NEW_WORK)
    kept = passwake.CAPACITY if passwake.CAPACITY in rings else passwake.NEW_WORK
    assert redis_client.lrange(passwake.KEY, 0, -1) == [kept]


def test_a_wait_for_capacity_folds_new_work_in(redis_client: redis.Redis) -> None:
    passwake.ring_now(redis_client, new_work=True)
    assert passwake.wait_for_capacity(redis_client, 0.2) is False
    assert redis_client.llen(passwake.KEY) == 0  # taken: the pass after the wait covers it
    passwake.ring_now(redis_client, new_work=True)
    passwake.ring_now(redis_client)
    assert passwake.wait_for_capacity(redis_client, WAIT_SECONDS) is True


def paced(settings: Settings, interval: float) -> Worker:
    return Worker(dataclasses.replace(settings, new_work_pass_seconds=interval))


def test_new_work_behind_a_pass_that_left_jobs_waiting_waits_for_capacity(
        store: Store, settings: Settings, redis_client: redis.Redis) -> None:
    """A submit into a full cluster does not pass at once: the freed GPU's
    ring ends its wait, and one pass answers both."""
    worker = paced(settings, WAIT_SECONDS * 10)  # no pass for new work within the test
    running, waiting = fill_and_queue(store, worker, 1)
    before = worker.passes
    with answering(worker.scheduler):
        later = submit_job(store, "alice", config("later")).id
        passwake.ring_now(redis_client, new_work=True)
        wait_for(lambda: redis_client.llen(passwake.KEY) == 0, "the new work's ring taken")
        record_task_exit(store, running[0], 0, "main", 0, exit_code=0)
        passwake.ring_now(redis_client)
        wait_for(lambda: task_state(store, waiting[0]) == TaskState.LAUNCHING,
                 "the freed GPU taken")
    assert worker.passes - before == 1
    assert task_state(store, later) == TaskState.WAITING


def test_new_work_on_a_cluster_with_nothing_waiting_passes_at_once(
        store: Store, settings: Settings, redis_client: redis.Redis) -> None:
    worker = paced(settings, WAIT_SECONDS * 10)
    add_node(store)
    worker.scheduler.request_pass()  # it left nothing waiting
    with answering(worker.scheduler):
        job_id = submit_job(store, "alice", config("lone")).id
        passwake.ring_now(redis_client, new_work=True)
        wait_for(lambda: task_state(store, job_id) == TaskState.LAUNCHING, "the job placed")
