"""The scheduler's IO shell on a real Redis: passes, releases, lost nodes."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from services.scheduler.service import Scheduler
from shared.domain.lease import Phase
from shared.domain.models import TaskPlacement
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys, leases
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.leases import Holder, Role
from shared.state.lifecycle import delete_job, mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.starts import parse
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.interleave import Hook, with_hooks
from tests.support.roundtrips import RoundTrips
from tests.support.scheduling import add_node, config
from tests.support.scheduling import scheduler as scheduler  # the fixtures
from tests.support.scheduling import store as store


def starts_sent(r: redis.Redis, node: str) -> list[list[Any]]:
    """The tasks waiting in a node's stream of starts, oldest first."""
    return [list(task) for _, fields in r.xrange(keys.node_starts(node))
            for task in parse("", fields).tasks]


def test_pass_places_in_order_and_sends_starts(store: Store, scheduler: Scheduler,
                                               redis_client: redis.Redis) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=6))
    submit_job(store, "alice", config("b", gpus=6))
    submit_job(store, "alice", config("c", gpus=2))

    stats = scheduler.run_pass()

    # b, next in line, keeps the node's last two GPUs for itself: c, behind
    # it, may not take them (b would wait for c as well as a)
    assert stats.placed == 1
    a, b, c = (store.get_tasks(f"alice~{n}", 0)[0] for n in "abc")
    assert a.state == TaskState.LAUNCHING and b.state == c.state == TaskState.WAITING
    assert redis_client.zrange(keys.QUEUE, 0, -1) == ["alice~b", "alice~c"]
    assert redis_client.zrange(keys.vc_queue("default"), 0, -1) == ["alice~b", "alice~c"]
    waiting_b = store.get_job("alice~b") or pytest.fail()
    assert "needs 6 GPUs" in waiting_b.waiting_reason
    assert json.loads(waiting_b.waiting)["reason"] == "InsufficientResources"
    waiting_c = store.get_job("alice~c") or pytest.fail()
    assert json.loads(waiting_c.waiting)["blockedBy"] == [{"kind": "reservation",
                                                           "name": "alice~b"}]
    assert [m[0] for m in starts_sent(redis_client, "n1")] == ["alice~a"]


def test_release_after_exit_lets_the_waiting_job_in(store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a", gpus=6))
    submit_job(store, "alice", config("b", gpus=6))
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "cid")
    record_task_exit(store, "alice~a", 0, "main", 0, exit_code=0)

    scheduler.task_ended("alice~a", 0, "main", 0)

    b = store.get_tasks("alice~b", 0)[0]
    assert b.state == TaskState.LAUNCHING and len(b.gpus) == 6
    assert store.get_allocations(store.r, "n1").keys() == {"alice~b:0:main:0"}


def test_release_ignores_a_live_task(store: Store, scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a"))
    scheduler.run_pass()
    assert not scheduler.release_if_settled("alice~a", 0, "main", 0)
    assert len(store.get_allocations(store.r, "n1")) == 1


def test_lost_node_fails_tasks_as_platform_failures_and_retries(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    add_node(store, "n1")
    submit_job(store, "alice", config("a", retry=0))
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "cid")
    redis_client.zadd(keys.NODES, {"n1": 1})  # its last heartbeat was long ago
    add_node(store, "n2")

    scheduler.warden.round()

    job = store.get_job("alice~a")
    assert job is not None
    assert (job.state, job.attempt, job.retries, job.platform_retries) == \
        (JobState.WAITING, 1, 0, 1)
    lost = store.get_tasks("alice~a", 0)[0]
    assert lost.state == TaskState.FAILED and lost.platform_failure
    assert "node n1 lost" in lost.diagnostics
    assert store.get_allocations(store.r, "n1") == {}
    scheduler.run_pass()
    assert store.get_tasks("alice~a", 1)[0].node == "n2"


def test_stale_launch_is_sent_again(store: Store, scheduler: Scheduler,
                                    redis_client: redis.Redis) -> None:
    add_node(store)
    submit_job(store, "alice", config("a"))
    scheduler.run_pass()
    redis_client.delete(keys.node_starts("n1"))
    redis_client.zadd(keys.LAUNCHING, {"alice~a:0:main:0": 1})

    scheduler.retry_stale_launches()

    assert [m[0] for m in starts_sent(redis_client, "n1")] == ["alice~a"]
    assert (redis_client.zscore(keys.LAUNCHING, "alice~a:0:main:0") or 0) > 1


def test_sweep_releases_allocations_of_settled_tasks(store: Store,
                                                     scheduler: Scheduler) -> None:
    add_node(store)
    submit_job(store, "alice", config("a"))
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "cid")
    kept = store.r.hget(keys.node_alloc("n1"), "alice~a:0:main:0")
    record_task_exit(store, "alice~a", 0, "main", 0, exit_code=0)
    # as an exit recorded by an earlier version leaves it (the scheduler's
    # release lost with its message)
    store.r.hset(keys.node_alloc("n1"), "alice~a:0:main:0", kept)

    scheduler.sweep_allocations()

    assert store.get_allocations(store.r, "n1") == {}


def test_passes_coalesce_under_the_lock(store: Store, scheduler: Scheduler,
                                        redis_client: redis.Redis) -> None:
    add_node(store)
    lock = redis_client.lock(keys.SCHEDULER_LOCK, timeout=10)
    assert lock.acquire(blocking=False)
    submit_job(store, "alice", config("a"))
    scheduler.request_pass()  # someone else holds the lock: it only marks work to do
    assert store.get_tasks("alice~a", 0)[0].state == TaskState.WAITING
    lock.release()
    scheduler.request_pass()
    assert store.get_tasks("alice~a", 0)[0].state == TaskState.LAUNCHING


# ------------------------------------------------- compare-and-set under races


@pytest.fixture
def other(redis_server: str) -> Iterator[Store]:
    """Another service's own connection: what the hooks below do, it does."""
    other = Store.from_url(redis_server)
    yield other
    other.r.close()


def interleaved(redis_client: redis.Redis, scheduler: Scheduler, *hooks: Hook) -> Scheduler:
    """The scheduler, meeting `hooks` at the points they name (tests/support/interleave.py)."""
    return Scheduler(scheduler.settings, Store(with_hooks(redis_client, *hooks)),
                     scheduler.messenger)


def placement(gpu: int) -> list[TaskPlacement]:
    return [TaskPlacement(role="main", index=0, node="n1", ip="127.0.0.1", gpus=(gpu,),
                          cpus=1, memory_mb=128, ports={"default": [20000 + gpu]})]


def place_and_run(store: Store, job_id: str, gpu: int) -> None:
    job = store.get_job(job_id)
    assert job is not None
    assert commit_placement(store, job_id, version=job.version, attempt=job.attempt,
                            placements=placement(gpu), launch_deadline_ms=now_ms() + 60_000)
    assert mark_task_running(store, job_id, job.attempt, "main", 0, f"c-{gpu}")


def test_a_retry_requeued_while_a_pass_drops_stale_entries_stays_queued(
        store: Store, scheduler: Scheduler, other: Store, redis_client: redis.Redis) -> None:
    """Threat (a job lost): a pass read the queue, then the job's record while it
    ran (so the entry looked stale); its task failed and the retry queued it
    again before the pass removed the stale entry. The removal is conditional
    on the record it re-reads, so the retried job stays queued and runs."""
    add_node(store)
    job = submit_job(store, "alice", config("flaky", retry=3))
    # The pass reads the queue, then (its snapshot's second round trip) the
    # queued jobs' records: another replica places it and it starts in between
    hooks = (Hook("after-read", keys.job(job.id),
                  lambda: place_and_run(other, job.id, gpu=0)),
             Hook("before-write", keys.QUEUE,  # it fails and is retried
                  lambda: record_task_exit(other, job.id, 0, "main", 0, exit_code=1)))
    racing = interleaved(redis_client, scheduler, *hooks)

    assert racing.run_pass().placed == 0  # it saw the job running
    assert all(h.fired for h in hooks)

    retried = store.get_job(job.id)
    assert retried is not None and (retried.state, retried.attempt) == (JobState.WAITING, 1)
    assert store.queued_job_ids() == [job.id]
    assert scheduler.run_pass().placed == 1


def test_stale_entries_are_dropped_from_the_queue(store: Store, scheduler: Scheduler,
                                                   redis_client: redis.Redis) -> None:
    add_node(store, gpus=0)
    submit_job(store, "alice", config("gone"))
    submit_job(store, "alice", config("waits"))
    redis_client.delete(keys.job("alice~gone"))
    scheduler.run_pass()
    assert store.queued_job_ids() == ["alice~waits"]


def test_a_release_decided_on_a_deleted_job_spares_the_job_that_reused_its_name(
        store: Store, scheduler: Scheduler, other: Store, redis_client: redis.Redis) -> None:
    """Threat (a GPU handed out twice): a release read the finished task, then the
    job was deleted and its name submitted and placed again: the new task's
    allocation has the same key. The release is conditional on the task record,
    so the new allocation stays."""
    add_node(store)
    job = submit_job(store, "alice", config("again"))
    place_and_run(store, job.id, gpu=0)
    kept = redis_client.hget(keys.node_alloc("n1"), f"{job.id}:0:main:0")
    record_task_exit(store, job.id, 0, "main", 0, exit_code=0)
    redis_client.hset(keys.node_alloc("n1"), f"{job.id}:0:main:0", kept)  # left behind

    def delete_and_resubmit() -> None:
        assert delete_job(other, job.id)
        submit_job(other, "alice", config("again"))
        place_and_run(other, job.id, gpu=1)

    hook = Hook("before-write", keys.node_alloc("n1"), delete_and_resubmit)
    racing = interleaved(redis_client, scheduler, hook)

    assert racing.release_if_settled(job.id, 0, "main", 0)  # it read the task settled
    assert hook.fired
    [kept] = store.get_allocations(redis_client, "n1").values()
    assert kept.gpus == (1,)


def test_a_stale_launch_that_starts_meanwhile_keeps_no_lease(
        store: Store, scheduler: Scheduler, other: Store, redis_client: redis.Redis) -> None:
    """A lease renewed just as the task started would outlive it (and send a
    second start); the renewal is conditional on the task still launching."""
    add_node(store)
    submit_job(store, "alice", config("a"))
    scheduler.run_pass()
    redis_client.delete(keys.node_starts("n1"))
    member = "alice~a:0:main:0"
    redis_client.zadd(keys.LAUNCHING, {member: 1})
    hook = Hook("before-write", keys.LAUNCHING,
                lambda: mark_task_running(other, "alice~a", 0, "main", 0, "cid"))

    interleaved(redis_client, scheduler, hook).retry_stale_launches()

    assert hook.fired
    assert redis_client.zscore(keys.LAUNCHING, member) is None
    assert starts_sent(redis_client, "n1") == []


# ------------------------------------------------------------ the policy


def launcher_tasks(r: redis.Redis, node: str) -> list[tuple[str, list[Any]]]:
    """(task name, args) of the Celery messages waiting in a launcher's queue
    (stops, preemptions), oldest first."""
    messages = [json.loads(m) for m in reversed(r.lrange(f"launcher.{node}", 0, -1))]
    return [(m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0])
            for m in messages]


def test_a_borrowing_job_is_preempted_for_the_owner_and_comes_back_uncharged(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    add_node(store, gpus=4)
    Accounts(store).put_vc(VirtualCluster("research", 4))  # default keeps 0 of 4
    borrower = submit_job(store, "alice", config("borrower", gpus=4))
    scheduler.run_pass()
    assert (store.get_job(borrower.id) or pytest.fail()).mode == "borrowed"
    mark_task_running(store, borrower.id, 0, "main", 0, "c1")

    owner = submit_job(store, "bob", {**config("owner", gpus=4), "virtualCluster": "research",
                                      "preemptionGracePeriodSec": 5})
    scheduler.run_pass()

    victim = store.get_job(borrower.id) or pytest.fail()
    assert victim.preempted_by == owner.id
    assert ("pai.launcher.preempt_task", [borrower.id, 0, "main", 0]) in \
        launcher_tasks(redis_client, "n1")
    waiting = store.get_job(owner.id) or pytest.fail()
    explained = json.loads(waiting.waiting)
    assert explained["reason"] == "WaitingForPreemption"
    assert explained["blockedBy"] == [{"kind": "job", "name": borrower.id}]
    # the victim's grace is its own default (30 s), not the owner's 5 s
    assert explained["estimatedStartTime"] == victim.preempt_deadline_ms
    scheduler.run_pass()  # again: no second preemption, no second signal
    assert [t for t, _ in launcher_tasks(redis_client, "n1")].count(
        "pai.launcher.preempt_task") == 1
    assert redis_client.hget(keys.recorded_metric("pai_scheduler_preemptions"),
                             '["default"]') == "1"

    report = record_task_exit(store, borrower.id, 0, "main", 0, exit_code=143)
    assert report is not None and report.retried
    scheduler.task_ended(borrower.id, 0, "main", 0)

    placed = store.get_job(owner.id) or pytest.fail()
    assert (placed.mode, store.get_tasks(owner.id, 0)[0].state) == ("guaranteed",
                                                                     TaskState.LAUNCHING)
    requeued = store.get_job(borrower.id) or pytest.fail()
    assert (requeued.state, requeued.retries, requeued.preemptions) == (JobState.WAITING, 0, 1)
    assert redis_client.zrange(keys.vc_queue("default"), 0, -1) == [borrower.id]


def test_the_overdue_victim_is_stopped_hard(store: Store, redis_server: str,
                                            redis_client: redis.Redis) -> None:
    settings = Settings(redis_url=redis_server, preemption_grace_seconds=0)
    scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
    add_node(store, gpus=4)
    Accounts(store).put_vc(VirtualCluster("research", 4))
    borrower = submit_job(store, "alice", config("borrower", gpus=4))
    scheduler.run_pass()
    mark_task_running(store, borrower.id, 0, "main", 0, "c1")
    submit_job(store, "bob", {**config("owner", gpus=4), "virtualCluster": "research"})
    scheduler.run_pass()  # preempts, with no grace at all
    scheduler.run_pass()  # the grace is over: the stop follows
    assert ("pai.launcher.stop_task", [borrower.id, 0, "main", 0]) in \
        launcher_tasks(redis_client, "n1")


# ------------------------------------------------------------- cordon, drain


def test_nothing_new_lands_on_a_cordoned_node(store: Store, scheduler: Scheduler) -> None:
    add_node(store, "n1")
    add_node(store, "n2")
    store.set_node_flags("n1", schedulable=False, reason="new fans", by="root")
    submit_job(store, "alice", config("a", gpus=8))
    submit_job(store, "alice", config("b", gpus=8))
    scheduler.run_pass()
    assert store.get_tasks("alice~a", 0)[0].node == "n2"
    assert store.get_tasks("alice~b", 0)[0].state == TaskState.WAITING


def test_a_placement_racing_a_cordon_is_not_committed(store: Store) -> None:
    add_node(store, "n1")
    job = submit_job(store, "alice", config("a", gpus=1))
    store.set_node_flags("n1", drain=True, by="root")  # after the pass's snapshot
    placement = TaskPlacement(role="main", index=0, node="n1", ip="127.0.0.1", gpus=(0,),
                              cpus=1, memory_mb=128, ports={"default": [20000]})
    assert not commit_placement(store, job.id, version=job.version, attempt=0,
                                placements=[placement], launch_deadline_ms=now_ms() + 60_000)


def test_draining_a_node_preempts_its_jobs_and_requeues_them_uncharged(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    add_node(store, "n1")
    add_node(store, "n2", gpus=0)  # no GPUs: the job has nowhere else to go
    job = submit_job(store, "alice", config("a", gpus=2))
    scheduler.run_pass()
    mark_task_running(store, job.id, 0, "main", 0, "c1")
    store.set_node_flags("n1", drain=True, reason="maintenance", by="root")

    scheduler.run_pass()

    drained = store.get_job(job.id) or pytest.fail()
    assert drained.preempted_by == "drain of node n1"
    assert ("pai.launcher.preempt_task", [job.id, 0, "main", 0]) in \
        launcher_tasks(redis_client, "n1")
    record_task_exit(store, job.id, 0, "main", 0, exit_code=143)
    scheduler.task_ended(job.id, 0, "main", 0)
    requeued = store.get_job(job.id) or pytest.fail()
    assert (requeued.state, requeued.retries, requeued.preemptions) == (JobState.WAITING, 0, 1)
    assert json.loads(requeued.waiting)["reason"] == "Unschedulable"  # n2 has no GPUs
    store.set_node_flags("n1", schedulable=True, by="root")
    scheduler.run_pass()
    assert store.get_tasks(job.id, 1)[0].node == "n1"


# ------------------------------------------------------- repair round cost


def test_a_repair_round_with_nothing_to_repair_costs_the_same_whatever_is_held(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    """The sweep and the nodes' judgement read every allocation's task and
    job in pipelines: a quiet round's round trips do not grow with the
    allocations (two running tasks, then twenty-four, on three nodes)."""
    for n in range(3):
        add_node(store, f"n{n}")
    costs: list[int] = []
    submitted = 0
    for jobs in (2, 24):
        for j in range(submitted, jobs):
            submit_job(store, "alice", config(f"j{j}"))
        submitted = jobs
        scheduler.run_pass()
        for j in range(jobs):
            mark_task_running(store, f"alice~j{j}", 0, "main", 0, f"c{j}")
        assert sum(len(store.get_allocations(store.r, f"n{n}")) for n in range(3)) == jobs
        counting = RoundTrips(redis_client)
        quiet = Scheduler(scheduler.settings, Store(counting), scheduler.messenger)
        quiet.warden.round()
        quiet.sweep_allocations()
        costs.append(counting.count)
    assert costs[0] == costs[1]
    # the renewals, clock and outage record; the leases; the judgement written;
    # then the nodes (2), their allocations, tasks, jobs
    assert costs[0] <= 8
    assert sum(len(store.get_allocations(store.r, f"n{n}")) for n in range(3)) == 24
    assert not any(name == "pai.launcher.stop_task" for n in range(3)
                   for name, _ in launcher_tasks(redis_client, f"n{n}"))


def test_a_pass_costs_the_same_round_trips_whatever_waits_and_reads_the_vcs_with_the_snapshot(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    """A pass that places the job a finished one made room for costs the
    same round trips with 2 jobs waiting behind it as with 30, and the
    virtual clusters come with the snapshot: a guarantee changed between
    two passes is the one the next pass weighs."""
    add_node(store, gpus=1)
    counting = RoundTrips(redis_client)
    passing = Scheduler(scheduler.settings, Store(counting), scheduler.messenger)
    costs: list[int] = []
    submitted = 0
    for running, behind in ((0, 2), (1, 30)):
        for j in range(submitted, running + behind + 2):
            submit_job(store, "alice", config(f"j{j}"))
        submitted = running + behind + 2
        passing.run_pass()  # the new jobs read; the GPU stays taken
        mark_task_running(store, f"alice~j{running}", 0, "main", 0, "c")
        record_task_exit(store, f"alice~j{running}", 0, "main", 0, exit_code=0)
        counting.count = 0
        assert passing.run_pass().placed == 1
        costs.append(counting.count)
    # the snapshot (2, with the VCs), the commit (its tasks read, then bound),
    # the start, and the waiting reasons with the pass's metrics (1)
    assert costs == [6, 6]

    placed = store.get_job("alice~j2") or pytest.fail()
    assert placed.state == JobState.WAITING and placed.mode == "guaranteed"
    Accounts(store).put_vc(VirtualCluster("research", 1))  # the GPU default had
    assert scheduler.run_pass().modes_changed == 1
    assert (store.get_job("alice~j2") or pytest.fail()).mode == "borrowed"


def test_the_sweep_releases_and_stops_in_one_round(store: Store, scheduler: Scheduler,
                                                   redis_client: redis.Redis) -> None:
    """Of three allocations, the settled task's is released, the task of an
    attempt that moved on is told to stop, the running one is left alone."""
    add_node(store)
    for name in ("done", "moved", "runs"):
        submit_job(store, "alice", config(name))
    scheduler.run_pass()
    for name in ("done", "moved", "runs"):
        mark_task_running(store, f"alice~{name}", 0, "main", 0, f"c-{name}")
    record_task_exit(store, "alice~done", 0, "main", 0, exit_code=0)
    redis_client.hset(keys.job("alice~moved"), "attempt", "1")  # as after a retry
    redis_client.delete("launcher.n1")

    scheduler.sweep_allocations()

    assert set(store.get_allocations(store.r, "n1")) == {"alice~moved:0:main:0",
                                                         "alice~runs:0:main:0"}
    assert launcher_tasks(redis_client, "n1") == [("pai.launcher.stop_task",
                                                   ["alice~moved", 0, "main", 0])]


def test_starts_lost_with_the_link_are_sent_again_by_the_launch_lease(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    """Sending the starts fails after the placements are committed: the
    pass still finishes (the waiting job gets its reason), and the launch
    lease sends the lost start once it is due."""
    add_node(store, gpus=1)
    submit_job(store, "alice", config("placed"))
    submit_job(store, "alice", config("waits"))

    def link_down() -> None:
        raise redis.ConnectionError("Redis unreachable")

    hook = Hook("before-write", keys.node_starts("n1"), link_down)
    assert interleaved(redis_client, scheduler, hook).run_pass().placed == 1
    assert hook.fired
    assert store.get_tasks("alice~placed", 0)[0].state == TaskState.LAUNCHING
    assert (store.get_job("alice~waits") or pytest.fail()).waiting_reason
    assert starts_sent(redis_client, "n1") == []

    redis_client.zadd(keys.LAUNCHING, {"alice~placed:0:main:0": 1})  # its lease is due
    scheduler.retry_stale_launches()
    assert starts_sent(redis_client, "n1") == [["alice~placed", 0, "main", 0]]

@pytest.mark.parametrize(("waited_hours", "first"), [
    pytest.param(0, "fresh", id="a retried job that had much GPU time goes after a new one"),
    pytest.param(3, "served", id="until it has waited long enough: back at its submit place"),
])
def test_attained_service_comes_from_the_attempt_records(
        store: Store, scheduler: Scheduler, waited_hours: int, first: str) -> None:
    add_node(store, gpus=4)
    served = submit_job(store, "alice", config("served", gpus=4, retry=1))
    scheduler.run_pass()
    mark_task_running(store, served.id, 0, "main", 0, "c1")
    # its first attempt ran two hours on 4 GPUs: 8 GPU-hours, past the first
    # threshold (1 GPU-hour) and below the second (10)
    ran = store.read_attempt(store.r, served.id, 0) or pytest.fail()
    ran.started_ms = now_ms() - 2 * 3_600_000
    store.r.hset(keys.job_attempts(served.id), "0", json.dumps(ran.to_dict()))
    report = record_task_exit(store, served.id, 0, "main", 0, exit_code=1)
    assert report is not None and report.retried
    if waited_hours:  # its retry has waited since then (the wait lifts it a queue per 2 h)
        retry = store.read_attempt(store.r, served.id, 1) or pytest.fail()
        retry.created_ms = now_ms() - waited_hours * 3_600_000
        store.r.hset(keys.job_attempts(served.id), "1", json.dumps(retry.to_dict()))
    fresh = submit_job(store, "bob", config("fresh", gpus=4))

    scheduler.task_ended(served.id, 0, "main", 0)

    ids = {"served": (served.id, 1), "fresh": (fresh.id, 0)}
    started = {name for name, (job_id, attempt) in ids.items()
               if store.get_tasks(job_id, attempt)[0].state == TaskState.LAUNCHING}
    assert started == {first}


@pytest.mark.parametrize(("waited_hours", "order"), [
    pytest.param(0, ["fresh", "served"], id="a much-served job waits behind a new one"),
    pytest.param(3, ["served", "fresh"], id="after its wait lifted it, at its submit place"),
])
def test_the_queue_index_positions_follow_least_attained_service(
        store: Store, scheduler: Scheduler, waited_hours: int, order: list[str]) -> None:
    """`position` (the VC queue index's rank) counts the jobs the policy
    places first: a retried job that attained much sits behind new work."""
    add_node(store, gpus=4)
    served = submit_job(store, "alice", config("served", gpus=4, retry=1))
    scheduler.run_pass()
    mark_task_running(store, served.id, 0, "main", 0, "c1")
    ran = store.read_attempt(store.r, served.id, 0) or pytest.fail()
    ran.started_ms = now_ms() - 2 * 3_600_000  # 8 GPU-hours: the second queue
    store.r.hset(keys.job_attempts(served.id), "0", json.dumps(ran.to_dict()))
    assert (report := record_task_exit(store, served.id, 0, "main", 0, exit_code=1)) \
        and report.retried
    if waited_hours:
        retry = store.read_attempt(store.r, served.id, 1) or pytest.fail()
        retry.created_ms = now_ms() - waited_hours * 3_600_000
        store.r.hset(keys.job_attempts(served.id), "1", json.dumps(retry.to_dict()))
    fresh = submit_job(store, "bob", config("fresh", gpus=4))
    blocker = submit_job(store, "carol", {**config("blocker", gpus=4), "jobPriorityClass": "prod"})

    scheduler.task_ended(served.id, 0, "main", 0)  # frees the GPUs: the prod job takes them

    assert store.get_tasks(blocker.id, 0)[0].state == TaskState.LAUNCHING
    ids = {served.id: "served", fresh.id: "fresh"}
    assert [ids[i] for i in store.r.zrange(keys.vc_queue("default"), 0, -1)] == order


def agent_node(store: Store, name: str) -> None:
    """A node as its agent keeps it: a lease claimed and renewed by both roles, READY."""
    add_node(store, name)
    for role in (Role.MONITOR, Role.LAUNCHER):
        holder = Holder(node=name, engine=f"engine-{name}", role=role, instance=role.value,
                        pid=1)
        assert leases.claim(store, holder, ip="127.0.0.1", peer="", lease_ms=30_000,
                            grace_ms=10_000, renew_ms=5_000, live_ms=60_000).claim.value == \
            "TAKEN"
        leases.renew(store, holder, live_ms=60_000, phase=Phase.READY if
                     role == Role.MONITOR else None, problem="" if role == Role.MONITOR else None)


def test_a_node_that_does_not_start_its_launches_is_marked_and_its_gang_placed_again(
        redis_server: str, store: Store, redis_client: redis.Redis) -> None:
    """A gray failure: the node renews its lease, but its launcher (stuck on a
    hung engine, say) does not start what it is sent. The first overdue
    launch is sent again and keeps the node from new work for the settling
    time; still not started a second lease after its placement, the task is
    the platform's failure and its job goes back to the queue, uncharged."""
    settings = Settings(redis_url=redis_server, node_lost_seconds=30,
                        launch_timeout_seconds=0.2, node_settle_seconds=30)
    scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
    agent_node(store, "stuck")
    scheduler.warden.round()
    submit_job(store, "alice", config("gang", retry=0))
    scheduler.run_pass()
    assert store.get_tasks("alice~gang", 0)[0].node == "stuck"

    deadline = now_ms() + 5_000
    while now_ms() < deadline and not redis_client.zrangebyscore(keys.LAUNCHING, 0, now_ms()):
        time.sleep(0.02)  # the launch lease (0.2 s) running out is what is tested
    scheduler.retry_stale_launches()
    lease = leases.read_lease(store.r, "stuck")
    assert lease is not None and "not started within" in lease.marked
    assert [m[0] for m in starts_sent(redis_client, "stuck")] == ["alice~gang"] * 2
    view = scheduler.warden.round()
    assert view.conditions["stuck"][0].value == "NOT_READY"

    deadline = now_ms() + 5_000
    while now_ms() < deadline and not redis_client.zrangebyscore(keys.LAUNCHING, 0, now_ms()):
        time.sleep(0.02)
    scheduler.retry_stale_launches()
    task = store.get_tasks("alice~gang", 0)[0]
    assert (task.state, task.platform_failure) == (TaskState.FAILED, True)
    job = store.get_job("alice~gang") or pytest.fail()
    assert (job.state, job.attempt, job.retries) == (JobState.WAITING, 1, 0)


def test_a_node_that_reports_a_problem_takes_no_work_in_the_very_next_pass(
        redis_server: str, store: Store) -> None:
    """The pass judges the nodes from their leases itself, with the rule the
    API shows them by: a node whose agent just reported a problem (its
    storage not mounted, say) gets nothing, before any repair round, and
    not when the API already shows it NOT_READY."""
    settings = Settings(redis_url=redis_server, node_lost_seconds=30, node_settle_seconds=0)
    scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
    agent_node(store, "bare")
    scheduler.warden.round()  # judged READY
    monitor = Holder(node="bare", engine="engine-bare", role=Role.MONITOR,
                     instance=Role.MONITOR.value, pid=1)
    leases.renew(store, monitor, live_ms=60_000, problem="storage is not mounted there")
    submit_job(store, "alice", config("anywhere", retry=0))

    assert scheduler.run_pass().placed == 0
    job = store.get_job("alice~anywhere") or pytest.fail()
    assert job.state == JobState.WAITING

    leases.renew(store, monitor, live_ms=60_000, problem="")  # mounted again
    assert scheduler.run_pass().placed == 1
    assert store.get_tasks("alice~anywhere", 0)[0].node == "bare"


def test_a_relaunched_task_gets_its_start_from_the_scheduler_once_it_launches(
        store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    """The scheduler is the one sender of starts: a task its role's
    taskRetryCount relaunched is started on its node when it still launches
    there; a late or repeated request for a task that moved on sends nothing."""
    add_node(store)
    job = submit_job(store, "alice", {**config("a"), "taskRoles": [{
        **config("a")["taskRoles"][0], "taskRetryCount": 1}]})
    scheduler.run_pass()
    mark_task_running(store, job.id, 0, "main", 0, "c1")
    report = record_task_exit(store, job.id, 0, "main", 0, exit_code=3)
    assert report is not None and report.relaunched
    # it relaunches on its allocation: the exit freed nothing
    assert store.get_allocations(store.r, "n1").keys() == {f"{job.id}:0:main:0"}
    before = len(starts_sent(redis_client, "n1"))

    scheduler.send_relaunch(job.id, 0, "main", 0)

    assert starts_sent(redis_client, "n1")[before:] == [[job.id, 0, "main", 0]]
    mark_task_running(store, job.id, 0, "main", 0, "c2")
    scheduler.send_relaunch(job.id, 0, "main", 0)  # repeated, late: the task runs already
    assert len(starts_sent(redis_client, "n1")) == before + 1
