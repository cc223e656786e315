"""Every state change of a job and its tasks, each one compare-and-set.

Each function reads the job (and the tasks of the attempt it touches) under
WATCH, decides with the pure rules (state tables, completion policy, retry
decision), and commits only if nothing it read changed meanwhile. So any
service may call them, on any node, as often as a message is redelivered:
a repeated call finds the work done and returns without writing.

Side effects (Celery sends, Docker calls) belong to the callers, after these
return.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain import gpuhealth
from shared.domain.cluster import placement_fits
from shared.domain.completion import NON_RETRYABLE_PREFIX, decide_retry, evaluate_completion
from shared.domain.models import (
    Allocation,
    Attempt,
    Job,
    JobSpec,
    Node,
    Task,
    TaskPlacement,
    attempt_task_key,
    job_id_of,
    parse_attempt_task_key,
    task_key,
)
from shared.domain.states import JobState, TaskState, check_task_move
from shared.infra.clock import now_ms
from shared.state import gpufaults, keys, retention, telemetry, usage
from shared.state.store import EVENTS_MAX_LEN, Expect, Pipe, Store, compact_json, event_fields

LIVE_JOB_STATES = (JobState.WAITING, JobState.RUNNING)
PASS_REQUEST_TTL_MS = 1000
# A task retry's launch lease when the caller names none: the scheduler sends
# the start again once it is over (retry_stale_launches)
RELAUNCH_LEASE_MS = 60_000


def initial_tasks(spec: JobSpec) -> list[Task]:
    return [Task(role=r.name, index=i) for r in spec.task_roles for i in range(r.task_number)]


def submit_job(store: Store, username: str, config: dict[str, Any], *,
               user_id: str = "") -> Job:
    """Store a validated config as a WAITING job with attempt 0 queued;
    `user_id` is the owner's immutable id (accounts.User.uid)."""
    return queue_new_job(store, username, config, user_id=user_id, request_pass=False).job


@dataclass(frozen=True)
class Queued:
    job: Job
    # This submit set the pass flag (see `claim_pass_request`): it sends the
    # scheduler its "schedule" message.
    pass_claimed: bool


def queue_new_job(store: Store, username: str, config: dict[str, Any], *,
                  user_id: str = "", request_pass: bool = True,
                  expectations: Sequence[Expect] = (), spec: JobSpec | None = None) -> Queued:
    """`submit_job`, and with `request_pass` the pass flag claimed in the
    same atomic write (one round trip: the API's submit path); nothing is
    written unless every expectation holds (ExpectationFailed). `spec`: the
    config's, when the caller made it already."""
    spec = spec if spec is not None else JobSpec.from_config(config)
    created = now_ms()
    job = Job(id=job_id_of(username, spec.name), username=username, name=spec.name,
              virtual_cluster=spec.virtual_cluster, created_ms=created, version=1,
              gpus=sum(r.gpu_number * r.task_number for r in spec.task_roles),
              user_id=user_id, priority=spec.priority_class, submission=uuid.uuid4().hex[:16])
    attempt = Attempt(index=0, created_ms=created)
    stored, claimed = store.insert_job(job, config, initial_tasks(spec), attempt,
                                       pass_request_ms=PASS_REQUEST_TTL_MS if request_pass else 0,
                                       expectations=expectations)
    return Queued(stored, claimed)


def _clear_placement(job: Job) -> None:
    """The job is back in its queue: nothing of its last placement stands."""
    job.waiting_reason, job.waiting, job.mode = "", "", ""
    job.preempted_by, job.preempt_deadline_ms = "", None


def _move_task(task: Task, target: TaskState) -> None:
    check_task_move(task.state, target)
    task.state = target


@dataclass(frozen=True)
class ExitReport:
    """What a task exit changed, so the caller knows what to tell whom."""

    task_state: TaskState
    job_state: JobState
    attempt_ended: bool
    retried: bool
    node: str | None
    # The task failed and its role's taskRetryCount covers it: it launches
    # again on its allocation (the caller sends the start)
    relaunched: bool = False


def _closed_attempt(store: Store, pipe: Pipe, job: Job, state: str, exit_code: int | None,
                    reason: str, platform: bool) -> Attempt:
    """The job's current attempt record, ended (the caller writes it)."""
    attempt = store.read_attempt(pipe, job.id, job.attempt) or Attempt(index=job.attempt)
    attempt.state, attempt.exit_code, attempt.reason = state, exit_code, reason
    attempt.completed_ms, attempt.platform_failure = now_ms(), platform
    return attempt


def record_task_exit(
    store: Store, job_id: str, attempt: int, role: str, index: int, *,
    exit_code: int, diagnostics: str = "", platform_failure: bool = False,
    task_retry: int | None = None, relaunch_deadline_ms: int | None = None,
    submission: str | None = None,
) -> ExitReport | None:
    """A task's container ended (or can never run): settle the task and job.

    `task_retry`: which of the task's containers ended (TaskRef.retry); a
    report of an earlier one is stale. None: whichever is current (a lost
    node). `submission`: the submission the container was made for; a
    container of an earlier submission of the name settles nothing. A
    failure its role's `taskRetryCount` still covers relaunches the task
    instead (`relaunched`): back to LAUNCHING on the same allocation,
    its `retries` one up, under a launch lease to `relaunch_deadline_ms`.

    Returns None when the task was already settled (a repeated report).
    """
    job_key, tasks_key = keys.job(job_id), keys.job_tasks(job_id, attempt)

    def decide(pipe: Pipe) -> ExitReport | None:
        job = store.read_job(pipe, job_id)
        tasks = store.read_tasks(pipe, job_id, attempt)
        task = tasks.get(task_key(role, index))
        if job is None or task is None or task.state.is_final:
            return None
        if task_retry is not None and task_retry != task.retries:
            return None  # an earlier container of a retried task: settled by its retry
        if submission and submission != job.submission:
            return None  # a container of an earlier submission of this name: not ours
        live = attempt == job.attempt and job.state in LIVE_JOB_STATES
        if live and exit_code != 0 and not platform_failure and not job.preempted_by \
                and not diagnostics.startswith(NON_RETRYABLE_PREFIX):
            spec = JobSpec.from_config(json.loads(pipe.get(keys.job_config(job_id))))
            if task.retries < spec.role(role).task_retry_count:
                return _relaunch(pipe, job, task, exit_code, diagnostics)
        if not live or (job.preempted_by and exit_code != 0):
            target = TaskState.STOPPED
        else:
            target = TaskState.SUCCEEDED if exit_code == 0 else TaskState.FAILED
        _move_task(task, target)
        task.exit_code, task.diagnostics = exit_code, diagnostics
        task.platform_failure, task.completed_ms = platform_failure, now_ms()

        previous, retried, ended = job.state, False, False
        new_tasks: list[Task] = []
        closed: Attempt | None = None
        if job.state == JobState.STOPPING and attempt == job.attempt:
            if all(t.state.is_final for t in tasks.values()):
                store.bump(job, JobState.STOPPED)
                job.completed_ms = now_ms()
                closed = _closed_attempt(store, pipe, job, JobState.STOPPED, None,
                                         stop_reason_of(job), False)
                ended = True
        elif live:
            spec = JobSpec.from_config(json.loads(pipe.get(keys.job_config(job_id))))
            outcome = evaluate_completion(spec, tasks.values())
            succeeded = outcome is not None and outcome.state == JobState.SUCCEEDED \
                and exit_code == 0
            if job.preempted_by and not succeeded:
                # Preempted: tasks ending on the signal are not the job's
                # failure (nor, stopped, its success). Once all have ended it
                # goes back to its queue at its old place, uncharged; a task
                # succeeding in the grace period that completes the job stands.
                outcome = None
                if all(t.state.is_final for t in tasks.values()):
                    ended = retried = True
                    closed = _closed_attempt(store, pipe, job, JobState.STOPPED, None,
                                             f"Preempted by {job.preempted_by}", False)
                    closed.preempted_by = job.preempted_by
                    store.bump(job, JobState.WAITING)
                    job.attempt += 1
                    job.preemptions += 1
                    _clear_placement(job)
                    new_tasks = [Task(role=t.role, index=t.index) for t in tasks.values()]
            if outcome is not None:
                ended = True
                closed = _closed_attempt(store, pipe, job, outcome.state, outcome.exit_code,
                                         outcome.reason, outcome.platform_failure)
                decision = decide_retry(outcome, retry_count=spec.retry_count,
                                        retries=job.retries,
                                        platform_retries=job.platform_retries)
                if decision.retry:
                    retried = True
                    store.bump(job, JobState.WAITING)
                    job.attempt += 1
                    if decision.counts_against_retry_count:
                        job.retries += 1
                    else:
                        job.platform_retries += 1
                    _clear_placement(job)
                    job.retry_after_ms = None
                    if decision.delay_seconds:
                        job.retry_after_ms = now_ms() + decision.delay_seconds * 1000
                        job.waiting_reason = (f"retry {job.retries} waits "
                                              f"{decision.delay_seconds} s (back-off)")
                    new_tasks = [Task(role=t.role, index=t.index) for t in tasks.values()]
                else:
                    store.bump(job, outcome.state)
                    job.completed_ms = now_ms()
                    job.exit_code = outcome.exit_code
                    job.exit_diagnostics = outcome.reason
        if job.state == previous and not ended:
            job.version += 1  # a task moved: anyone deciding on the old view must re-read
        # Tasks a partial placement (no gang allocation) had not placed yet
        # never run in an attempt that ended.
        unplaced = [t for t in tasks.values() if t.state == TaskState.WAITING] if ended else []
        for waiting in unplaced:
            _move_task(waiting, TaskState.STOPPED)
            waiting.completed_ms = now_ms()
        held = usage.held_allocation(pipe, job_id, attempt, task)

        pipe.multi()
        store.write_tasks(pipe, job_id, attempt, [task, *unplaced])
        usage.record_task_usage(pipe, held, task)  # placement to exit, recorded once
        if job.state.is_final:
            store.dequeue(pipe, job_id, job.virtual_cluster)
        pipe.zrem(keys.LAUNCHING, attempt_task_key(job_id, attempt, role, index))
        if closed is not None:
            store.write_attempt(pipe, job_id, closed)
        if retried:
            store.write_tasks(pipe, job_id, job.attempt, new_tasks)
            store.write_attempt(pipe, job_id, Attempt(index=job.attempt, created_ms=now_ms()))
            store.enqueue(pipe, job)
        store.write_job(pipe, job, previous)
        store.add_event(pipe, job_id, "task-exit", attempt=attempt, role=role, index=index,
                        state=task.state, exitCode=exit_code, diagnostics=diagnostics)
        telemetry.record(pipe, telemetry.TASK_EXITS, {
            "state": task.state, "class": "platform" if platform_failure else "user"})
        if ended:
            store.add_event(pipe, job_id, "attempt-end", attempt=attempt, state=job.state,
                            retried=retried)
        return ExitReport(task.state, job.state, ended, retried, task.node)

    def _relaunch(pipe: Pipe, job: Job, task: Task, exit_code: int,
                  diagnostics: str) -> ExitReport:
        """The failed task starts again by itself: a fresh container on its
        allocation (node, GPUs, ports kept); the job and attempt go on."""
        _move_task(task, TaskState.LAUNCHING)
        task.retries += 1
        task.container_id, task.started_ms, task.launched_ms = None, None, now_ms()
        job.version += 1  # a task moved: anyone deciding on the old view must re-read
        deadline = relaunch_deadline_ms or now_ms() + RELAUNCH_LEASE_MS
        pipe.multi()
        store.write_tasks(pipe, job_id, attempt, [task])
        pipe.zadd(keys.LAUNCHING, {attempt_task_key(job_id, attempt, role, index): deadline})
        store.write_job(pipe, job, job.state)
        store.add_event(pipe, job_id, "task-retry", attempt=attempt, role=role, index=index,
                        retries=task.retries, exitCode=exit_code, diagnostics=diagnostics,
                        node=task.node)
        telemetry.record(pipe, telemetry.TASK_EXITS, {"state": "RETRIED", "class": "user"})
        return ExitReport(task.state, job.state, False, False, task.node, relaunched=True)

    return store.transact(decide, job_key, tasks_key)  # both in one WATCH


def mark_task_running(
    store: Store, job_id: str, attempt: int, role: str, index: int, container_id: str,
    task_retry: int | None = None, submission: str | None = None,
) -> bool:
    """A task's container started. False: it belongs to no live task (stop
    it), or (`task_retry` given) it is not the task's current container, or
    (`submission` given) it was made for an earlier submission of the name."""
    job_key, tasks_key = keys.job(job_id), keys.job_tasks(job_id, attempt)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        tasks = store.read_tasks(pipe, job_id, attempt)
        task = tasks.get(task_key(role, index))
        if job is None or task is None or attempt != job.attempt:
            return False
        if task_retry is not None and task_retry != task.retries:
            return False
        if submission and submission != job.submission:  # "": a container before the label
            return False
        if job.state not in LIVE_JOB_STATES:
            return False
        if task.state == TaskState.RUNNING:
            return True
        if task.state != TaskState.LAUNCHING:
            return False
        _move_task(task, TaskState.RUNNING)
        task.container_id, task.started_ms = container_id, now_ms()
        previous = store.bump(job, JobState.RUNNING)
        attempt_record = None
        if previous == JobState.WAITING:
            attempt_record = store.read_attempt(pipe, job_id, attempt) or Attempt(index=attempt)
            attempt_record.started_ms = job.started_ms = task.started_ms
        pipe.multi()
        store.write_tasks(pipe, job_id, attempt, [task])
        pipe.zrem(keys.LAUNCHING, attempt_task_key(job_id, attempt, role, index))
        if attempt_record is not None:
            store.write_attempt(pipe, job_id, attempt_record)
            queued_ms = attempt_record.created_ms or job.created_ms
            telemetry.record(pipe, telemetry.SUBMIT_TO_RUNNING, {"vc": job.virtual_cluster},
                             max(0, (task.started_ms or queued_ms) - queued_ms) / 1000)
        store.write_job(pipe, job, previous)
        store.add_event(pipe, job_id, "task-running", attempt=attempt, role=role, index=index,
                        node=task.node)
        return True

    return store.transact(decide, job_key, tasks_key)  # both in one WATCH


STOPPED_BY_USER = "stopped by user"
# The diagnostics of a stop the platform made (shared/state/idle.py) start so.
STOPPED_BY_PLATFORM = "stopped by the platform: "


def stop_reason_of(job: Job) -> str:
    """Why a stopping job stops: the platform's reason it recorded, else the user's stop."""
    if job.exit_diagnostics.startswith(STOPPED_BY_PLATFORM):
        return job.exit_diagnostics
    return STOPPED_BY_USER


def request_stop(store: Store, job_id: str, reason: str = STOPPED_BY_USER) -> Job:
    """STOP: the job goes STOPPING (or straight to STOPPED if nothing runs).
    A `reason` starting STOPPED_BY_PLATFORM (idle GPUs: shared/state/idle.py)
    becomes its diagnostics and its stop event's; a user's stop leaves both
    as they were."""
    job_key = keys.job(job_id)

    def decide(pipe: Pipe) -> Job:
        job = store.require_job(pipe, job_id)
        if job.state not in LIVE_JOB_STATES:
            return job
        pipe.watch(keys.job_tasks(job_id, job.attempt))
        tasks = store.read_tasks(pipe, job_id, job.attempt)
        waiting = [t for t in tasks.values() if t.state == TaskState.WAITING]
        for task in waiting:
            _move_task(task, TaskState.STOPPED)
            task.completed_ms = now_ms()
        previous = store.bump(job, JobState.STOPPING)
        job.execution_type = "STOP"
        job.waiting_reason = ""
        platform = reason.startswith(STOPPED_BY_PLATFORM)
        if platform:
            job.exit_diagnostics = reason
        closed = None
        if all(t.state.is_final for t in tasks.values()):
            store.bump(job, JobState.STOPPED)
            job.completed_ms = now_ms()
            closed = _closed_attempt(store, pipe, job, JobState.STOPPED, None, reason, False)
        pipe.multi()
        store.write_tasks(pipe, job_id, job.attempt, waiting)
        if closed is not None:
            store.write_attempt(pipe, job_id, closed)
        store.dequeue(pipe, job_id, job.virtual_cluster)
        store.write_job(pipe, job, previous)
        store.add_event(pipe, job_id, "stop-requested", state=job.state,
                        **({"reason": reason} if platform else {}))
        return job

    return store.transact(decide, job_key)


def _bind_task(task: Task, placement: TaskPlacement, launched_ms: int) -> bool:
    """A waiting task takes its place (LAUNCHING on the placement's node, GPUs
    and ports); False, leaving it as it is, when it no longer waits. Both
    commit paths (one gang, a batch) bind a task by this one rule."""
    if task.state != TaskState.WAITING:
        return False
    _move_task(task, TaskState.LAUNCHING)
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
        nodes = sorted({p.node for p in placements})
        if any(pipe.hmget(keys.NODE_FLAGS, nodes)):  # an admin holds one now
            return False
        if gpuhealth.faulty_in(placements, gpufaults.read_faults(pipe)):  # failed meanwhile
            return False
        for name in nodes:
            raw = pipe.get(keys.node(name))
            node = Node.from_dict(json.loads(raw)) if raw else None
            held = store.get_allocations(pipe, name).values()
            if node is None or not placement_fits(node, held,
                                                  [p for p in placements if p.node == name]):
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
# json.dumps(..., separators=(",", ":")) without building an encoder per call
_compact_json = compact_json

# Binds a batch of gangs, each on its own terms, in one round trip. For each
# job in turn: the job record still says what the pass decided on (version,
# WAITING, attempt, queue_seq, VC: every write of a job's tasks bumps its
# version, so its tasks are as read, all WAITING) and it has as many tasks
# as were read (the gang whole), no admin holds any of its nodes, and every
# node still has room (the same rules as shared/domain/cluster.py `placement_fits`,
# against what the node holds now, this batch's earlier jobs included). A
# job passing all of them gets its writes, rendered by the caller; one that
# fails gets none. The reply holds 1 or 0 per job.
#
# KEYS: node flags, launching, queue, then the keys the jobs' entries name
# by position. A job entry: j, t, e, q (job, tasks, events, VC queue key
# positions), id, v, s, a, vc (version, queue_seq, attempt, VC as the pass
# read them), nt (how many tasks), new (task field -> position in ARGV of
# the record to write), f (job fields to write), ev (event fields, flat), l
# (launch entries, flat: member, deadline), n (per node: k, h = node and
# allocation key positions, name, g = GPUs, p = ports, c = CPUs, m = memory,
# w = allocation field and ARGV position of its record, flat).
# ARGV: the entries (JSON), the events' bound, then the records the entries
# point at: passed as they are, not as strings inside the JSON, they are
# neither escaped by the caller nor decoded by the script.
_COMMIT_PLACEMENTS = """
local flags_key, launching_key, queue_key, faults_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local jobs = cjson.decode(ARGV[1])
local nodes = {}

local function node_view(name, node_key, alloc_key)
  local view = nodes[name]
  if view then return view end
  view = {ok = false}
  nodes[name] = view
  local raw = redis.call('GET', node_key)
  if not raw then return view end
  local node = cjson.decode(raw)
  view.gpus, view.used_gpus, view.used_ports = {}, {}, {}
  for _, gpu in ipairs(node.gpus or {}) do
    view.gpus[type(gpu) == 'table' and gpu.index or gpu] = true
  end
  view.cpus, view.memory = node.cpus or 0, node.memory_mb or 0
  view.used_cpus, view.used_memory = 0, 0
  view.ok = true
  for _, value in ipairs(redis.call('HVALS', alloc_key)) do
    local held = cjson.decode(value)
    for _, g in ipairs(held.gpus) do
      if view.used_gpus[g] or not view.gpus[g] then view.ok = false end
      view.used_gpus[g] = true
    end
    for _, p in ipairs(held.ports) do
      if view.used_ports[p] then view.ok = false end
      view.used_ports[p] = true
    end
    view.used_cpus = view.used_cpus + held.cpus
    view.used_memory = view.used_memory + held.memory_mb
  end
  return view
end

local function fits(view, part)
  if not view.ok then return false end
  local gpus, ports = {}, {}
  for _, g in ipairs(part.g) do
    if gpus[g] or view.used_gpus[g] or not view.gpus[g] then return false end
    -- marked unhealthy since the pass read the faults (shared/domain/gpuhealth.py)
    if redis.call('HEXISTS', faults_key, part.name .. ':' .. g) == 1 then return false end
    gpus[g] = true
  end
  for _, p in ipairs(part.p) do
    if ports[p] or view.used_ports[p] then return false end
    ports[p] = true
  end
  return view.used_cpus + part.c <= view.cpus and view.used_memory + part.m <= view.memory
end

local function still_decidable(job)
  local key = KEYS[job.j]
  local now = redis.call('HMGET', key, 'version', 'state', 'attempt', 'queue_seq',
                        'virtual_cluster')
  if now[1] ~= job.v or now[2] ~= 'WAITING' or now[3] ~= job.a or now[4] ~= job.s
      or now[5] ~= job.vc then
    return false
  end
  if redis.call('HLEN', KEYS[job.t]) ~= job.nt then return false end
  for _, part in ipairs(job.n) do
    local flag = redis.call('HGET', flags_key, part.name)
    if flag and flag ~= '' then return false end
    if not fits(node_view(part.name, KEYS[part.k], KEYS[part.h]), part) then return false end
  end
  return true
end

local function bind(job)
  for _, part in ipairs(job.n) do
    local view = nodes[part.name]
    for _, g in ipairs(part.g) do view.used_gpus[g] = true end
    for _, p in ipairs(part.p) do view.used_ports[p] = true end
    view.used_cpus = view.used_cpus + part.c
    view.used_memory = view.used_memory + part.m
    for i = 1, #part.w, 2 do
      redis.call('HSET', KEYS[part.h], part.w[i], ARGV[part.w[i + 1]])
    end
  end
  for i = 1, #job.l, 2 do
    redis.call('ZADD', launching_key, job.l[i + 1], job.l[i])
  end
  for field, at in pairs(job.new) do  -- one by one: a gang may be too big to unpack
    redis.call('HSET', KEYS[job.t], field, ARGV[at])
  end
  redis.call('ZREM', queue_key, job.id)
  redis.call('ZREM', KEYS[job.q], job.id)
  redis.call('HSET', KEYS[job.j], unpack(job.f))
  redis.call('XADD', KEYS[job.e], 'MAXLEN', '~', ARGV[2], '*', unpack(job.ev))
end

local bound = {}
for i, job in ipairs(jobs) do
  if still_decidable(job) then
    bind(job)
    bound[i] = 1
  else
    bound[i] = 0
  end
end
return bound
"""


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
                     launch_deadline_ms: int, script_keys: _ScriptKeys,
                     parsed: dict[str, Task], records: list[str]) -> dict[str, Any] | None:
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
    new: dict[str, int] = {}
    for p in placements:
        task = tasks[task_key(p.role, p.index)]
        if not _bind_task(task, p, launched):
            return None
        new[task.key] = _argv_position(records, _record_json(task))
    job_id, attempt, vc = commit.job_id, commit.attempt, commit.vc
    parts: dict[str, dict[str, Any]] = {}
    launching: list[str] = []
    deadline = str(launch_deadline_ms)
    placed_tasks = []
    for p in placements:
        ports = p.all_ports
        alloc = Allocation(job_id=job_id, attempt=attempt, role=p.role, index=p.index,
                           node=p.node, gpus=p.gpus, cpus=p.cpus, memory_mb=p.memory_mb,
                           ports=ports, vc=vc)
        part = parts.get(p.node)
        if part is None:
            part = parts[p.node] = {
                "name": p.node, "k": script_keys.at(keys.node(p.node)),
                "h": script_keys.at(keys.node_alloc(p.node)),
                "g": [], "p": [], "c": 0, "m": 0, "w": []}
        part["g"] += p.gpus
        part["p"] += ports
        part["c"] += p.cpus
        part["m"] += p.memory_mb
        member = alloc.key
        part["w"] += [member, _argv_position(records, _record_json(alloc))]
        launching += [member, deadline]
        placed_tasks.append({"role": p.role, "index": p.index, "node": p.node,
                             "gpus": list(p.gpus), "ports": list(ports)})
    event = event_fields("placed", attempt=attempt, nodes=sorted(parts), mode=commit.mode,
                         tasks=placed_tasks)
    return {
        "j": script_keys.at(keys.job(job_id)), "t": script_keys.at(keys.job_tasks(job_id, attempt)),
        "e": script_keys.at(keys.job_events(job_id)), "q": script_keys.at(keys.vc_queue(vc)),
        "id": job_id, "v": str(commit.version), "s": str(commit.queue_seq),
        "a": str(attempt), "vc": vc,
        "nt": len(raw_tasks), "new": new,
        "f": ["version", str(commit.version + 1), "waiting_reason", "", "waiting", "",
              "mode", commit.mode],
        "ev": [x for item in event.items() for x in item], "l": launching,
        "n": list(parts.values()),
    }


def _argv_position(records: list[str], record: str) -> int:
    """Pass `record` to the batch script after its first two arguments: its
    position in ARGV (1-based)."""
    records.append(record)
    return len(records) + 2


def _record_json(record: Task | Allocation) -> str:
    """`json.dumps(record.to_dict())`, without `dataclasses.asdict`'s deep copy
    (a third of a big batch's CPU): their fields are plain JSON values, so the
    text is the same (tests/unit/test_placement_batch.py holds it so)."""
    return _compact_json(vars(record))


def commit_placements(store: Store, commits: Sequence[PlacementCommit], *,
                      launch_deadline_ms: int) -> list[bool]:
    """Bind many gangs at once, each as `commit_placement` binds one: True for
    each one bound, False for each the world moved away from (the next pass
    decides it again). Two round trips per MAX_BATCH_TASKS tasks: the jobs'
    records and tasks in one pipeline, then one script that re-checks them,
    and the nodes, and applies each gang's writes or none of them."""
    bound: list[bool] = []
    batch: list[PlacementCommit] = []
    size = 0
    for commit in commits:
        if batch and size + len(commit.placements) > MAX_BATCH_TASKS:
            bound += _commit_batch(store, batch, launch_deadline_ms)
            batch, size = [], 0
        batch.append(commit)
        size += len(commit.placements)
    if batch:
        bound += _commit_batch(store, batch, launch_deadline_ms)
    return bound


def _commit_batch(store: Store, batch: Sequence[PlacementCommit],
                  launch_deadline_ms: int) -> list[bool]:
    read = store.read_hashes([keys.job_tasks(c.job_id, c.attempt) for c in batch])
    script_keys = _ScriptKeys(keys.NODE_FLAGS, keys.LAUNCHING, keys.QUEUE, keys.GPU_FAULTS)
    entries: list[dict[str, Any]] = []
    positions: list[int | None] = []
    parsed: dict[str, Task] = {}
    records: list[str] = []  # the records the entries write, passed beside them
    for commit, raw_tasks in zip(batch, read, strict=True):
        entry = _placement_entry(commit, raw_tasks, launch_deadline_ms, script_keys, parsed,
                                 records)
        positions.append(len(entries) if entry is not None else None)
        if entry is not None:
            entries.append(entry)
    if not entries:
        return [False] * len(batch)
    reply = store.run_script(_COMMIT_PLACEMENTS, script_keys.names,
                             [_compact_json(entries), str(EVENTS_MAX_LEN), *records])
    return [position is not None and bool(reply[position]) for position in positions]


def claim_pass_request(store: Store) -> bool:
    """Should this caller send the scheduler a "schedule" message? Only when
    none is on its way: a burst of submits then costs one message, not one each.

    The scheduler clears the flag (`take_pass_request`) before its pass reads
    the queue, so a job queued while the flag was set is seen by the pass the
    pending message starts. The flag expires, so a lost message delays jobs by
    at most PASS_REQUEST_TTL_MS (and the scheduler's periodic pass repairs even
    that). A submit claims it inside its create script (`queue_new_job`);
    this is the same claim for any other caller.
    """
    return bool(store.r.set(keys.PASS_REQUESTED, "1", nx=True, px=PASS_REQUEST_TTL_MS))


def take_pass_request(pipe: Pipe) -> None:
    """A pass is about to read the queue: the next submit must ask again."""
    pipe.delete(keys.PASS_REQUESTED)


def set_waiting(store: Store, job_id: str, reason: str, explanation: str = "", *,
                version: int | None = None) -> bool:
    """Why a job waits, as a pass saw it (at `version`, when given): the
    sentence (`waiting_reason`) and the explanation as data (`waiting`, JSON).

    Not a state change (the version stays), but still compare-and-set: a
    plain write after the job was stopped and deleted would bring back a
    record holding nothing but a reason (every later read of it a 500), and
    a reason worked out for an older version would describe a job that moved
    on (placed, retried). False when nothing was written.
    """
    key = keys.job(job_id)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        if job is None or job.state != JobState.WAITING or (
                job.waiting_reason == reason and job.waiting == explanation):
            return False
        if version is not None and job.version != version:
            return False
        pipe.multi()
        pipe.hset(key, mapping={"waiting_reason": reason, "waiting": explanation})
        return True

    return store.transact(decide, key)


# Each KEYS[i] a job record; ARGV[i] its [reason, explanation, version] (JSON)
_SET_WAITING = """
local written = 0
for i, key in ipairs(KEYS) do
  local want = cjson.decode(ARGV[i])
  local now = redis.call('HMGET', key, 'state', 'version', 'waiting_reason', 'waiting')
  if now[1] == 'WAITING' and now[2] == want[3]
      and ((now[3] or '') ~= want[1] or (now[4] or '') ~= want[2]) then
    redis.call('HSET', key, 'waiting_reason', want[1], 'waiting', want[2])
    written = written + 1
  end
end
return written
"""
SET_WAITING_BATCH = 1000


def set_waiting_many(store: Store, reasons: Sequence[tuple[str, str, str, int]]) -> int:
    """`set_waiting` for many jobs, each (job id, reason, explanation, version)
    on the same terms (still WAITING at that version), one round trip per
    SET_WAITING_BATCH jobs; how many were written."""
    written = 0
    for start in range(0, len(reasons), SET_WAITING_BATCH):
        batch = reasons[start:start + SET_WAITING_BATCH]
        written += int(store.run_script(
            _SET_WAITING, [keys.job(job_id) for job_id, *_ in batch],
            [json.dumps([reason, explanation, str(version)])
             for _, reason, explanation, version in batch]))
    return written


def mark_preempted(store: Store, job_id: str, *, attempt: int, by: str,
                   deadline_ms: int) -> Job | None:
    """Preempt the job's attempt to make room for `by`: its tasks are told,
    then stopped at `deadline_ms`. The job (its attempt still placed and not
    already being preempted or stopped), else None: the caller signals only
    what this marked, so a repeated decision signals no one twice.
    """
    key = keys.job(job_id)

    def decide(pipe: Pipe) -> Job | None:
        job = store.read_job(pipe, job_id)
        if job is None or job.attempt != attempt or job.state not in LIVE_JOB_STATES \
                or job.preempted_by or pipe.zscore(keys.QUEUE, job_id) is not None:
            return None
        job.preempted_by, job.preempt_deadline_ms = by, deadline_ms
        job.version += 1  # whoever decided on the old view must look again
        pipe.multi()
        store.write_job(pipe, job, job.state)
        store.add_event(pipe, job_id, "preempted", attempt=attempt, by=by,
                        deadline=deadline_ms)
        return job

    return store.transact(decide, key)


def set_mode(store: Store, job_id: str, *, attempt: int, mode: str) -> bool:
    """A placed job now runs on its VC's guarantee or on borrowed GPUs (the
    policy promotes and demotes as other work comes and goes)."""
    key = keys.job(job_id)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        if job is None or job.attempt != attempt or job.state not in LIVE_JOB_STATES \
                or not job.mode or job.mode == mode:
            return False
        pipe.multi()
        pipe.hset(key, "mode", mode)
        store.add_event(pipe, job_id, "mode", attempt=attempt, mode=mode)
        return True

    return store.transact(decide, key)


STALE_BATCH = 500


def drop_stale_from_queue(store: Store, job_ids: Sequence[str]) -> list[str]:
    """Take from the queue the jobs that no longer wait there; the ones dropped.

    A pass reads the queue and the records without a lock, so a job it saw
    running (or gone) may be queued again by now: a retry re-queues it, a
    name freed by a delete is submitted again. Each entry is removed only if
    its record, read under WATCH, still says it has no business there
    (missing, not WAITING nor RUNNING with tasks still to place, or without
    a config); a re-queue racing this
    makes it re-read. Batches keep each transaction's WATCH list bounded.
    """
    dropped: list[str] = []
    for start in range(0, len(job_ids), STALE_BATCH):
        batch = job_ids[start:start + STALE_BATCH]

        def decide(pipe: Pipe, batch: Sequence[str] = batch) -> list[str]:
            stale: dict[str, str | None] = {}
            for job_id in batch:
                job = store.read_job(pipe, job_id)
                if job is None or (job.state != JobState.WAITING and not _placing(
                        store, pipe, job)) or not pipe.exists(keys.job_config(job_id)):
                    stale[job_id] = job.virtual_cluster if job is not None else None
            if stale:
                pipe.multi()
                for job_id, vc in stale.items():
                    store.dequeue(pipe, job_id, vc)
            return list(stale)

        dropped += store.transact(decide, *(keys.job(job_id) for job_id in batch))
    return dropped


def _placing(store: Store, pipe: Pipe, job: Job) -> bool:
    """A RUNNING job still being placed (no gang allocation): some task of
    its attempt waits for a place. Its tasks are watched from here on."""
    if job.state != JobState.RUNNING:
        return False
    pipe.watch(keys.job_tasks(job.id, job.attempt))
    return any(t.state == TaskState.WAITING
               for t in store.read_tasks(pipe, job.id, job.attempt).values())


def renew_stale_launch(store: Store, member: str, deadline_ms: int) -> Task | None:
    """A launch lease expired: its task if it still launches (the lease is
    renewed, the caller sends the start again), else None (the lease is gone).

    Conditional on the task's record: every write of the lease (placement,
    start, exit) also writes the task, so a task that started meanwhile
    never gets its lease back, and a lease a re-used job id was just given
    is never taken away.
    """
    job_id, attempt, role, index = parse_attempt_task_key(member)
    tasks_key = keys.job_tasks(job_id, attempt)

    def decide(pipe: Pipe) -> Task | None:
        task = store.read_tasks(pipe, job_id, attempt).get(task_key(role, index))
        launching = task is not None and task.state == TaskState.LAUNCHING and bool(task.node)
        pipe.multi()
        if launching:
            pipe.zadd(keys.LAUNCHING, {member: deadline_ms})
        else:
            pipe.zrem(keys.LAUNCHING, member)
        return task if launching else None

    return store.transact(decide, tasks_key)


def delete_job(store: Store, job_id: str) -> bool:
    """Forget a finished job and everything it kept, so its name is free again."""
    job_key = keys.job(job_id)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        if job is None or not job.state.is_final:
            return False
        doomed = retention.job_keys(store, pipe, job)  # its archive's keys too, once compacted
        pipe.multi()
        retention.forget_job(store, pipe, job, doomed)
        return True

    return store.transact(decide, job_key)
