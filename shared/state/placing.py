"""Binding placed gangs: allocations on their nodes, tasks LAUNCHING, jobs
out of the queue, each gang all or nothing.

`commit_placement` binds one gang under WATCH; `commit_placements` (and
`CommitStream`, fed while the pass decides) binds a pass's gangs in batches
of two round trips (the tasks read, then one script that checks
each gang again and writes it or not). Both refuse a gang the world moved
away from since the pass read it (a new version, a cordon, a GPU marked
unhealthy, a node that no longer has room): the next pass decides it again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from shared.domain import gpuhealth
from shared.domain.cluster import placement_fits
from shared.domain.models import (
    Allocation,
    Node,
    Task,
    TaskPlacement,
    attempt_task_key,
    task_key,
)
from shared.domain.states import LIVE_JOB_STATES, JobState, TaskState
from shared.infra.clock import now_ms
from shared.state import gpufaults, keys, scripts
from shared.state.lifecycle import move_task
from shared.state.store import (
    EVENTS_MAX_LEN,
    Pipe,
    Store,
    StoreError,
    event_fields,
    plain_json,
)


def _bind_task(task: Task, placement: TaskPlacement, launched_ms: int) -> bool:
    """A waiting task takes its place (LAUNCHING on the placement's node, GPUs
    and ports); False, leaving it as it is, when it no longer waits. Both
    commit paths (one gang, a batch) bind a task by this one rule."""
    if task.state != TaskState.WAITING:
        return False
    move_task(task, TaskState.LAUNCHING)
    task.node, task.ip, task.gpus, task.ports = \
        placement.node, placement.ip, list(placement.gpus), placement.ports
    task.launched_ms = task.placed_ms = launched_ms
    return True


def commit_placement(
    store: Store, job_id: str, *, version: int, attempt: int,
    placements: Sequence[TaskPlacement], launch_deadline_ms: int, mode: str = "",
    gang: bool = True,
) -> bool:
    """Bind a gang: allocations on the nodes, tasks LAUNCHING, job dequeued.

    Commits only if the job is the one the placement was computed for (same
    version, still WAITING), the placement covers every task, no admin holds
    any of its nodes (cordon, drain: a node's entry in NODE_FLAGS), and what
    the nodes hold now leaves room for it: a pass that overlapped another (its
    lock expired) can never hand out a GPU or port twice, nor a GPU its
    monitor marked unhealthy since the pass read the faults.

    `gang` False (a job without gang allocation): the placement may cover
    some of the tasks still waiting, and the job may already run (its
    first tasks started); it must still be queued and not being preempted.
    It leaves the queue once no task of the attempt waits. Every task is
    placed at most once: each must still be WAITING, under the same WATCH.
    """
    job_key = keys.job(job_id)
    node_keys = sorted({keys.node_alloc(p.node) for p in placements})

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        if job is None or job.version != version or job.attempt != attempt:
            return False
        if gang and job.state != JobState.WAITING:
            return False
        if not gang and (job.state not in LIVE_JOB_STATES or job.preempted_by
                         or pipe.zscore(keys.QUEUE, job_id) is None):
            return False
        tasks = store.read_tasks(pipe, job_id, attempt)
        placed = {task_key(p.role, p.index) for p in placements}
        if not placements or len(placed) != len(placements) or not placed <= set(tasks) \
                or (gang and placed != set(tasks)):
            return False
        if not _nodes_still_take(store, pipe, placements):
            return False
        launched = now_ms()
        changed = []
        for p in placements:
            task = tasks[task_key(p.role, p.index)]
            if not _bind_task(task, p, launched):
                return False
            changed.append(task)
        previous = store.bump(job)
        job.waiting_reason, job.waiting, job.mode = "", "", mode
        left = sum(t.state == TaskState.WAITING for t in tasks.values())
        pipe.multi()
        for p in placements:
            store.write_allocation(pipe, Allocation(
                job_id=job_id, attempt=attempt, role=p.role, index=p.index, node=p.node,
                gpus=p.gpus, cpus=p.cpus, memory_mb=p.memory_mb, ports=p.all_ports,
                vc=job.virtual_cluster))
            pipe.zadd(keys.LAUNCHING,
                      {attempt_task_key(job_id, attempt, p.role, p.index): launch_deadline_ms})
        store.write_tasks(pipe, job_id, attempt, changed)
        if not left:
            store.dequeue(pipe, job_id, job.virtual_cluster)
        store.write_job(pipe, job, previous)
        # Where each task went: the job's history, and what an audit of
        # GPUs and ports held at once reads (tests/chaos).
        store.add_event(pipe, job_id, "placed", attempt=attempt, waiting=left,
                        nodes=sorted({p.node for p in placements}), mode=mode,
                        tasks=[{"role": p.role, "index": p.index, "node": p.node,
                                "gpus": list(p.gpus), "ports": list(p.all_ports)}
                               for p in placements])
        return True

    return store.transact(decide, job_key, keys.NODE_FLAGS, keys.GPU_FAULTS, *node_keys)


def _nodes_still_take(store: Store, pipe: Pipe, placements: Sequence[TaskPlacement]) -> bool:
    """The placement's nodes, as they are now, take it: no admin holds one
    (cordon, drain), none of its GPUs was marked unhealthy since the pass
    read the faults, and each node has room beside what it holds."""
    nodes = sorted({p.node for p in placements})
    if any(pipe.hmget(keys.NODE_FLAGS, nodes)):
        return False
    if gpuhealth.faulty_in(placements, gpufaults.read_faults(pipe)):
        return False
    for name in nodes:
        raw = pipe.get(keys.node(name))
        node = Node.from_dict(json.loads(raw)) if raw else None
        held = store.get_allocations(pipe, name).values()
        if node is None or not placement_fits(node, held,
                                              [p for p in placements if p.node == name]):
            return False
    return True


@dataclass(frozen=True)
class PlacementCommit:
    """One gang a pass placed, with what the pass read of its job (version,
    attempt, queue_seq, VC): what `commit_placements` binds, if it still can."""

    job_id: str
    version: int
    attempt: int
    placements: tuple[TaskPlacement, ...]
    mode: str = ""
    queue_seq: int = field(kw_only=True)
    vc: str = field(kw_only=True)


MAX_BATCH_TASKS = 1000  # tasks per script call: Redis runs nothing else meanwhile
# The script's ARGV before the records the entries name (scripts.COMMIT_PLACEMENTS)
FIXED_ARGS = len(scripts.COMMIT_PLACEMENTS.args) - 1


class _ScriptKeys:
    """The KEYS of one script call, each named once, by position (1-based)."""

    def __init__(self, *fixed: str) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        for name in fixed:
            self.at(name)

    def at(self, name: str) -> int:
        if name not in self._index:
            self.names.append(name)
            self._index[name] = len(self.names)
        return self._index[name]


def _placement_entry(commit: PlacementCommit, raw_tasks: dict[str, str],
                     script_keys: _ScriptKeys,
                     parsed: dict[str, Task], records: list[str]) -> list[Any] | None:
    """What the batch script checks and writes for one gang: the job as the
    pass read it (the script compares it with the record), the tasks as just
    read (the rules of `commit_placement`); None when they already refuse it.
    `parsed` keeps task records parsed in this batch by their text (waiting
    tasks of the same role and index read alike)."""
    placements = commit.placements
    if not placements or {task_key(p.role, p.index) for p in placements} != set(raw_tasks):
        return None
    tasks = {}
    for key, raw in raw_tasks.items():
        known = parsed.get(raw)
        if known is None:
            known = parsed[raw] = Task.from_dict(json.loads(raw))
        tasks[key] = Task(**vars(known))  # a copy: its fields are replaced, not changed
    launched = now_ms()
    new: list[str | int] = []  # flat: task field, its record's position in ARGV
    for p in placements:
        task = tasks[task_key(p.role, p.index)]
        if not _bind_task(task, p, launched):
            return None
        new += [task.key, _argv_position(records, _record_json(task))]
    job_id, attempt, vc = commit.job_id, commit.attempt, commit.vc
    parts: dict[str, list[Any]] = {}  # node -> its part of the entry
    placed_tasks = []
    for p in placements:
        ports = p.all_ports
        alloc = Allocation(job_id=job_id, attempt=attempt, role=p.role, index=p.index,
                           node=p.node, gpus=p.gpus, cpus=p.cpus, memory_mb=p.memory_mb,
                           ports=ports, vc=vc)
        part = parts.get(p.node)
        if part is None:  # name, its keys, GPUs, ports, CPUs, memory, allocations
            part = parts[p.node] = [p.node, script_keys.at(keys.node(p.node)),
                                    script_keys.at(keys.node_alloc(p.node)), [], [], 0, 0, []]
        part[3] += p.gpus
        part[4] += ports
        part[5] += p.cpus
        part[6] += p.memory_mb
        part[7] += [alloc.key, _argv_position(records, _record_json(alloc))]
        placed_tasks.append({"role": p.role, "index": p.index, "node": p.node,
                             "gpus": list(p.gpus), "ports": list(ports)})
    event = event_fields("placed", attempt=attempt, nodes=sorted(parts), mode=commit.mode,
                         tasks=placed_tasks)
    # the layout scripts.COMMIT_PLACEMENTS reads (its comment): arrays, not objects
    return [
        script_keys.at(keys.job(job_id)), script_keys.at(keys.job_tasks(job_id, attempt)),
        script_keys.at(keys.job_events(job_id)), script_keys.at(keys.vc_queue(vc)),
        job_id, str(commit.version), str(commit.queue_seq), str(attempt), vc, len(raw_tasks),
        new,
        ["version", str(commit.version + 1), "waiting_reason", "", "waiting", "",
         "mode", commit.mode],
        [x for item in event.items() for x in item],
        list(parts.values()),
    ]


def _argv_position(records: list[str], record: str) -> int:
    """Pass `record` to the batch script after its fixed arguments: its
    position in ARGV (1-based)."""
    records.append(record)
    return len(records) + FIXED_ARGS


def _record_json(record: Task | Allocation) -> str:
    """`json.dumps(record.to_dict())`, without `dataclasses.asdict`'s deep copy
    (a third of a big batch's CPU): their fields are plain JSON values, so the
    text is the same (tests/unit/test_placement_batch.py holds it so)."""
    return plain_json(vars(record))


def commit_placements(store: Store, commits: Sequence[PlacementCommit], *,
                      launch_deadline_ms: int) -> list[bool]:
    """Bind many gangs at once, each as `commit_placement` binds one: True for
    each one bound, False for each the world moved away from (the next pass
    decides it again). Two round trips per MAX_BATCH_TASKS tasks: the jobs'
    tasks read, then one script that re-checks them, and the nodes, and
    applies each gang's writes or none of them."""
    stream = CommitStream(store, launch_deadline_ms=launch_deadline_ms)
    for commit in commits:
        stream.add(commit)
    return stream.finish()


class CommitStream:
    """`commit_placements` fed one gang at a time, while its caller is still
    deciding the rest (the scheduler's plan hands over each placement as it
    makes it: services/scheduler/policy.py `plan`).

    A full batch (MAX_BATCH_TASKS tasks) goes at once to two threads of its
    own: one reads its jobs' tasks and renders its entries, the other runs
    the batches' scripts on Redis, in batch order. So Redis binds the first
    batches while the caller decides the next ones, and renders while Redis
    runs a script: at scale the three are of a size, and Redis and the
    scheduler have a core each. A batch's script re-checks all it relies on,
    as it would one round trip later. A commit that never fills a batch is
    bound in the caller's thread at `finish`, without threads.

    `finish` must be called (it also ends the threads): the answers, one per
    gang in the order added. A script that raised fails the batches after
    it, unrun, and `finish` raises."""

    def __init__(self, store: Store, *, launch_deadline_ms: int) -> None:
        self._store = store
        self._deadline = launch_deadline_ms
        self._batch: list[PlacementCommit] = []
        self._tasks = 0  # in self._batch
        self._pending: list[Future[list[bool]]] = []
        self._renderer: ThreadPoolExecutor | None = None
        self._runner: ThreadPoolExecutor | None = None
        self._failed = threading.Event()

    def add(self, commit: PlacementCommit) -> None:
        """One more gang, bound after those added before it (a gang bigger
        than a batch goes alone in its own)."""
        if self._batch and self._tasks + len(commit.placements) > MAX_BATCH_TASKS:
            self._send()
        self._batch.append(commit)
        self._tasks += len(commit.placements)

    def finish(self) -> list[bool]:
        """Whether each gang was bound, once every batch is."""
        try:
            if not self._pending:  # at most one batch: no threads
                batch, self._batch = self._batch, []
                return _apply_batch(self._store, self._prepare(batch)) if batch else []
            if self._batch:
                self._send()
            return [bound for done in self._pending for bound in done.result()]
        finally:
            for executor in (self._renderer, self._runner):
                if executor is not None:
                    executor.shutdown(cancel_futures=True)

    def _send(self) -> None:
        if self._failed.is_set():  # a batch failed (`finish` raises): the rest is not run
            self._batch, self._tasks = [], 0
            return
        if self._renderer is None or self._runner is None:
            self._renderer = ThreadPoolExecutor(1, thread_name_prefix="pai-render")
            self._runner = ThreadPoolExecutor(1, thread_name_prefix="pai-commit")
        batch, self._batch, self._tasks = self._batch, [], 0
        prepared = self._renderer.submit(self._prepare, batch)
        self._pending.append(self._runner.submit(self._apply, prepared))

    def _prepare(self, batch: list[PlacementCommit]) -> _Prepared:
        return _prepare_batch(batch, _read_tasks(self._store, batch), self._deadline)

    def _apply(self, prepared: Future[_Prepared]) -> list[bool]:
        if self._failed.is_set():
            raise StoreError("an earlier batch of this commit failed")
        try:
            return _apply_batch(self._store, prepared.result())
        except BaseException:
            self._failed.set()
            raise


@dataclass
class _Prepared:
    """A batch rendered for the script: its KEYS, ARGV and where each job's
    answer is in the reply (None: refused before the script)."""

    script_keys: list[str]
    args: list[str]
    positions: list[int | None]


def _read_tasks(store: Store, batch: Sequence[PlacementCommit]) -> list[dict[str, str]]:
    return store.read_hashes([keys.job_tasks(c.job_id, c.attempt) for c in batch])


def _prepare_batch(batch: Sequence[PlacementCommit], read: Sequence[dict[str, str]],
                   launch_deadline_ms: int) -> _Prepared:
    script_keys = _ScriptKeys(keys.NODE_FLAGS, keys.LAUNCHING, keys.QUEUE, keys.GPU_FAULTS)
    entries: list[list[Any]] = []
    positions: list[int | None] = []
    parsed: dict[str, Task] = {}
    records: list[str] = []  # the records the entries write, passed beside them
    for commit, raw_tasks in zip(batch, read, strict=True):
        entry = _placement_entry(commit, raw_tasks, script_keys, parsed, records)
        positions.append(len(entries) if entry is not None else None)
        if entry is not None:
            entries.append(entry)
    args = [plain_json(entries), str(EVENTS_MAX_LEN), JobState.WAITING.value,
            str(launch_deadline_ms), *records] \
        if entries else []
    return _Prepared(script_keys.names, args, positions)


def _apply_batch(store: Store, prepared: _Prepared) -> list[bool]:
    if not prepared.args:  # every job already refused
        return [False] * len(prepared.positions)
    reply = store.run_script(scripts.COMMIT_PLACEMENTS, prepared.script_keys, prepared.args)
    return [at is not None and bool(reply[at]) for at in prepared.positions]
