"""Batched placement commits (`commit_placements`) on a real Redis.

A pass binds all its gangs in one script call; each gang is still its own
compare-and-set. These tests change the world between the pass's decision
and the script (tests/support/interleave.py), and check that exactly the
gangs it no longer allows are left out, and that a batch of one decides as
`commit_placement` does on every case that one refuses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from services.scheduler import policy
from services.scheduler.gate import DIRTY
from services.scheduler.service import Scheduler
from shared.domain.gpuhealth import GpuFault
from shared.domain.models import Gpu, Job, Node, TaskPlacement
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys, placing
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.gpufaults import mark_fault
from shared.state.lifecycle import request_stop, set_waiting_many, submit_job
from shared.state.placing import (
    CommitStream,
    PlacementCommit,
    commit_placement,
    commit_placements,
)
from shared.state.starts import StartRef, parse
from shared.state.store import Store
from tests.support.interleave import Hook, with_hooks
from tests.support.redis_server import operator_url

DEADLINE_MS = 2**41


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def other(redis_server: str) -> Iterator[Store]:
    """Another service's (or scheduler replica's) own connection."""
    other = Store.from_url(redis_server)
    yield other
    other.r.close()


def add_node(store: Store, name: str, gpus: int = 8, cpus: int = 16,
             memory_mb: int = 32_000) -> None:
    store.register_node(Node(name, "127.0.0.1", cpus=cpus, memory_mb=memory_mb,
                             gpus=[Gpu(i) for i in range(gpus)], port_range=(20000, 20100)))


def config(name: str, tasks: int = 1) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox",
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": 1, "command": "true"}]}


def on(node: str, gpu: int, index: int = 0, cpus: int = 1, memory_mb: int = 128,
       port: int | None = None) -> TaskPlacement:
    return TaskPlacement(role="main", index=index, node=node, ip="127.0.0.1", gpus=(gpu,),
                         cpus=cpus, memory_mb=memory_mb,
                         ports={"default": [port if port is not None else 20000 + gpu]})


def commit_of(job: Job, *placements: TaskPlacement) -> PlacementCommit:
    return PlacementCommit(job.id, job.version, job.attempt, tuple(placements),
                           queue_seq=job.queue_seq, vc=job.virtual_cluster)


def held(store: Store, node: str) -> dict[str, tuple[int, ...]]:
    """Allocation key -> GPUs, of what the node holds."""
    return {k: a.gpus for k, a in store.get_allocations(store.r, node).items()}


def task_state(store: Store, job_id: str) -> TaskState:
    return store.get_tasks(job_id, 0)[0].state


def test_a_batch_binds_every_gang_that_still_fits(store: Store) -> None:
    add_node(store, "n1")
    add_node(store, "n2")
    a = submit_job(store, "alice", config("a"))
    gang = submit_job(store, "alice", config("gang", tasks=3))
    bound = commit_placements(store, [
        commit_of(a, on("n1", 0)),
        commit_of(gang, on("n1", 1, 0), on("n2", 0, 1), on("n2", 1, 2)),
    ], launch_deadline_ms=DEADLINE_MS)

    assert bound == [True, True]
    assert held(store, "n1") == {"alice~a:0:main:0": (0,), "alice~gang:0:main:0": (1,)}
    assert held(store, "n2") == {"alice~gang:0:main:1": (0,), "alice~gang:0:main:2": (1,)}
    assert [t.state for t in store.get_tasks(gang.id, 0)] == [TaskState.LAUNCHING] * 3
    assert [t.node for t in store.get_tasks(gang.id, 0)] == ["n1", "n2", "n2"]
    assert store.queued_job_ids() == []
    assert store.r.zrange(keys.vc_queue("default"), 0, -1) == []
    assert store.r.zscore(keys.LAUNCHING, "alice~gang:0:main:2") == DEADLINE_MS
    placed = store.get_job(gang.id) or pytest.fail()
    assert (placed.state, placed.version) == (JobState.WAITING, gang.version + 1)
    [event] = [e for e in store.get_events(gang.id) if e["kind"] == "placed"]
    assert event["nodes"] == ["n1", "n2"]
    assert event["tasks"][1] == {"role": "main", "index": 1, "node": "n2", "gpus": [0],
                                 "ports": [20000]}


def test_within_a_batch_the_first_gang_wins_a_contested_gpu(store: Store) -> None:
    add_node(store, "n1")
    first = submit_job(store, "alice", config("first"))
    second = submit_job(store, "alice", config("second"))
    third = submit_job(store, "alice", config("third"))
    bound = commit_placements(store, [commit_of(first, on("n1", 3)),
                                      commit_of(second, on("n1", 3, port=20050)),
                                      commit_of(third, on("n1", 4, port=20003))],
                              launch_deadline_ms=DEADLINE_MS)
    assert bound == [True, False, False]  # the third asked for the first's port
    assert held(store, "n1") == {"alice~first:0:main:0": (3,)}
    assert task_state(store, second.id) == task_state(store, third.id) == TaskState.WAITING
    assert store.queued_job_ids() == [second.id, third.id]


def test_what_changed_between_decide_and_commit_loses_and_the_rest_is_bound(
        store: Store, other: Store, redis_client: redis.Redis) -> None:
    """Threat (a GPU given twice, a stopped job started): after the batch read
    its jobs, another writer stops one, a second scheduler places another job
    on the GPU one gang wants and places one of the batch's jobs itself, and
    an admin cordons a node. Each of those four gangs is left out of the
    commit; the one nothing touched is bound."""
    add_node(store, "n1")
    add_node(store, "n2")
    jobs = {name: submit_job(store, "alice", config(name))
            for name in ("kept", "stopped", "outbid", "cordoned", "taken", "intruder")}
    batch = [commit_of(jobs["kept"], on("n1", 0)), commit_of(jobs["stopped"], on("n1", 1)),
             commit_of(jobs["outbid"], on("n1", 2)), commit_of(jobs["cordoned"], on("n2", 0)),
             commit_of(jobs["taken"], on("n1", 3))]

    def meanwhile() -> None:
        request_stop(other, jobs["stopped"].id)
        intruder, taken = jobs["intruder"], jobs["taken"]
        assert commit_placement(other, intruder.id, version=intruder.version, attempt=0,
                                placements=[on("n1", 2, port=20060)],
                                launch_deadline_ms=DEADLINE_MS)
        assert commit_placement(other, taken.id, version=taken.version, attempt=0,
                                placements=[on("n1", 4)], launch_deadline_ms=DEADLINE_MS)
        other.set_node_flags("n2", schedulable=False, reason="fans", by="root")

    hook = Hook("before-write", keys.job(jobs["kept"].id), meanwhile)
    racing = Store(with_hooks(redis_client, hook))

    bound = commit_placements(racing, batch, launch_deadline_ms=DEADLINE_MS)

    assert hook.fired
    assert bound == [True, False, False, False, False]
    assert held(store, "n1") == {"alice~kept:0:main:0": (0,), "alice~intruder:0:main:0": (2,),
                                 "alice~taken:0:main:0": (4,)}
    assert held(store, "n2") == {}
    assert task_state(store, jobs["kept"].id) == TaskState.LAUNCHING
    assert task_state(store, jobs["stopped"].id) == TaskState.STOPPED
    assert task_state(store, jobs["outbid"].id) == TaskState.WAITING
    assert task_state(store, jobs["cordoned"].id) == TaskState.WAITING
    assert store.get_tasks(jobs["taken"].id, 0)[0].gpus == [4]  # the other scheduler's
    assert store.queued_job_ids() == [jobs["outbid"].id, jobs["cordoned"].id]
    for name in ("stopped", "outbid", "cordoned", "taken"):
        placed_events = [e for e in store.get_events(jobs[name].id) if e["kind"] == "placed"]
        assert len(placed_events) == (1 if name == "taken" else 0)


def test_a_pass_sends_starts_only_for_what_it_bound_one_message_per_node(
        store: Store, other: Store, redis_server: str, redis_client: redis.Redis) -> None:
    add_node(store, "n1", gpus=2)
    add_node(store, "n2", gpus=2)
    names = ("a", "b", "c", "d")
    jobs = {n: submit_job(store, "alice", config(n)) for n in names}
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    # after the pass decided, before its commit (the only write of a's events)
    hook = Hook("before-write", keys.job_events(jobs["a"].id),
                lambda: request_stop(other, jobs["c"].id))
    scheduler = Scheduler(settings, Store(with_hooks(redis_client, hook)),
                          Messenger(make_celery(settings)))

    stats = scheduler.run_pass()

    assert hook.fired
    assert stats.placed == 3
    assert redis_client.get(DIRTY) == "1"  # a gang lost: the next pass looks again
    started: list[StartRef] = []
    for node in ("n1", "n2"):
        entries = redis_client.xrange(keys.node_starts(node))
        assert len(entries) == 1  # one per node
        started += parse(*entries[0]).tasks
    assert sorted(t[0] for t in started) == ["alice~a", "alice~b", "alice~d"]
    assert task_state(store, jobs["c"].id) == TaskState.STOPPED
    assert all(not k.startswith("alice~c") for n in ("n1", "n2") for k in held(store, n))


# ------------------------------------- a batch of one decides as commit_placement


@dataclass(frozen=True)
class Case:
    """A world and a placement against it; whether it may be bound."""

    name: str
    placements: Callable[[Job], list[TaskPlacement]]
    binds: bool
    prepare: Callable[[Store, Job], Job] = lambda store, job: job
    tasks: int = 1


def hold(store: Store, gpu: int, port: int, cpus: int = 1, memory_mb: int = 128) -> None:
    """Another job holds this on n1."""
    intruder = submit_job(store, "bob", config(f"holder-{gpu}-{port}-{cpus}-{memory_mb}"))
    assert commit_placement(store, intruder.id, version=intruder.version, attempt=0,
                            placements=[on("n1", gpu, cpus=cpus, memory_mb=memory_mb,
                                           port=port)], launch_deadline_ms=DEADLINE_MS)


def stale(job: Job) -> Job:
    job.version -= 1
    return job


def bumped(store: Store, job: Job) -> Job:
    set_waiting_many(store, [(job.id, "no room", "{}", job.version)])  # not a version change
    return job


CASES = [
    Case("fits", lambda j: [on("n1", 0)], True),
    Case("a gang across two nodes", lambda j: [on("n1", 0, 0), on("n2", 0, 1)], True, tasks=2),
    Case("a waiting reason written meanwhile", lambda j: [on("n1", 0)], True, bumped),
    Case("stale version", lambda j: [on("n1", 0)], False, lambda s, j: stale(j)),
    Case("another attempt", lambda j: [on("n1", 0)], False,
         lambda s, j: Job(**{**vars(j), "attempt": 1})),
    Case("stopped", lambda j: [on("n1", 0)], False,
         lambda s, j: request_stop(s, j.id)),
    Case("a GPU held", lambda j: [on("n1", 0)], False,
         lambda s, j: (hold(s, 0, 20090), j)[1]),
    Case("a port held", lambda j: [on("n1", 1, port=20090)], False,
         lambda s, j: (hold(s, 0, 20090), j)[1]),
    Case("too few CPUs left", lambda j: [on("n1", 1, cpus=2)], False,
         lambda s, j: (hold(s, 0, 20090, cpus=15), j)[1]),
    Case("too little memory left", lambda j: [on("n1", 1, memory_mb=2_000)], False,
         lambda s, j: (hold(s, 0, 20090, memory_mb=31_000), j)[1]),
    Case("exactly the CPUs and memory left", lambda j: [on("n1", 1, cpus=15, memory_mb=31_872)],
         True, lambda s, j: (hold(s, 0, 20090), j)[1]),
    Case("a GPU the node lacks", lambda j: [on("n1", 8)], False),
    Case("one GPU twice in a gang", lambda j: [on("n1", 0, 0), on("n1", 0, 1, port=20050)],
         False, tasks=2),
    Case("one port twice in a gang", lambda j: [on("n1", 0, 0), on("n1", 1, 1, port=20000)],
         False, tasks=2),
    Case("part of a gang", lambda j: [on("n1", 0, 0)], False, tasks=2),
    Case("a task the job lacks", lambda j: [on("n1", 0, 0), on("n1", 1, 1)], False),
    Case("a node that never reported", lambda j: [on("n9", 0)], False),
    Case("a cordoned node", lambda j: [on("n2", 0)], False,
         lambda s, j: (s.set_node_flags("n2", schedulable=False, by="root"), j)[1]),
    Case("a draining node", lambda j: [on("n1", 0)], False,
         lambda s, j: (s.set_node_flags("n1", drain=True, by="root"), j)[1]),
    Case("no placements", lambda j: [], False),
    Case("a GPU marked unhealthy meanwhile", lambda j: [on("n1", 0)], False,
         lambda s, j: (mark_fault(s.r, GpuFault("n1", 0, "XID 79", 1)), j)[1]),
    Case("another GPU of the node unhealthy", lambda j: [on("n1", 1)], True,
         lambda s, j: (mark_fault(s.r, GpuFault("n1", 0, "XID 79", 1)), j)[1]),
]


def commit_alone(store: Store, job: Job, placements: list[TaskPlacement]) -> bool:
    return commit_placement(store, job.id, version=job.version, attempt=job.attempt,
                            placements=placements, launch_deadline_ms=DEADLINE_MS)


def commit_batched(store: Store, job: Job, placements: list[TaskPlacement]) -> bool:
    [bound] = commit_placements(store, [commit_of(job, *placements)],
                                launch_deadline_ms=DEADLINE_MS)
    return bound


def outcome(store: Store, job_id: str) -> tuple[Any, ...]:
    """What a commit leaves behind, minus clocks."""
    job = store.get_job(job_id) or pytest.fail()
    tasks = [(t.state, t.node, t.gpus, t.ports) for t in store.get_tasks(job_id, 0)]
    nodes = {n: held(store, n) for n in ("n1", "n2")}
    return (job.state, job.version, job.waiting_reason, tasks, nodes,
            store.queued_job_ids(), store.r.zrange(keys.LAUNCHING, 0, -1))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_batch_of_one_decides_as_commit_placement(
        case: Case, store: Store, redis_server: str, redis_client: redis.Redis) -> None:
    results = []
    for commit in (commit_alone, commit_batched):
        with redis.Redis.from_url(operator_url(redis_server)) as operator:
            operator.flushdb()  # the same world for both
        add_node(store, "n1")
        add_node(store, "n2")
        job = submit_job(store, "alice", config("j", tasks=case.tasks))
        decided_on = case.prepare(store, job)
        bound = commit(store, decided_on, case.placements(job))
        results.append((bound, outcome(store, job.id)))
    assert results[0][0] is case.binds
    assert results[1] == results[0]


def test_a_node_already_overcommitted_takes_nothing_more(store: Store,
                                                         redis_client: redis.Redis) -> None:
    """What `placement_fits` refuses (a GPU held twice, say, after a node came
    back with fewer GPUs) the batch refuses too, for every gang on that node."""
    add_node(store, "n1")
    first = submit_job(store, "alice", config("first"))
    assert commit_placements(store, [commit_of(first, on("n1", 7))],
                             launch_deadline_ms=DEADLINE_MS) == [True]
    add_node(store, "n1", gpus=4)  # re-registered: GPU 7 is gone
    job = submit_job(store, "alice", config("next"))
    assert commit_placements(store, [commit_of(job, on("n1", 0))],
                             launch_deadline_ms=DEADLINE_MS) == [False]
    assert not commit_placement(store, job.id, version=job.version, attempt=0,
                                placements=[on("n1", 0)], launch_deadline_ms=DEADLINE_MS)


def test_a_big_batch_is_split_and_later_chunks_see_earlier_ones(store: Store) -> None:
    for n in range(3):
        add_node(store, f"n{n}", gpus=3000, cpus=10_000, memory_mb=10_000_000)
    jobs = [submit_job(store, "alice", config(f"j{i}", tasks=4)) for i in range(701)]
    commits = [commit_of(job, *(on(f"n{i % 3}", 4 * i + t, t, port=30000 + 4 * i + t)
                                for t in range(4)))
               for i, job in enumerate(jobs[:700])]
    # the last gang (a later chunk) asks for the first gang's GPU 0 on n0
    commits.append(commit_of(jobs[700], *(on("n0", t * 3, t, port=40000 + t)
                                          for t in range(4))))
    bound = commit_placements(store, commits, launch_deadline_ms=now_ms() + 60_000)
    assert bound == [True] * 700 + [False]
    assert sum(len(held(store, f"n{n}")) for n in range(3)) == 2800


def test_a_gang_of_thousands_of_tasks_is_bound_whole(store: Store) -> None:
    """More tasks than one script call can pass to a single command."""
    add_node(store, "big", gpus=0, cpus=10_000, memory_mb=10_000_000)
    job = submit_job(store, "alice", {"jobName": "huge", "image": "busybox", "taskRoles": [{
        "name": "main", "taskNumber": 4500, "cpuNumber": 1, "memoryMB": 128,
        "command": "true"}]})
    gang = tuple(TaskPlacement(role="main", index=i, node="big", ip="127.0.0.1", gpus=(),
                               cpus=1, memory_mb=128, ports={}) for i in range(4500))
    assert commit_placements(store, [commit_of(job, *gang)],
                             launch_deadline_ms=DEADLINE_MS) == [True]
    assert len(held(store, "big")) == 4500
    assert {t.state for t in store.get_tasks(job.id, 0)} == {TaskState.LAUNCHING}


def test_a_batch_of_two_vcs_takes_each_job_from_its_own_queue(store: Store) -> None:
    """The script gathers the batch's removals per queue: each bound job
    leaves the global queue and its own VC's, a refused one stays in both."""
    Accounts(store).put_vc(VirtualCluster("vision", 4))
    add_node(store, "n1")
    jobs = [submit_job(store, "alice", {**config(f"j{i}"), "virtualCluster": vc})
            for i, vc in enumerate(("default", "vision", "vision", "default"))]
    bound = commit_placements(store, [commit_of(jobs[0], on("n1", 0)),
                                      commit_of(jobs[1], on("n1", 1)),
                                      commit_of(jobs[2], on("n1", 0, port=20070)),  # taken
                                      commit_of(jobs[3], on("n1", 2))],
                              launch_deadline_ms=DEADLINE_MS)
    assert bound == [True, True, False, True]
    assert store.queued_job_ids() == [jobs[2].id]
    assert store.r.zrange(keys.vc_queue("default"), 0, -1) == []
    assert store.r.zrange(keys.vc_queue("vision"), 0, -1) == [jobs[2].id]
    assert store.r.zrange(keys.LAUNCHING, 0, -1, withscores=True) == [
        (f"{job.id}:0:main:0", DEADLINE_MS) for job in sorted(
            (jobs[0], jobs[1], jobs[3]), key=lambda job: f"{job.id}:0:main:0")]


def test_a_gang_on_more_nodes_than_one_call_names_is_refused_for_its_last_nodes_hold(
        store: Store) -> None:
    """The admins' holds are read for a batch's nodes in calls of a thousand:
    a hold on the 1,201st node of a gang still refuses the whole gang."""
    names = [f"n{i:04d}" for i in range(1201)]
    for name in names:
        add_node(store, name, gpus=1)
    gang = submit_job(store, "alice", config("wide", tasks=len(names)))
    placements = tuple(on(name, 0, index) for index, name in enumerate(names))
    store.set_node_flags(names[-1], schedulable=False, reason="fans", by="root")
    assert commit_placements(store, [commit_of(gang, *placements)],
                             launch_deadline_ms=DEADLINE_MS) == [False]
    assert held(store, names[0]) == {}
    store.set_node_flags(names[-1], schedulable=True, by="root")
    assert commit_placements(store, [commit_of(gang, *placements)],
                             launch_deadline_ms=DEADLINE_MS) == [True]
    assert held(store, names[-1]) == {f"{gang.id}:0:main:1200": (0,)}
    assert store.r.zcard(keys.LAUNCHING) == len(names)


def test_a_commit_must_name_the_jobs_own_queue_place_and_vc(store: Store) -> None:
    """The script compares what the pass read (queue_seq, VC) with the record:
    a commit decided on another submission of the same name, or naming another
    VC's queue, binds nothing (it would leave the job queued somewhere)."""
    add_node(store, "n1")
    job = submit_job(store, "alice", config("a"))
    wrong = [PlacementCommit(job.id, job.version, 0, (on("n1", 0),), queue_seq=job.queue_seq,
                             vc="vision"),
             PlacementCommit(job.id, job.version, 0, (on("n1", 0),),
                             queue_seq=job.queue_seq + 1, vc=job.virtual_cluster)]
    assert commit_placements(store, wrong, launch_deadline_ms=DEADLINE_MS) == [False, False]
    assert held(store, "n1") == {}
    assert store.r.zrange(keys.vc_queue("default"), 0, -1) == [job.id]
    assert commit_placements(store, [commit_of(job, on("n1", 0))],
                             launch_deadline_ms=DEADLINE_MS) == [True]


def test_waiting_reasons_are_written_only_where_the_pass_saw_the_job(store: Store) -> None:
    """`set_waiting_many` writes each reason on set_waiting's terms: the job
    still WAITING at the version the pass read, and the reason new."""
    jobs = {name: submit_job(store, "alice", config(name))
            for name in ("moved", "stopped", "same", "new")}
    set_waiting_many(store, [(jobs["same"].id, "no room", "{}", jobs["same"].version)])
    request_stop(store, jobs["stopped"].id)
    written = set_waiting_many(store, [
        (jobs["moved"].id, "no room", "{}", jobs["moved"].version - 1),
        (jobs["stopped"].id, "no room", "{}", jobs["stopped"].version),
        (jobs["same"].id, "no room", "{}", jobs["same"].version),
        (jobs["new"].id, "no room", '{"reason":"NoNodes"}', jobs["new"].version),
        ("alice~gone", "no room", "{}", 1),
    ])
    assert written == 1
    reasons = {name: (store.get_job(job.id) or pytest.fail()).waiting_reason
               for name, job in jobs.items()}
    assert reasons == {"moved": "", "stopped": "", "same": "no room", "new": "no room"}
    assert (store.get_job(jobs["new"].id) or pytest.fail()).waiting == '{"reason":"NoNodes"}'
    assert not store.r.exists(keys.job("alice~gone"))  # no record made of a reason alone


# ------------------------------------------ a stream bound while the pass decides


def test_a_stream_binds_each_full_batch_while_it_is_still_fed(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing, "MAX_BATCH_TASKS", 1)
    add_node(store, "n1", gpus=2)
    first, second = (submit_job(store, "alice", config(n)) for n in ("a", "b"))
    events = keys.job_events(first.id)
    [(submitted, _)] = store.r.xrevrange(events, count=1)
    stream = CommitStream(store, launch_deadline_ms=DEADLINE_MS)
    stream.add(commit_of(first, on("n1", 0)))
    stream.add(commit_of(second, on("n1", 1)))  # the first batch is full: it goes

    # bound before `finish`: its "placed" event follows (a blocking read, no sleep)
    [(_, [(_, fields)])] = store.r.xread({events: submitted}, count=1, block=10_000)
    assert fields["kind"] == "placed"
    assert stream.finish() == [True, True]
    assert sorted(held(store, "n1").values()) == [(0,), (1,)]


def test_a_batch_that_fails_leaves_the_batches_after_it_unrun(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing, "MAX_BATCH_TASKS", 1)
    for name in ("n1", "n2", "n3"):
        add_node(store, name, gpus=1)
    jobs = [submit_job(store, "alice", config(n)) for n in ("a", "b", "c")]
    store.r.delete(keys.node("n2"))  # its script fails reading the node, before any write
    store.r.hset(keys.node("n2"), "not", "a node record")
    stream = CommitStream(store, launch_deadline_ms=DEADLINE_MS)
    for job, node in zip(jobs, ("n1", "n2", "n3"), strict=True):
        stream.add(commit_of(job, on(node, 0)))

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        stream.finish()
    assert task_state(store, jobs[0].id) == TaskState.LAUNCHING
    for job in jobs[1:]:  # the failed batch and the one after it: as they were
        assert task_state(store, job.id) == TaskState.WAITING
        assert store.r.zscore(keys.QUEUE, job.id) is not None
    assert held(store, "n3") == {}
    assert not [t for t in threading.enumerate() if t.name.startswith(("pai-render", "pai-commit"))]


def run_a_failing_pass(store: Store, redis_server: str, monkeypatch: pytest.MonkeyPatch,
                       before_raising: Callable[[Any], None] = lambda plan: None) -> None:
    """A pass whose plan raises after handing over all its placements
    (`before_raising` sees the plan first): the plan's error is the one
    raised, and the stream's threads end with the pass."""
    real_plan = policy.plan

    def failing_plan(*args: Any, **kwargs: Any) -> Any:
        before_raising(real_plan(*args, **kwargs))
        raise RuntimeError("the plan failed after placing")

    monkeypatch.setattr(policy, "plan", failing_plan)
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    with pytest.raises(RuntimeError, match="after placing"):
        Scheduler(settings, store, Messenger(make_celery(settings))).run_pass()
    assert not [t for t in threading.enumerate() if t.name.startswith(("pai-render", "pai-commit"))]


def test_a_plan_that_raises_ends_its_binding_threads_and_starts_what_it_bound(
        store: Store, redis_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing, "MAX_BATCH_TASKS", 1)
    add_node(store, "n1", gpus=2)
    jobs = [submit_job(store, "alice", config(n)) for n in ("a", "b")]

    run_a_failing_pass(store, redis_server, monkeypatch)

    # bound, with a launch deadline, and their starts sent
    [entry] = store.r.xrange(keys.node_starts("n1"))
    assert sorted(t[0] for t in parse(*entry).tasks) == [job.id for job in jobs]
    for job in jobs:
        assert task_state(store, job.id) == TaskState.LAUNCHING
        assert store.r.zscore(keys.LAUNCHING, f"{job.id}:0:main:0") is not None


def test_a_plan_that_raises_is_the_error_raised_when_its_binding_fails_too(
        store: Store, redis_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing, "MAX_BATCH_TASKS", 1)
    for name in ("n1", "n2"):
        add_node(store, name, gpus=1)
    for name in ("a", "b"):
        submit_job(store, "alice", config(name))

    def break_the_last_batch(plan: Any) -> None:
        # the last batch (sent when the stream finishes) fails reading its node
        node = plan.placed[-1].placements[0].node
        store.r.delete(keys.node(node))
        store.r.hset(keys.node(node), "not", "a node record")

    run_a_failing_pass(store, redis_server, monkeypatch, break_the_last_batch)


def test_a_pass_of_many_batches_binds_gangs_and_partial_jobs_and_starts_them_all(
        store: Store, redis_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placing, "MAX_BATCH_TASKS", 2)  # the gangs: three batches
    for name in ("n1", "n2"):
        add_node(store, name, gpus=4)
    gangs = [submit_job(store, "alice", config(f"g{i}", tasks=i + 1)) for i in range(3)]
    partial = submit_job(store, "bob", {**config("p", tasks=2),
                                        "extras": {"gangAllocation": False}})
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))

    stats = scheduler.run_pass()

    assert stats.placed == 4
    started = sorted(task for node in ("n1", "n2")
                     for entry in store.r.xrange(keys.node_starts(node))
                     for task in parse(*entry).tasks)
    assert started == sorted([(job.id, 0, "main", i) for job in (*gangs, partial)
                              for i in range(len(store.get_tasks(job.id, 0)))])
    for job in (*gangs, partial):
        assert {t.state for t in store.get_tasks(job.id, 0)} == {TaskState.LAUNCHING}
        assert store.r.zscore(keys.QUEUE, job.id) is None or job is partial
